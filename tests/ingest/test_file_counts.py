"""Per-file counts: every `ingest_files` row keeps `read == accepted + quarantined + duplicates` for
its own file, not only the batch total. The quarantine path has its own dedup (a bad line already
quarantined is a duplicate), so a re-ingested file with bad lines must count those duplicates in
its own row too; and the file rows of a batch add up to its `ingest_batches` row."""
import json
from pathlib import Path

import pytest

from ratchet import samples
from ratchet.ingest import ingest

pytestmark = pytest.mark.badinput

COLS = '"read", accepted, quarantined, duplicates'


def _good(tid: str) -> bytes:
    return json.dumps({"trajectory_id": tid, "task_id": "t", "messages": [{"role": "user", "content": tid}]}).encode()


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _file_rows(wh, batch_id):
    with wh.connect() as con:
        rows = con.execute(f"SELECT source_file, status, {COLS} FROM ingest_files WHERE batch_id = ? ORDER BY 1",
                           [batch_id]).fetchall()
        batch = con.execute(f"SELECT {COLS} FROM ingest_batches WHERE batch_id = ?", [batch_id]).fetchone()
    return {Path(f).name: (status, (r, a, q, d)) for f, status, r, a, q, d in rows}, batch


def _assert_each_row_balances(rows, batch):
    for name, (_status, (r, a, q, d)) in rows.items():
        assert r == a + q + d, f"{name}: read {r} != accepted {a} + quarantined {q} + duplicates {d}"
    assert tuple(map(sum, zip(*(c for _s, c in rows.values())))) == batch


@pytest.fixture
def landing(tmp_path):
    """mixed.jsonl: good and bad lines; twice.jsonl: one bad line written twice (two lines, so two
    quarantine rows: a row is a line of a file); good.jsonl: good lines only."""
    d = tmp_path / "in"
    d.mkdir()
    bad = samples.bad_lines()
    _write(d / "mixed.jsonl", [_good("m-1"), *bad[:4], _good("m-2"), *bad[4:]])
    _write(d / "twice.jsonl", [bad[0], _good("t-1"), bad[0], _good("t-2")])
    _write(d / "good.jsonl", [_good("g-1"), _good("g-2"), _good("m-1")])   # m-1: a copy from mixed.jsonl
    return d, len(bad)


def test_each_file_row_balances_on_first_ingest(wh, landing):
    d, n_bad = landing
    s = ingest([d], wh)
    rows, batch = _file_rows(wh, s.batch_id)
    _assert_each_row_balances(rows, batch)
    # good.jsonl is read before mixed.jsonl (name order), so mixed.jsonl's m-1 is the copy
    assert rows["good.jsonl"] == ("read", (3, 3, 0, 0))
    assert rows["mixed.jsonl"] == ("read", (2 + n_bad, 1, n_bad, 1))
    assert rows["twice.jsonl"] == ("read", (4, 2, 2, 0))
    assert (s.read, s.accepted, s.quarantined, s.duplicates) == batch == (9 + n_bad, 6, n_bad + 2, 1)


def test_a_reingested_file_counts_its_bad_lines_as_its_own_duplicates(wh, landing):
    d, n_bad = landing
    ingest([d], wh)
    _write(d / "new.jsonl", [_good("n-1"), b"[1, 2]"])
    s = ingest([d], wh)
    rows, batch = _file_rows(wh, s.batch_id)
    _assert_each_row_balances(rows, batch)
    # everything already ingested is a duplicate of itself, bad lines included, in its own row
    assert rows["mixed.jsonl"] == ("read", (2 + n_bad, 0, 0, 2 + n_bad))
    assert rows["twice.jsonl"] == ("read", (4, 0, 0, 4))
    assert rows["good.jsonl"] == ("read", (3, 0, 0, 3))
    assert rows["new.jsonl"] == ("read", (2, 1, 1, 0))
    assert (s.read, s.accepted, s.quarantined, s.duplicates) == batch == (11 + n_bad, 1, 1, 9 + n_bad)


def test_every_file_row_of_every_batch_balances(wh, landing):
    d, _ = landing
    ingest([d], wh)
    ingest([d / "twice.jsonl"], wh)           # one file alone, again
    ingest([d], wh)
    with wh.connect() as con:
        rows = con.execute(f"SELECT source_file, {COLS} FROM ingest_files").fetchall()
        batches = con.execute(f"SELECT batch_id, {COLS} FROM ingest_batches").fetchall()
        sums = con.execute(f'SELECT batch_id, sum("read"), sum(accepted), sum(quarantined), sum(duplicates) '
                           f"FROM ingest_files GROUP BY 1").fetchall()
    assert len(batches) == 3
    bad = [r for r in rows if r[1] != r[2] + r[3] + r[4]]
    assert not bad, f"ingest_files rows whose counts do not add up: {bad}"
    assert sorted(tuple(r) for r in sums) == sorted(tuple(b) for b in batches)
