"""Compressed input stays within bounded memory, and a broken zstd file keeps what it can.

The bombs are ingested in a child process whose peak RSS (VmHWM from /proc/self/status, read
before and after the bomb) must stay under BUDGET above the child's own baseline, so a
regression fails here instead of swapping the machine. The inputs are built by streaming
compressor chunks to disk, never held in memory. Sizes are the real ones (1 GiB decompressed
from about 1 MB of gzip): each test runs in well under a minute on a loaded 2-core machine."""
import gzip
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import zstandard

from ratchet.ingest import ingest

pytestmark = pytest.mark.badinput

BUDGET = 512 << 20
GIB = 1 << 30
MIB = 1 << 20

CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    from ratchet.home import get_home
    from ratchet.ingest import ingest
    from ratchet.warehouse import Warehouse

    def hwm():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

    root, bomb = Path(sys.argv[1]), Path(sys.argv[2])
    wh = Warehouse(get_home(root / "rh").ensure().warehouse)
    wh.ensure_schema()
    warm = root / "warm"
    warm.mkdir()
    # the same code paths once on a small file, so the baseline holds the imports and pools
    (warm / "w.jsonl.gz").write_bytes(__import__("gzip").compress(
        b'{"trajectory_id": "warm", "task_id": "t", "messages": [{"role": "user", "content": "hi"}]}\\n'))
    ingest([warm], wh)
    base = hwm()
    s = ingest([bomb], wh)
    peak = hwm()
    with wh.connect() as con:
        q = con.execute("SELECT reason_code, source_line, raw_bytes, raw_sha256, octet_length(raw) FROM quarantine "
                        "WHERE source_file NOT LIKE '%w.jsonl.gz' ORDER BY source_line").fetchall()
        t = con.execute("SELECT trajectory_id, source_line FROM trajectories "
                        "WHERE source_file NOT LIKE '%w.jsonl.gz'").fetchall()
    print(json.dumps({"base": base, "peak": peak, "accepted": s.accepted, "quarantine": q, "records": t}))
""")

GOOD = {"task_id": "t", "messages": [{"role": "user", "content": "hi"}]}


def _good(i: int) -> bytes:
    return json.dumps({**GOOD, "trajectory_id": f"g{i}"}).encode() + b"\n"


def _gzip_stream(path: Path, pieces) -> None:
    """gzip of the concatenated pieces, written as it is compressed (never held whole)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        for p in pieces:
            f.write(c.compress(p))
        f.write(c.flush())


def _repeat(byte: bytes, total: int, h=None):
    block = byte * MIB
    for _ in range(total // MIB):
        if h is not None:
            h.update(block)
        yield block


def _ingest_in_child(tmp_path: Path, bomb_dir: Path) -> dict:
    env = {**os.environ, "RATCHET_HOME": str(tmp_path / "rh"), "DAGSTER_HOME": str(tmp_path / "rh" / "dagster")}
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(bomb_dir)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    grew = out["peak"] - out["base"]
    assert grew < BUDGET, f"peak RSS grew {grew / MIB:.0f} MiB over the baseline (budget {BUDGET / MIB:.0f} MiB)"
    return out


@pytest.mark.timeout(180)
def test_gzip_of_a_one_gib_line_is_quarantined_from_its_first_bytes_in_bounded_memory(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    h = hashlib.sha256()
    _gzip_stream(d / "line.jsonl.gz", [_good(1), *_repeat(b"x", GIB, h), b"\n", _good(3)])
    assert (d / "line.jsonl.gz").stat().st_size < 2 * MIB
    out = _ingest_in_child(tmp_path, d)
    assert sorted(out["records"]) == [["g1", 1], ["g3", 3]]
    [(code, line, raw_bytes, sha, kept)] = out["quarantine"]
    assert (code, line, raw_bytes, sha, kept) == ("record_too_large", 2, GIB, h.hexdigest(), MIB)


@pytest.mark.timeout(180)
def test_gzip_newline_bomb_is_counted_not_split(tmp_path):
    """1 GiB of newlines (1 MB of gzip), then a record: its line number is still exact."""
    d = tmp_path / "in"
    d.mkdir()
    _gzip_stream(d / "nl.jsonl.gz", [_good(1), *_repeat(b"\n", GIB), b" \r\n\t\n", _good(2)])
    out = _ingest_in_child(tmp_path, d)
    assert sorted(out["records"]) == [["g1", 1], ["g2", 1 + GIB + 2 + 1]]
    assert out["quarantine"] == []


def _zstd_body(n: int, first: int = 0) -> bytes:
    return b"".join(_good(i) for i in range(first, first + n))


def _rows(wh, name):
    with wh.connect() as con:
        q = con.execute("SELECT reason_code, source_line, reason FROM quarantine WHERE source_file LIKE ? "
                        "ORDER BY source_line", [f"%{name}"]).fetchall()
        t = con.execute("SELECT count(*), max(source_line) FROM trajectories WHERE source_file LIKE ?",
                        [f"%{name}"]).fetchone()
    return q, t


@pytest.mark.parametrize("cut", ["header", "first_block", "half", "checksum"])
def test_truncated_zstd_keeps_every_line_before_the_cut_and_says_where(tmp_path, wh, cut):
    body = _zstd_body(40_000)  # ~3.7 MB: several 128 KiB blocks, so a cut can fall between them
    c = zstandard.ZstdCompressor(write_checksum=True).compress(body)
    data = {"header": c[:5], "first_block": c[:200], "half": c[: len(c) // 2], "checksum": c[:-2]}[cut]
    d = tmp_path / "in"
    d.mkdir()
    (d / "cut.jsonl.zst").write_bytes(data)
    ingest([d], wh)
    q, (n, last) = _rows(wh, "cut.jsonl.zst")
    corrupt = [r for r in q if r[0] == "corrupt_compressed"]
    assert len(corrupt) == 1 and "truncated" in corrupt[0][2], q
    assert not [r for r in q if r[0] == "empty_file"], q
    if cut == "checksum":
        assert n == 40_000 and corrupt[0][1] == 40_001
    elif cut == "half":
        assert n > 10_000 and n == last and corrupt[0][1] > last  # every line before the cut, in order


def test_zstd_good_frame_then_junk_keeps_the_frame_and_reports_the_junk(tmp_path, wh):
    c = zstandard.ZstdCompressor().compress(_zstd_body(1_000))
    d = tmp_path / "in"
    d.mkdir()
    (d / "junk.jsonl.zst").write_bytes(c + b"this is not a zstd frame" * 100)
    two = [zstandard.ZstdCompressor().compress(_zstd_body(1_000, k)) for k in (10_000, 20_000)]
    (d / "pad.jsonl.zst").write_bytes(b"".join(two) + b"\0" * 64)  # two frames, zero padding: fine, as with gzip
    ingest([d], wh)
    q, (n, _) = _rows(wh, "junk.jsonl.zst")
    assert n == 1_000
    assert [(r[0], r[1]) for r in q] == [("corrupt_compressed", 1_001)] and "junk after zstd frame 1" in q[0][2]
    q, (n, _) = _rows(wh, "pad.jsonl.zst")
    assert q == [] and n == 2_000


@pytest.mark.timeout(120)
def test_large_truncated_zstd_gets_its_corrupt_compressed_row(tmp_path, wh):
    """A cut far past the first read (several MiB decoded) is still reported, once."""
    c = zstandard.ZstdCompressor(level=1).compress(_zstd_body(150_000))
    d = tmp_path / "in"
    d.mkdir()
    (d / "big.jsonl.zst").write_bytes(c[: len(c) * 3 // 4])
    ingest([d], wh)
    q, (n, last) = _rows(wh, "big.jsonl.zst")
    corrupt = [r for r in q if r[0] == "corrupt_compressed"]
    assert len(corrupt) == 1 and n == last and n > 100_000, (q, n)


def test_gzip_still_bounded_and_exact_across_member_and_read_boundaries(tmp_path, wh):
    """Multi-member gzip whose members each inflate past one read: nothing lost or doubled."""
    d = tmp_path / "in"
    d.mkdir()
    body = _zstd_body(30_000)
    members = [gzip.compress(body[i: i + 3 * MIB], compresslevel=1) for i in range(0, len(body), 3 * MIB)]
    (d / "m.jsonl.gz").write_bytes(b"".join(members))
    ingest([d], wh)
    q, (n, last) = _rows(wh, "m.jsonl.gz")
    assert q == [] and n == last == 30_000
