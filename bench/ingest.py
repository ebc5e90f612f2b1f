"""Ingest throughput: N synthetic multi-turn trajectories (JSONL) into the warehouse, validation on.

Baselines (named): `pandas.read_json(lines=True)` + row-by-row INSERTs into DuckDB, the way
`DataFrame.to_sql` writes (executemany of one INSERT per row), with no validation at all, timed on
a subsample (it is slow); and DuckDB's own `read_json` into a table (no validation, no dedup, all
cores) on the whole file: what a user would try first.

Also measured: peak RSS of an ingest of a file holding one 300 MB line (the record
limit is 32 MiB; target <= 2x the limit above the process's own footprint); peak RSS of an
ingest of a gzip bomb, about 1 MB of gzip holding one 1 GiB line between two good ones (target:
<= 512 MB, the whole process); and the query and
one-file ingest time after M one-record files were ingested in B batches (auto-compaction on),
against a fresh warehouse holding the same rows from one file (target: within 2x).

    .venv/bin/python bench/ingest.py [--n 100000] [--baseline-n 5000] [--workers 0] [--repeat 3]
        [--long-line-mb 300] [--gzip-bomb-gib 1] [--manyfiles 20000] [--manyfiles-batches 200]
        (0 skips a part)
"""
from __future__ import annotations

import argparse
import json
import shutil
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def baseline(path: Path, n: int, db: Path) -> float:
    import duckdb
    import orjson
    import pandas as pd

    t0 = time.perf_counter()
    df = pd.read_json(path, lines=True, nrows=n)
    for col in df.columns:  # nested objects become JSON text, as to_sql would need
        if df[col].map(lambda v: isinstance(v, (dict, list))).any():
            df[col] = df[col].map(lambda v: orjson.dumps(v).decode() if isinstance(v, (dict, list)) else v)
    df = df.astype(object).where(df.notna(), None)
    con = duckdb.connect(str(db))
    cols = ", ".join(f'"{c}" VARCHAR' for c in df.columns)
    con.execute(f"CREATE TABLE t ({cols})")
    rows = [tuple(None if v is None else str(v) for v in r) for r in df.itertuples(index=False)]
    con.executemany(f"INSERT INTO t VALUES ({', '.join('?' for _ in df.columns)})", rows)
    con.close()
    return n / (time.perf_counter() - t0)


def duckdb_read_json(path: Path, n: int, db: Path) -> float:
    import duckdb

    con = duckdb.connect(str(db))
    t0 = time.perf_counter()
    con.execute(f"CREATE TABLE t AS SELECT * FROM read_json('{path}', format = 'newline_delimited')")
    rows, = con.execute("SELECT count(*) FROM t").fetchone()
    dt = time.perf_counter() - t0
    con.close()
    assert rows == n, rows
    return n / dt


_RSS_CHILD = r"""
import json, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[4])
def hwm_kb():  # this process's own peak (ru_maxrss would carry the forking parent's peak across exec)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
from ratchet.ingest import IngestOptions, ingest
from ratchet.warehouse import Warehouse
wh = Warehouse(Path(sys.argv[1]) / "warehouse.duckdb")
ingest([sys.argv[3]], wh, IngestOptions(origin="bench"))       # imports and schema first
base = hwm_kb()
s = ingest([sys.argv[2]], wh, IngestOptions(origin="bench"))
peak = hwm_kb()
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"base_kb": base, "peak_kb": peak, "children_kb": kids, "summary": s.as_dict()}))
"""


def long_line_rss(tmp: Path, mb: int) -> dict:
    """Peak RSS (parent and workers) of ingesting a file with one `mb` MB line between two good ones."""
    import subprocess

    from ratchet.synth import write_jsonl

    write_jsonl(tmp / "tiny.jsonl", 1, seed=9)
    good = (tmp / "tiny.jsonl").read_bytes()
    f = tmp / "long-line.jsonl"
    with open(f, "wb") as fh:
        fh.write(good)
        fh.write(b'{"trajectory_id": "huge", "task_id": "t", "messages": [{"role": "user", "content": "')
        block = b"x" * (1 << 20)
        for _ in range(mb):
            fh.write(block)
        fh.write(b'"}]}\n')
        fh.write(good.replace(b"traj-0000000", b"traj-after"))
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(tmp / "rss-home"), str(f), str(tmp / "tiny.jsonl"),
                          str(Path(__file__).resolve().parent.parent)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    s = got["summary"]
    assert s["accepted"] == 1 and s["quarantine_reasons"] == {"record_too_large": 1} and s["duplicates"] == 1, s
    f.unlink()
    return {"peak_mb": got["peak_kb"] / 1024, "base_mb": got["base_kb"] / 1024, "workers_mb": got["children_kb"] / 1024}


def gzip_bomb_rss(tmp: Path, gib: int) -> dict:
    """Peak RSS of ingesting a gzip file of about `gib` MB that inflates to one `gib` GiB line
    between two good ones (written as it is compressed, never held)."""
    import subprocess
    import zlib

    from ratchet.synth import write_jsonl

    write_jsonl(tmp / "tiny.jsonl", 1, seed=9)
    good = (tmp / "tiny.jsonl").read_bytes()
    f = tmp / "bomb.jsonl.gz"
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"x" * (1 << 20)
    with open(f, "wb") as fh:
        fh.write(c.compress(good.replace(b"traj-0000000", b"traj-before")))
        fh.write(c.compress(b'{"trajectory_id": "bomb", "task_id": "t", "messages": [{"role": "user", "content": "'))
        for _ in range(gib << 10):
            fh.write(c.compress(block))
        fh.write(c.compress(b'"}]}\n' + good.replace(b"traj-0000000", b"traj-after")))
        fh.write(c.flush())
    size = f.stat().st_size
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(tmp / "bomb-home"), str(f), str(tmp / "tiny.jsonl"),
                          str(Path(__file__).resolve().parent.parent)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    s = got["summary"]
    assert s["accepted"] == 2 and s["quarantine_reasons"] == {"record_too_large": 1}, s
    f.unlink()
    return {"peak_mb": got["peak_kb"] / 1024, "base_mb": got["base_kb"] / 1024, "file_mb": size / 1e6}


def _timed_query(wh) -> float:
    t0 = time.perf_counter()
    with wh.connect() as con:
        con.execute("SELECT count(*), count(DISTINCT task_id), sum(n_tool_calls) FROM trajectories").fetchall()
    return time.perf_counter() - t0


def many_files(tmp: Path, m: int, batches: int) -> dict:
    """Query and one-file ingest time after `m` one-record files ingested in `batches` batches,
    against a fresh warehouse holding the same rows from one file."""
    import orjson

    from ratchet.ingest import IngestOptions, ingest
    from ratchet.synth import trajectory
    from ratchet.warehouse import Warehouse
    import random

    rng = random.Random(5)
    recs = [orjson.dumps(trajectory(i, rng)) + b"\n" for i in range(m + 1)]
    folders = [tmp / "many" / f"b{b:04d}" for b in range(batches)]
    for d in folders:
        d.mkdir(parents=True)
    for i, r in enumerate(recs[:m]):
        (folders[i % batches] / f"{i:06d}.jsonl").write_bytes(r)
    (tmp / "one.jsonl").write_bytes(recs[m])
    (tmp / "all.jsonl").write_bytes(b"".join(recs[:m]))
    opts = IngestOptions(origin="bench", workers=1)

    fresh = Warehouse(tmp / "fresh" / "warehouse.duckdb")
    ingest([tmp / "all.jsonl"], fresh, opts)
    fresh_q = min(_timed_query(fresh) for _ in range(3))
    t0 = time.perf_counter()
    ingest([tmp / "one.jsonl"], fresh, opts)
    fresh_i = time.perf_counter() - t0

    wh = Warehouse(tmp / "manyfiles" / "warehouse.duckdb")
    t0 = time.perf_counter()
    compacted = 0
    for d in folders:
        compacted += ingest([d], wh, opts).compacted_parts
    load_s = time.perf_counter() - t0
    parts = len(wh.part_names())
    q = min(_timed_query(wh) for _ in range(3))
    t0 = time.perf_counter()
    s = ingest([tmp / "one.jsonl"], wh, opts)
    one = time.perf_counter() - t0
    assert s.accepted == 1
    with wh.connect() as con:
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == m + 1
    return {"files": m, "batches": batches, "load_s": load_s, "parts": parts, "merged_parts": compacted,
            "query_s": q, "ingest_one_s": one, "fresh_query_s": fresh_q, "fresh_ingest_one_s": fresh_i}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--baseline-n", type=int, default=5_000)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="timed ingests (fresh warehouse each); median reported")
    ap.add_argument("--long-line-mb", type=int, default=300, help="size of the one long line (0: skip)")
    ap.add_argument("--gzip-bomb-gib", type=int, default=1, help="GiB one gzip line inflates to (0: skip)")
    ap.add_argument("--manyfiles", type=int, default=20_000, help="one-record files for the lake test (0: skip)")
    ap.add_argument("--manyfiles-batches", type=int, default=200, help="ingests those files arrive in")
    args = ap.parse_args()

    from ratchet.ingest import IngestOptions, ingest
    from ratchet.synth import write_jsonl
    from ratchet.warehouse import Warehouse

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "trajectories.jsonl"
        t0 = time.perf_counter()
        write_jsonl(src, args.n, seed=0)
        os.sync()  # a landed file was written earlier: its write-back must not run during the timing
        size = src.stat().st_size
        print(f"generated {args.n} trajectories ({size / 2**20:.0f} MiB, {size / args.n / 1024:.1f} KiB each) "
              f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

        runs = []
        for r in range(args.repeat):  # each run into a fresh warehouse; the median is reported
            wh = Warehouse(tmp / f"home-{r}" / "warehouse.duckdb")
            t0 = time.perf_counter()
            s = ingest([src], wh, IngestOptions(workers=args.workers, origin="bench"))
            runs.append(args.n / (time.perf_counter() - t0))
            assert s.accepted == args.n and s.consistent and s.fast_path == args.n, s.as_dict()
            print(f"run {r + 1}/{args.repeat}: {runs[-1]:,.0f} trajectories/s", file=sys.stderr)
        ours = statistics.median(runs)
        t0 = time.perf_counter()
        again = ingest([src], wh, IngestOptions(workers=args.workers, origin="bench"))
        reingest_s = time.perf_counter() - t0
        assert again.duplicates == args.n and again.accepted == 0
        with wh.connect() as con:
            rows, = con.execute("SELECT count(*) FROM trajectories").fetchone()
        assert rows == args.n

        base = baseline(src, min(args.baseline_n, args.n), tmp / "baseline.duckdb")
        duck = duckdb_read_json(src, args.n, tmp / "duck.duckdb")
        (tmp / "duck.duckdb").unlink()
        src.unlink()
        for r in range(args.repeat):
            shutil.rmtree(tmp / f"home-{r}", ignore_errors=True)
        rss = long_line_rss(tmp, args.long_line_mb) if args.long_line_mb else None
        bomb = gzip_bomb_rss(tmp, args.gzip_bomb_gib) if args.gzip_bomb_gib else None
        many = many_files(tmp, args.manyfiles, max(1, min(args.manyfiles_batches, args.manyfiles))) if args.manyfiles else None

    print(f"{'path':<44}{'trajectories/s':>16}")
    print(f"{'ratchet ingest (validated, deduped, 2 cores)':<44}{ours:>16,.0f}  (median of {len(runs)}: "
          f"{min(runs):,.0f}-{max(runs):,.0f})")
    print(f"{'re-ingest of the same file (all duplicates)':<44}{args.n / reingest_s:>16,.0f}")
    print(f"{'pandas.read_json + row INSERTs (no checks)':<44}{base:>16,.0f}")
    print(f"{'duckdb read_json into a table (no checks)':<44}{duck:>16,.0f}")
    if rss:
        print(f"one {args.long_line_mb} MB line (limit 32 MiB): peak RSS {rss['peak_mb']:,.0f} MB "
              f"(process after warm-up {rss['base_mb']:,.0f} MB, +{rss['peak_mb'] - rss['base_mb']:,.0f} MB; "
              f"workers {rss['workers_mb']:,.0f} MB)")
    if bomb:
        print(f"gzip bomb ({bomb['file_mb']:.1f} MB inflating to a {args.gzip_bomb_gib} GiB line): peak RSS "
              f"{bomb['peak_mb']:,.0f} MB (target <= 512 MB; process after warm-up {bomb['base_mb']:,.0f} MB)")
    if many:
        print(f"{many['files']:,} one-record files in {many['batches']} ingests ({many['load_s']:.0f} s, "
              f"{many['merged_parts']} parts merged on the way, {many['parts']} left): query {many['query_s']:.3f} s "
              f"(fresh {many['fresh_query_s']:.3f} s), one-file ingest {many['ingest_one_s']:.2f} s "
              f"(fresh {many['fresh_ingest_one_s']:.2f} s)")
    print(json.dumps({"bench": "ingest", "n": args.n, "bytes": size, "cores": os.cpu_count(),
                      "ours_per_s": round(ours, 1), "ours_runs_per_s": [round(x, 1) for x in runs],
                      "ours_mib_per_s": round(size / 2**20 * ours / args.n, 1),
                      "reingest_per_s": round(args.n / reingest_s, 1),
                      "baseline": "pandas.read_json + DataFrame.to_sql-style row inserts",
                      "baseline_n": min(args.baseline_n, args.n), "baseline_per_s": round(base, 1),
                      "ratio": round(ours / base, 2),
                      "baseline2": "duckdb read_json into a table (no validation)",
                      "duckdb_read_json_per_s": round(duck, 1), "ratio_vs_duckdb_read_json": round(ours / duck, 2),
                      "long_line_mb": args.long_line_mb or None,
                      "peak_rss_mb_300mb_line": round(rss["peak_mb"], 1) if rss else None,
                      "rss_growth_mb_300mb_line": round(rss["peak_mb"] - rss["base_mb"], 1) if rss else None,
                      "workers_peak_rss_mb_300mb_line": round(rss["workers_mb"], 1) if rss else None,
                      "gzip_bomb_gib": args.gzip_bomb_gib or None,
                      "peak_rss_mb_gzip_bomb": round(bomb["peak_mb"], 1) if bomb else None,
                      "manyfiles": many["files"] if many else None,
                      "manyfiles_query_s": round(many["query_s"], 4) if many else None,
                      "manyfiles_fresh_query_s": round(many["fresh_query_s"], 4) if many else None,
                      "manyfiles_ingest_one_s": round(many["ingest_one_s"], 3) if many else None,
                      "manyfiles_fresh_ingest_one_s": round(many["fresh_ingest_one_s"], 3) if many else None,
                      "manyfiles_parts": many["parts"] if many else None,
                      "manyfiles_load_s": round(many["load_s"], 1) if many else None}))


if __name__ == "__main__":
    main()
