"""Ingest throughput: N synthetic multi-turn trajectories (JSONL) into the warehouse, validation on.

Baseline (named): `pandas.read_json(lines=True)` + row-by-row INSERTs into DuckDB, the way
`DataFrame.to_sql` writes (executemany of one INSERT per row), with no validation at all. It is
timed on a subsample (it is slow) and reported as a rate.

    .venv/bin/python bench/ingest.py [--n 100000] [--baseline-n 5000] [--workers 0] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--baseline-n", type=int, default=5_000)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="timed ingests (fresh warehouse each); median reported")
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

    print(f"{'path':<44}{'trajectories/s':>16}")
    print(f"{'ratchet ingest (validated, deduped, 2 cores)':<44}{ours:>16,.0f}  (median of {len(runs)}: "
          f"{min(runs):,.0f}-{max(runs):,.0f})")
    print(f"{'re-ingest of the same file (all duplicates)':<44}{args.n / reingest_s:>16,.0f}")
    print(f"{'pandas.read_json + row INSERTs (no checks)':<44}{base:>16,.0f}")
    print(json.dumps({"bench": "ingest", "n": args.n, "bytes": size, "cores": os.cpu_count(),
                      "ours_per_s": round(ours, 1), "ours_runs_per_s": [round(x, 1) for x in runs],
                      "ours_mib_per_s": round(size / 2**20 * ours / args.n, 1),
                      "reingest_per_s": round(args.n / reingest_s, 1),
                      "baseline": "pandas.read_json + DataFrame.to_sql-style row inserts",
                      "baseline_n": min(args.baseline_n, args.n), "baseline_per_s": round(base, 1),
                      "ratio": round(ours / base, 2)}))


if __name__ == "__main__":
    main()
