"""Deep nesting is `too_deep`, a key written twice in one object is quarantined as
`duplicate_key` (with the raw text, both values in it), and hidden files and folders inside an
input folder get a `skipped` row each."""
import json

import orjson
import pytest

from ratchet.ingest import ingest
from ratchet.readers.json_codec import duplicate_key, loads

GOOD = {"task_id": "t", "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}


def _quarantine(wh):
    with wh.connect() as con:
        return con.execute("SELECT reason_code, source_line, reason, raw FROM quarantine ORDER BY source_line").fetchall()


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def test_deep_nesting_is_too_deep_not_invalid_json(tmp_path, wh):
    d = tmp_path / "in"
    d.mkdir()
    beyond = json.dumps({**GOOD, "trajectory_id": "a", "extra": {"x": "@"}}).replace('"@"', _deep(5000))
    deep_ok = json.dumps({**GOOD, "trajectory_id": "b", "extra": {"x": "@"}}).replace('"@"', _deep(600))
    (d / "lines.jsonl").write_text(beyond + "\n" + deep_ok + "\n" + json.dumps({**GOOD, "trajectory_id": "c"}) + "\n")
    (d / "doc.json").write_text(beyond)
    (d / "arr.json").write_text("[" + json.dumps({**GOOD, "trajectory_id": "d"}) + "," + deep_ok + "]")
    s = ingest([d], wh)
    assert s.consistent and s.accepted == 2, s.as_dict()   # c, and d of the array
    assert s.quarantine_reasons == {"too_deep": 4}, s.as_dict()


def test_a_record_that_parses_but_is_too_deep_to_normalise_is_too_deep(tmp_path, wh):
    """Under the reader's 1,024 levels a record still parses, and normalising it can reach
    Python's recursion limit: `too_deep`, never `unexpected_error`, and the batch goes on."""
    d = tmp_path / "in"
    d.mkdir()
    lines = [json.dumps({**GOOD, "trajectory_id": "e", "extra": {"x": "@"}}).replace('"@"', _deep(990)),
             json.dumps({**GOOD, "trajectory_id": "m", "messages": [{"role": "user", "content": "@"}]})
             .replace('"@"', _deep(1010)),
             json.dumps({**GOOD, "trajectory_id": "ok"})]
    loads(lines[0].encode())                          # parses: the refusal is normalisation's
    (d / "lines.jsonl").write_text("\n".join(lines) + "\n")
    s = ingest([d], wh)
    assert s.consistent and s.accepted == 1 and s.quarantine_reasons == {"too_deep": 2}, s.as_dict()


def test_a_number_no_reader_can_hold_is_out_of_range_not_invalid_json(tmp_path, wh):
    """1e999 and -1e400 are valid JSON past a double's range (orjson refuses them as infinity), and
    an integer of 5,000 digits is past what the reader holds: the documented `out_of_range`,
    in a JSONL line and in a JSON document alike; 1.5e308 and a 30-digit integer are kept."""
    d = tmp_path / "in"
    d.mkdir()
    rec = json.dumps({**GOOD, "trajectory_id": "@id", "extra": {"x": "@n"}})
    lines = [rec.replace("@id", f"n{i}").replace('"@n"', n)
             for i, n in enumerate(["1e999", "-1e400", "1" + "0" * 5000, "1.5e308", "1" + "0" * 29])]
    (d / "lines.jsonl").write_text("\n".join(lines) + "\n")
    (d / "doc.json").write_text(rec.replace("@id", "doc").replace('"@n"', "2e999"))
    s = ingest([d], wh)
    assert s.consistent and s.accepted == 2, s.as_dict()
    assert s.quarantine_reasons == {"out_of_range": 4}, s.as_dict()
    assert all("a number cannot be represented" in r[2] for r in _quarantine(wh))


def test_duplicate_keys_are_quarantined_with_both_values(tmp_path, wh):
    d = tmp_path / "in"
    d.mkdir()
    lines = [
        json.dumps(CHAT)[:-1] + ', "id": "first", "id": "second"}',                        # a foreign format
        json.dumps({**GOOD, "trajectory_id": "n", "x_top": 1})[:-1] + ', "tenant_id": "a", "tenant_id": "b"}',
        json.dumps({**GOOD, "trajectory_id": "m", "x_top": 1}).replace('"content": "hi"', '"content": "hi", "content": "ho"'),
        json.dumps({**GOOD, "trajectory_id": "ok", "x_top": 1}),
    ]
    (d / "lines.jsonl").write_text("\n".join(lines) + "\n")
    arr = [{**GOOD, "trajectory_id": "a1"}, "@", {**GOOD, "trajectory_id": "a3"}]
    (d / "arr.json").write_text(json.dumps(arr).replace('"@"', '{"task_id": "t", "task_id": "u", "trajectory_id": "a2", '
                                                        '"messages": [{"role": "user", "content": "hi"}]}'))
    (d / "one.json").write_text(json.dumps(CHAT)[:-1] + ', "system": "s", "system": "t"}')
    s = ingest([d], wh)
    assert s.consistent and (s.read, s.accepted) == (8, 3), s.as_dict()
    assert s.quarantine_reasons == {"duplicate_key": 5}
    q = {(line, reason.split(" is written")[0]): raw for code, line, reason, raw in _quarantine(wh)}
    assert set(q) == {(1, "the key id"), (2, "the key tenant_id"), (3, "the key messages[0].content"),
                      (2, "the key task_id"), (0, "the key system")}
    assert b'"first"' in q[1, "the key id"] and b'"second"' in q[1, "the key id"]
    assert b'"t"' in q[2, "the key task_id"] and b'"u"' in q[2, "the key task_id"]  # the element as written
    again = ingest([d], wh)
    assert (again.accepted, again.quarantined, again.duplicates) == (0, 0, 8)


@pytest.mark.parametrize("text", [b'{"a": 1, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]}', b'{"k": "x:y\\u003a", "z": ":"}',
                                  b'{"a\\\\": 1, "a": 2}', b'{"s": "\\"a\\": 1, \\"a\\": 2"}'])
def test_no_false_duplicates(text):
    assert duplicate_key(text, loads(text)) is None


@pytest.mark.parametrize("text,path", [(b'{"a": 1, "a": 1}', "a"), (b'{"x": [{"q": 1}, {"q": 1, "q": 2}]}', "x[1].q"),
                                       (b'{"k": "\\u003a", "k": 2}', "k"), (b'{"a": {}, "b": {"c": {"d": 1, "d": 1}}}', "b.c.d")])
def test_duplicates_found_with_their_path(text, path):
    assert duplicate_key(text, loads(text)) == path


def test_hidden_files_and_folders_get_a_skipped_row(tmp_path, wh):
    d = tmp_path / "in"
    (d / ".git" / "objects").mkdir(parents=True)
    (d / ".git" / "objects" / "x.jsonl").write_text(json.dumps({**GOOD, "trajectory_id": "git"}) + "\n")
    (d / "sub").mkdir()
    (d / "sub" / ".draft.jsonl").write_text(json.dumps({**GOOD, "trajectory_id": "draft"}) + "\n")
    (d / "sub" / "real.jsonl").write_text(json.dumps({**GOOD, "trajectory_id": "real"}) + "\n")
    s = ingest([d], wh)
    assert s.accepted == 1 and s.skip_reasons == {"hidden_file": 1, "hidden_folder": 1}, s.as_dict()
    with wh.connect() as con:
        rows = con.execute("SELECT source_file, skip_reason, skip_detail FROM ingest_files WHERE status = 'skipped' "
                           "ORDER BY 1").fetchall()
    assert [(f.removeprefix(str(d)), r) for f, r, _ in rows] == [("/.git", "hidden_folder"),
                                                                 ("/sub/.draft.jsonl", "hidden_file")]
    assert all("give its path" in detail for _, _, detail in rows)
    named = ingest([d / "sub" / ".draft.jsonl"], wh)       # given by name: read
    assert named.accepted == 1 and named.skipped == 0
    assert orjson.loads(orjson.dumps(s.skipped_files))[0]["reason_code"] == "hidden_folder"


def test_files_concatenated_with_their_byte_order_marks_keep_every_record(tmp_path, wh):
    """`cat a.jsonl b.jsonl` of two files saved with a UTF-8 BOM puts a BOM at the start of a
    line in the middle: that line is a record like any other."""
    d = tmp_path / "in"
    d.mkdir()
    bom = b"\xef\xbb\xbf"
    (d / "cat.jsonl").write_bytes(b"".join(bom + json.dumps({**GOOD, "trajectory_id": t}).encode() + b"\n"
                                           for t in ("a", "b", "c")))
    s = ingest([d], wh)
    assert s.consistent and (s.read, s.accepted) == (3, 3), s.as_dict()


def test_a_document_or_array_element_over_the_record_limit_is_record_too_large(tmp_path, wh):
    """A JSON document is read whole (up to 4x the limit): a record in it larger than
    max_record_mb is `record_too_large`, with the size and the limit named; its small neighbours
    in the same array are kept."""
    from ratchet.ingest import IngestOptions

    d = tmp_path / "in"
    d.mkdir()
    big = {**GOOD, "trajectory_id": "big", "extra": {"blob": "x" * (3 << 19)}}   # 1.5 MiB
    (d / "doc.json").write_text(json.dumps(big))
    (d / "arr.json").write_text(json.dumps([{**GOOD, "trajectory_id": "small"}, {**big, "trajectory_id": "big2"}]))
    s = ingest([d], wh, IngestOptions(max_record_mb=1))
    assert s.consistent and s.accepted == 1 and s.quarantine_reasons == {"record_too_large": 2}, s.as_dict()
    reasons = {r[1]: r[2] for r in _quarantine(wh)}
    assert reasons[2] == "1.5 MiB exceeds the 1 MiB limit (raise max_record_mb to accept it)", reasons


def test_a_foreign_record_nested_past_what_json_writes_is_too_deep_not_an_adapter_error(tmp_path, wh):
    """orjson writes at most 255 levels and reads 1,024: a SWE-agent trajectory, or an ATIF one
    without a `session_id` (its id is a hash of its JSON), nested 300 deep parses, and writing it in
    the adapter fails. That is `too_deep`, as for a native record, not `unexpected_error` (which
    says an adapter has a bug)."""
    from ratchet import samples

    d = tmp_path / "in"
    d.mkdir()
    atif = samples.atif_traj()
    del atif["session_id"]
    for name, rec in (("atif", atif), ("swe", samples.swe_agent_traj()),
                      ("native", {**GOOD, "trajectory_id": "n"})):
        (d / f"{name}.json").write_text(json.dumps({**rec, "deep_extra": "@"}).replace('"@"', _deep(300)))
    s = ingest([d], wh)
    assert s.consistent and s.quarantine_reasons == {"too_deep": 3}, s.as_dict()


@pytest.mark.parametrize("error, code", [
    (RecursionError("maximum recursion depth exceeded"), "too_deep"),
    (orjson.JSONEncodeError("Recursion limit reached"), "too_deep"),
    (orjson.JSONEncodeError("Integer exceeds 64-bit range"), "unexpected_error"),
    (KeyError("k" * 2000), "unexpected_error"),
])
def test_an_adapter_that_fails_quarantines_its_record_and_the_chunk_goes_on(monkeypatch, error, code):
    """An adapter that exhausts the stack, or whose JSON writer meets orjson's 255-level limit,
    refuses its record as `too_deep` (the input's depth); any other failure is `unexpected_error`
    (an adapter bug), its message cut at 500 characters. No input here reaches these (the reader
    and the duplicate-key check refuse deep records first), but a user's format adapter can: the
    record is kept raw, and the records after it in the same chunk are still read."""
    from datetime import UTC, datetime
    from pathlib import Path

    from ratchet import adapters
    from ratchet.ingest_records import FileContext, normalise_chunk

    real = adapters.to_native

    def to_native(fmt, obj, *args, **kwargs):
        if obj.get("source") == "fails":
            raise error
        return real(fmt, obj, *args, **kwargs)

    monkeypatch.setattr(adapters, "to_native", to_native)
    payloads = [orjson.dumps({**CHAT, "source": "fails"}), orjson.dumps({**CHAT, "source": "fine"}),
                orjson.dumps({**GOOD, "trajectory_id": "n"})]
    ctx = FileContext(Path("in.jsonl"), {}, 1 << 20, {}, "batch", datetime.now(UTC))
    res = normalise_chunk([(p, i + 1, 0) for i, p in enumerate(payloads)], ctx)
    assert [(raw.line, got) for raw, got, _, _ in res.bad] == [(1, code)], res.bad
    assert res.bad[0][0].payload == payloads[0]
    if isinstance(error, KeyError):
        assert len(res.bad[0][2]) == 500 and res.bad[0][2].startswith("KeyError: "), res.bad[0][2][:40]
    assert res.table.column("source_line").to_pylist() == [2, 3]
    assert res.formats == {adapters.detect(CHAT): 1, adapters.NATIVE: 1}, res.formats


def test_a_quarantined_record_names_the_format_it_was_read_as_or_none(tmp_path, wh):
    """`detected_format` says which adapter refused a record, and is NULL where none was reached
    (the bytes are not JSON): an analyst can tell a broken exporter from a broken adapter."""
    from ratchet import samples

    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_text("{not json\n" + json.dumps({**GOOD, "trajectory_id": "m", "messages": "hi"}) + "\n")
    (d / "b.json").write_text(json.dumps(samples.swe_agent_traj()))   # no task id: the file name says none
    s = ingest([d], wh)
    assert s.consistent and s.accepted == 0 and s.quarantined == 3, s.as_dict()
    with wh.connect() as con:
        got = con.execute("SELECT source_file, source_line, detected_format, reason_code FROM quarantine "
                          "ORDER BY source_file, source_line").fetchall()
    assert [(f.rsplit("/", 1)[-1], line, fmt) for f, line, fmt, _ in got] == [
        ("a.jsonl", 1, None), ("a.jsonl", 2, "openai_chat"), ("b.json", 0, "swe_agent")], got


def test_a_foreign_record_holding_an_integer_past_64_bits_is_accepted_with_it_exact(tmp_path, wh):
    """A SWE-agent trajectory, or an ATIF one without a `session_id`, is hashed into its id and
    its tool arguments are written as JSON by the adapter; orjson refuses integers past 64 bits,
    which JSON allows and a log may hold. Such a record is accepted like a native one, its
    integer kept digit for digit (it was quarantined as `unexpected_error`, an adapter bug)."""
    from ratchet import samples

    d = tmp_path / "in"
    d.mkdir()
    atif = samples.atif_traj()
    del atif["session_id"]
    big = "1" + "0" * 30
    for name, rec in (("a.traj", samples.swe_agent_traj()), ("b.json", atif)):
        (d / name).write_text(json.dumps({**rec, "big_extra": "@"}).replace('"@"', big))
    s = ingest([d], wh)
    assert s.consistent and s.accepted == 2 and s.quarantined == 0, s.as_dict()
    with wh.connect() as con:
        extras = [r[0] for r in con.execute("SELECT extra FROM trajectories ORDER BY source_file").fetchall()]
    assert all(f'"big_extra":{big}' in e.replace(" ", "") for e in extras), extras
    # the same record again is the same id: a duplicate, not a second row
    assert ingest([d], wh).duplicates == 2
    # the id hashes the record with its keys sorted at every level, integers past 64 bits included,
    # and is the one orjson gave before for every record orjson can write
    import hashlib

    from ratchet.adapters.common import stable_id
    assert stable_id("p", {"x": {"b": 10**30, "a": 1}, "y": 2}) == stable_id("p", {"y": 2, "x": {"a": 1, "b": 10**30}})
    small = {"y": 2, "x": {"b": 3, "a": 1}}
    assert stable_id("p", small) == "p:" + hashlib.sha256(orjson.dumps(small, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
