"""Batch accounting: the summary's counts, the batch time and compact()'s result are what the
warehouse holds, and one file that vanishes mid-batch drops only itself."""
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import ratchet.ingest as ingest_mod
from ratchet import samples
from ratchet.ingest import SKIPPED_LISTED, compact, ingest


def _good(tid: str) -> str:
    return json.dumps({"trajectory_id": tid, "task_id": "t", "messages": [{"role": "user", "content": tid}]}) + "\n"


def _inbox(tmp_path: Path) -> Path:
    d = tmp_path / "in"  # tmp_path also holds the home (warehouse, landing)
    d.mkdir()
    return d


def _files(wh, batch_id):
    with wh.connect() as con:
        return {Path(f).name: (s, r, a) for f, s, r, a in con.execute(
            'SELECT source_file, status, skip_reason, accepted FROM ingest_files WHERE batch_id = ?',
            [batch_id]).fetchall()}


def test_batch_is_stamped_with_its_start_time_and_counts_its_files(tmp_path, wh):
    tmp_path = _inbox(tmp_path)
    for n in ("a", "b", "c"):
        (tmp_path / f"{n}.jsonl").write_text(_good(n))
    before = datetime.now(timezone.utc)
    s = ingest([tmp_path], wh)
    assert s.files == 3 and s.accepted == 3
    with wh.connect() as con:
        started = con.execute("SELECT started_at FROM ingest_batches WHERE batch_id = ?", [s.batch_id]).fetchone()[0]
    assert started is not None and abs(started - before) < timedelta(minutes=1)


def test_every_skipped_file_counts_and_the_first_hundred_are_named(tmp_path, wh):
    d = tmp_path / "in"
    d.mkdir()
    (d / "real.jsonl").write_text(_good("r"))
    n = SKIPPED_LISTED + 1
    for i in range(n):
        (d / f".hidden-{i:03}.jsonl").write_text(_good(f"h{i}"))
    s = ingest([d], wh)
    assert s.skipped == n and sum(s.skip_reasons.values()) == n
    assert len(s.skipped_files) == SKIPPED_LISTED
    assert sum(st == "skipped" for st, _r, _a in _files(wh, s.batch_id).values()) == n


def test_a_file_vanishing_mid_batch_skips_only_that_file(tmp_path, wh, monkeypatch):
    tmp_path = _inbox(tmp_path)
    for n in ("a", "b", "c", "d"):
        (tmp_path / f"{n}.jsonl").write_text(_good(n))
    real = ingest_mod.check_regular
    calls = {"b": 0}

    def flaky(f, *a, **k):
        # b.jsonl is there at discovery, gone when the loop opens it
        if Path(f).name == "b.jsonl":
            calls["b"] += 1
            raise ingest_mod.SkipFile("vanished", "gone since discovery")
        return real(f, *a, **k)

    monkeypatch.setattr(ingest_mod, "check_regular", flaky)
    s = ingest([tmp_path], wh)
    assert calls["b"] and s.accepted == 3 and s.skipped == 1
    rows = _files(wh, s.batch_id)
    assert rows["b.jsonl"][:2] == ("skipped", "vanished")
    assert all(rows[f"{n}.jsonl"] == ("read", None, 1) for n in ("a", "c", "d"))


def test_compact_merges_two_parts_keeps_every_row_and_counts_debris(tmp_path, wh):
    for i in range(2):
        f = tmp_path / f"batch{i}.jsonl"
        f.write_text(_good(f"x{i}a") + _good(f"x{i}b"))
        ingest([f], wh)
    assert len(wh.part_names()) == 2

    def rows():
        with wh.connect() as con:
            return con.execute("SELECT * FROM trajectories ORDER BY trajectory_id").fetchall()

    before = rows()
    (wh.trajectory_dir / ".staging-dead").mkdir()
    (wh.trajectory_dir / "left.tmp").write_bytes(b"x")
    got = compact(wh)
    assert isinstance(got, dict) and got["merged"] == 2 and got["debris_removed"] == 2
    assert len(wh.part_names()) == 1 and rows() == before and len(before) == 4


def test_reports_joined_sums_over_the_prediction_files_of_a_batch(tmp_path, wh):
    preds, reports = samples.swebench_predictions()
    for i, p in enumerate(preds):  # one prediction per file: the batch total is the sum of the files'
        (tmp_path / f"preds{i}.jsonl").write_text(json.dumps(p) + "\n")
    for inst, rep in reports.items():
        d = tmp_path / "logs" / inst
        d.mkdir(parents=True)
        (d / "report.json").write_text(json.dumps(rep))
    s = ingest([tmp_path / f"preds{i}.jsonl" for i in range(len(preds))], wh)
    assert s.accepted == len(preds) and s.reports_joined == 2


def test_a_plain_batch_reports_every_count_exactly(tmp_path, wh):
    """Every field of the summary for a batch whose answer is known: three records, one bad line,
    one repeat. A counter that starts anywhere but zero, or a count the batch never touched
    (id clashes, superseded rows, debris, compaction), shows here."""
    d = _inbox(tmp_path)
    (d / "a.jsonl").write_text(_good("a") + _good("b") + "{not json\n" + _good("a"))
    (d / "c.jsonl").write_text(_good("c"))
    s = ingest([d], wh).as_dict()
    with wh.connect() as con:
        row = con.execute('SELECT origin, dagster_run_id, tenant_id, consent_id, "read", accepted, quarantined, '
                          'duplicates, id_clashes FROM ingest_batches WHERE batch_id = ?', [s["batch_id"]]).fetchone()
    assert row == ("cli", None, None, None, 5, 3, 1, 1, 0)   # unset options are NULL, not empty strings
    assert s.pop("batch_id") and s.pop("seconds") >= 0
    assert s == {"read": 5, "accepted": 3, "quarantined": 1, "duplicates": 1, "id_clashes": 0, "files": 2,
                 "reports_joined": 0, "fast_path": 4, "by_format": {"openai_chat": 4},
                 "quarantine_reasons": {"invalid_json": 1}, "skipped": 0, "skip_reasons": {},
                 "skipped_files": [], "superseded": 0, "attribution_conflicts": 0, "debris_removed": 0,
                 "compacted_parts": 0}



@pytest.mark.parametrize("workers", [1, 2])
def test_fast_path_counts_jsonl_lines_up_to_the_record_limit_and_no_document_records(tmp_path, wh, workers):
    """`fast_path` counts the native JSONL lines the typed decoder took: a line of exactly the
    record limit is one of them (the limit is inclusive); a line one byte over is refused unread;
    records of a `.json` document, and a line the typed decoder declines, take the general path
    (whose bound is the same)."""
    from ratchet.ingest import IngestOptions

    d = _inbox(tmp_path)
    head = b'{"trajectory_id":"%s","task_id":"t","messages":[{"role":"user","content":"'
    tail = b'"}]}'
    at = head % b"at" + b"x" * ((1 << 20) - len(head % b"at") - len(tail)) + tail
    over = head % b"ov" + b"x" * ((1 << 20) + 1 - len(head % b"ov") - len(tail)) + tail
    assert len(at) == 1 << 20 and len(over) == (1 << 20) + 1
    # a line at the limit the typed decoder declines (a token count of 3.0): the general path's bound
    usage = b',"usage":{"prompt_tokens":3.0}}'
    general = head % b"ge" + b"x" * ((1 << 20) - len(head % b"ge") - len(tail) - len(usage) + 1) + tail[:-1] + usage
    assert len(general) == 1 << 20
    (d / "a.jsonl").write_bytes(at + b"\n" + over + b"\n" + _good("small").encode() + general + b"\n")
    (d / "b.json").write_text("[" + _good("d1").strip() + "," + _good("d2").strip() + "]")
    s = ingest([d], wh, IngestOptions(max_record_mb=1, workers=workers))
    assert (s.read, s.accepted, s.quarantine_reasons) == (6, 5, {"record_too_large": 1}), s.as_dict()
    assert s.fast_path == 2, s.as_dict()


def test_the_summary_invariant_is_a_truth_value_that_can_fail():
    # ingest raises when read != accepted + quarantined + duplicates; the check reads `consistent`
    from ratchet.ingest import IngestSummary
    assert IngestSummary("b", read=4, accepted=1, quarantined=2, duplicates=1).consistent is True
    assert IngestSummary("b", read=4, accepted=1, quarantined=2).consistent is False


def test_records_are_written_in_chunks_bounded_by_rows_and_by_bytes():
    # a chunk ends at `rows` records or once its payloads reach `max_bytes`, whichever comes first:
    # the bytes bound is what keeps a batch of large records from being held at once
    from types import SimpleNamespace

    from ratchet.ingest import _chunks
    sizes = lambda chunks: [len(c) for c in chunks]  # noqa: E731
    four = [(b"abcd",)] * 10                              # the fast path's tuples
    assert sizes(_chunks(four, rows=10, max_bytes=9)) == [3, 3, 3, 1]   # 4 + 4 < 9 <= 4 + 4 + 4
    assert sizes(_chunks(four, rows=10, max_bytes=8)) == [2, 2, 2, 2, 2]
    assert sizes(_chunks(four, rows=4, max_bytes=10**6)) == [4, 4, 2]
    parsed = [SimpleNamespace(payload=b"abcd")] * 10     # parsed records carry their payload
    assert sizes(_chunks(parsed, rows=10, max_bytes=9)) == [3, 3, 3, 1]
    assert list(_chunks([], rows=10, max_bytes=9)) == []


def test_quarantine_rows_staged_in_parts_all_reach_the_table_once(wh, tmp_path):
    """Quarantine rows are staged 1,024 at a time: 2,500 bad lines are 2,500 rows, each line once,
    and the same file again adds none (each a duplicate)."""
    d = tmp_path / "in"
    d.mkdir()
    good = [json.dumps({"trajectory_id": f"g{i}", "task_id": "t", "messages": [{"role": "user", "content": "x"}]})
            for i in range(3)]
    bad = [f'{{"trajectory_id": "b{i}", "messages": [' for i in range(2500)]   # truncated, each its own text
    (d / "mixed.jsonl").write_text("\n".join(good[:1] + bad[:1500] + good[1:2] + bad[1500:] + good[2:]) + "\n")
    s = ingest([d], wh)
    assert (s.read, s.accepted, s.quarantined, s.duplicates) == (2503, 3, 2500, 0), s.as_dict()
    with wh.connect() as con:
        n, lines, first, last = con.execute(
            "SELECT count(*), count(DISTINCT source_line), min(source_line), max(source_line) FROM quarantine").fetchone()
    assert (n, lines, first, last) == (2500, 2500, 2, 2502)
    again = ingest([d / "mixed.jsonl"], wh)
    assert (again.quarantined, again.duplicates) == (0, 2503), again.as_dict()
    with wh.connect() as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 2500


def test_an_error_before_any_record_is_read_is_raised_as_itself_and_commits_nothing(wh, tmp_path, monkeypatch):
    """An ingest that fails early (here: while gathering SWE-bench reports) raises that error, not
    one from its clean-up, leaves no staging folder and records no batch."""
    d = _inbox(tmp_path)

    def broken(files):
        raise OSError("the reports' disk went away")
    monkeypatch.setattr(ingest_mod, "_collect_reports", broken)
    with pytest.raises(OSError, match="the reports' disk went away"):
        ingest([d], wh)
    assert not list(wh.trajectory_dir.glob(".staging-*"))
    with wh.connect() as con:
        assert con.execute("SELECT count(*) FROM ingest_batches").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 0


def test_a_batch_row_keeps_the_summary_the_ingest_returned_and_its_time(wh, tmp_path):
    """`ingest_batches.summary` is the JSON of the summary `ingest` returned (what `ratchet ingest`
    prints), and `seconds` is the call's own duration."""
    import time

    d = _inbox(tmp_path)
    t0 = time.perf_counter()
    s = ingest([d], wh)
    took = time.perf_counter() - t0
    assert 0 <= s.seconds <= took
    with wh.connect() as con:
        stored = con.execute("SELECT summary, id_clashes FROM ingest_batches WHERE batch_id = ?", [s.batch_id]).fetchone()
    assert json.loads(stored[0]) == json.loads(json.dumps(s.as_dict())) and stored[1] == s.id_clashes == 0


def test_rows_of_small_files_are_gathered_into_parts_bounded_by_rows_and_by_bytes(tmp_path, monkeypatch):
    """Small files' rows are written together, a part ending at PART_ROWS rows or once it holds
    PART_BYTES of Arrow data: the bytes bound is what keeps many large rows from being held at once."""
    from datetime import datetime, timezone

    import pyarrow.parquet as pq

    from ratchet import ingest_writer
    from ratchet.home import get_home
    from ratchet.ingest_records import FileContext, normalise_chunk
    from ratchet.warehouse import Warehouse

    d = _inbox(tmp_path)
    for i in range(12):
        (d / f"f{i:02d}.jsonl").write_text(_good(f"r{i:02d}"))

    def parts(home_name: str, rows: int, part_bytes: int) -> list[int]:
        monkeypatch.setattr(ingest_writer, "PART_ROWS", rows)
        monkeypatch.setattr(ingest_writer, "PART_BYTES", part_bytes)
        wh = Warehouse(get_home(tmp_path / home_name).ensure().warehouse)
        wh.ensure_schema()
        assert ingest([d], wh, ingest_mod.IngestOptions(workers=1)).accepted == 12
        return sorted(n for n in (pq.read_metadata(p).num_rows for p in wh.trajectory_dir.rglob("*.parquet")) if n)

    # one file's rows as the writer holds them (same path length, same batch id length)
    ctx = FileContext(d / "f00.jsonl", {}, 1 << 20, {}, "b" * 32, datetime.now(timezone.utc))
    one = normalise_chunk([(_good("r00").strip().encode(), 1, 0)], ctx).table.nbytes
    assert parts("by-rows", 5, 1 << 30) == [2, 5, 5]
    assert parts("by-bytes", 1000, one * 3) == [3, 3, 3, 3]    # the bound is inclusive
    assert parts("by-bytes-each", 1000, one * 2 + 1) == [3, 3, 3, 3]  # each part counts its own bytes from 0
