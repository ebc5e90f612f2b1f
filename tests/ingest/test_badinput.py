"""Bad input: every record read is accepted, quarantined with a reason and its raw payload, or
counted as a duplicate; nothing is lost and re-running changes nothing."""
import functools
import hashlib
import json
import os

import pytest

from ratchet import samples
from ratchet.ingest import IngestOptions, ingest

pytestmark = pytest.mark.badinput


def _quarantine(wh):
    with wh.connect() as con:
        return con.execute("SELECT source_line, reason_code, reason, raw FROM quarantine ORDER BY source_line").fetchall()


def test_each_malformed_line_is_quarantined_with_reason_and_payload(tmp_path, wh):
    lines = samples.bad_lines()
    good = json.dumps({"trajectory_id": "ok-1", "task_id": "t", "messages": [{"role": "user", "content": "hi"}]}).encode()
    f = tmp_path / "mixed.jsonl"
    f.write_bytes(b"\n".join([good, *lines]) + b"\n")
    s = ingest([f], wh)
    assert (s.read, s.accepted, s.quarantined, s.duplicates) == (1 + len(lines), 1, len(lines), 0)
    q = _quarantine(wh)
    codes = [r[1] for r in q]
    assert codes == ["truncated_json", "not_object", "invalid_utf8", "wrong_type", "missing_id",
                     "orphan_tool_result", "unknown_format", "nul_byte"]
    assert [r[0] for r in q] == list(range(2, 2 + len(lines)))          # the file's line numbers
    assert [bytes(r[3]) for r in q] == lines                              # raw payload byte-exact
    assert all(r[2] for r in q)                                           # a human-readable reason


def test_truncated_last_line_without_newline(tmp_path, wh):
    f = tmp_path / "cut.jsonl"
    f.write_bytes(b'{"trajectory_id": "a", "task_id": "t", "messages": [{"role": "user", "content": "x"}]}\n{"traj')
    s = ingest([f], wh)
    assert (s.accepted, s.quarantined) == (1, 1)
    assert _quarantine(wh)[0][1] == "truncated_json"


def test_empty_file_and_unknown_file_type(tmp_path, wh):
    d = tmp_path / "in"
    d.mkdir()
    (d / "empty.jsonl").write_bytes(b"")
    (d / "empty.json").write_bytes(b"  \n")
    (d / "notes.txt").write_text("not a log")
    s = ingest([d], wh)
    assert (s.read, s.quarantined) == (3, 3)
    assert sorted(r[1] for r in _quarantine(wh)) == ["empty_file", "empty_file", "unsupported_file_type"]


def test_unknown_document_format(tmp_path, wh):
    (tmp_path / "weird.json").write_text(json.dumps({"events": [1, 2, 3]}))
    s = ingest([tmp_path / "weird.json"], wh)
    assert s.quarantined == 1 and _quarantine(wh)[0][1] == "unknown_format"
    assert "events" in _quarantine(wh)[0][2]  # the reason names what it saw


def test_huge_single_record(tmp_path, wh):
    blob = "x" * (50 * 2**20)
    rec = {"trajectory_id": "big", "task_id": "t", "messages": [{"role": "user", "content": "go"},
           {"role": "assistant", "content": blob}]}
    f = tmp_path / "big.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    s = ingest([f], wh)
    assert (s.read, s.quarantined) == (1, 1)
    (line, code, reason, raw), = _quarantine(wh)
    assert code == "record_too_large" and "50.0 MiB" in reason
    # bounded memory: the first bytes are kept, with the true length and sha256 of the whole line
    # (the line itself stays in the file at source_file / byte_offset)
    body = f.read_bytes()[:-1]
    with wh.connect() as con:
        size, sha, offset = con.execute("SELECT raw_bytes, raw_sha256, byte_offset FROM quarantine").fetchall()[0]
    assert bytes(raw) == body[: 1 << 20] and (size, sha, offset) == (len(body), hashlib.sha256(body).hexdigest(), 0)
    s2 = ingest([f], wh, IngestOptions(max_record_mb=64))  # the limit is a setting, not a wall
    assert s2.accepted == 1


def test_duplicate_ids_with_different_content_are_kept_and_flagged(tmp_path, wh):
    base = {"trajectory_id": "dup", "task_id": "t", "messages": [{"role": "user", "content": "v1"}]}
    (tmp_path / "a.jsonl").write_text(json.dumps(base) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({**base, "messages": [{"role": "user", "content": "v2"}]}) + "\n")
    assert ingest([tmp_path / "a.jsonl"], wh).id_clashes == 0
    s = ingest([tmp_path / "b.jsonl"], wh)
    assert (s.accepted, s.id_clashes) == (1, 1)
    with wh.connect() as con:
        rows = con.execute("SELECT record_id, id_clash FROM trajectories WHERE trajectory_id = 'dup'").fetchall()
        clash, = con.execute("SELECT versions FROM v_id_clashes WHERE trajectory_id = 'dup'").fetchone()
    assert len(rows) == 2 and len({r[0] for r in rows}) == 2 and all(r[1] for r in rows)
    assert clash == 2


def test_reingest_is_idempotent_and_invariant_holds(tmp_path, wh):
    samples.write_samples(tmp_path / "landing", n_synthetic=50)
    first = ingest([tmp_path / "landing"], wh)
    assert first.read == first.accepted + first.quarantined + first.duplicates
    assert first.accepted == 56 and first.quarantined == len(samples.bad_lines())
    again = ingest([tmp_path / "landing"], wh)
    assert (again.read, again.accepted, again.quarantined, again.duplicates) == (first.read, 0, 0, first.read)
    with wh.connect() as con:
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == first.accepted
        assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == first.quarantined
        assert con.execute("SELECT count(*) FROM ingest_batches").fetchone()[0] == 2


def test_exact_duplicate_lines_within_one_file(tmp_path, wh):
    line = json.dumps({"trajectory_id": "x", "task_id": "t", "messages": [{"role": "user", "content": "a"}]})
    (tmp_path / "d.jsonl").write_text(f"{line}\n{line}\n\n{line}\n")
    s = ingest([tmp_path / "d.jsonl"], wh)
    assert (s.read, s.accepted, s.duplicates) == (3, 1, 2)


def test_corrupt_parquet_is_quarantined_whole(tmp_path, wh):
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    s = ingest([tmp_path / "broken.parquet"], wh)
    assert s.quarantined == 1 and _quarantine(wh)[0][1] == "unreadable_parquet"


def test_an_adapter_crash_quarantines_the_record_and_the_batch_goes_on(tmp_path, wh, monkeypatch):
    from ratchet.adapters import atif

    def boom(rec, source):
        raise KeyError("steps")
    monkeypatch.setattr(atif, "to_native", boom)
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(samples.atif_traj()))
    from ratchet.synth import write_jsonl
    write_jsonl(d / "b.jsonl", 3)
    s = ingest([d], wh)
    assert (s.read, s.accepted, s.quarantined) == (4, 3, 1)
    assert s.quarantine_reasons == {"unexpected_error": 1}
    assert _quarantine(wh)[0][1:3] == ("unexpected_error", "KeyError: 'steps'")


def test_missing_path_is_a_clear_error(tmp_path, wh):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        ingest([tmp_path / "does-not-exist"], wh)


def test_parallel_path_matches_inline(tmp_path, home, monkeypatch):
    """Large files are split into newline-aligned ranges for worker processes: same rows, same
    quarantine (with true line numbers), same counts as the inline path."""
    import ratchet.ingest as ingest_mod
    import ratchet.ingest_ranges as ingest_ranges
    from ratchet.synth import write_jsonl
    from ratchet.warehouse import Warehouse

    write_jsonl(tmp_path / "a.jsonl", 120)
    body = (tmp_path / "a.jsonl").read_bytes().splitlines()
    body[37:37] = [samples.bad_lines()[0]]                  # truncated JSON as line 38
    body.append(body[5])                                     # an exact duplicate as the last line
    body.append(samples.bad_lines()[-1])                     # a \u0000-escaped NUL as line 123
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(body) + b"\n")

    def run(sub, **patch):
        for k, v in patch.items():
            monkeypatch.setattr(ingest_ranges if k == "RANGE_BYTES" else ingest_mod, k, v)
        w = Warehouse(home.root / sub / "warehouse.duckdb")
        s = ingest([tmp_path / "a.jsonl"], w, IngestOptions(workers=2))
        with w.connect() as con:
            rows = con.execute("SELECT record_id, source_line FROM trajectories ORDER BY 1").fetchall()
            q = con.execute("SELECT source_line, reason_code, raw FROM quarantine").fetchall()
            sha = con.execute("SELECT sha256 FROM ingest_files").fetchall()
        assert sha == [(hashlib.sha256((tmp_path / "a.jsonl").read_bytes()).hexdigest(),)]
        assert s.fast_path == 121  # every well-formed native line, the duplicate included
        return s, rows, q

    s1, rows1, q1 = run("inline")
    s2, rows2, q2 = run("parallel", PARALLEL_MIN_BYTES=1, RANGE_BYTES=64 << 10)
    # every worker dies at start: the ranges run in this process and nothing is lost or doubled
    s3, rows3, q3 = run("dead-workers", PARALLEL_MIN_BYTES=1, RANGE_BYTES=64 << 10,
                        worker_init=functools.partial(os._exit, 3))
    assert (s3.read, s3.accepted, s3.quarantined, s3.duplicates) == (123, 120, 2, 1)
    assert rows3 == rows1 and sorted(q3) == sorted(q2)
    assert (s1.read, s1.accepted, s1.quarantined, s1.duplicates) == (123, 120, 2, 1)
    assert (s2.read, s2.accepted, s2.quarantined, s2.duplicates) == (123, 120, 2, 1)
    assert rows1 == rows2
    assert sorted((r[0], r[1], bytes(r[2])) for r in q1) == sorted((r[0], r[1], bytes(r[2])) for r in q2) == [
        (38, "truncated_json", samples.bad_lines()[0]), (123, "nul_byte", samples.bad_lines()[-1])]
    assert not list((home.root / "parallel" / "lake" / "trajectories").glob(".staging-*"))
