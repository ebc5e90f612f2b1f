"""Every `.json` input is asked whether it is a SWE-bench report; a large array of records must
not be parsed whole to find out (it was: 1.75 GB of RSS for a 248 MB array then refused)."""
import json

import pytest

from ratchet import ingest as ing
from tests.ingest.test_compressed_bounds import MIB, _ingest_in_child

REC = json.dumps({"trajectory_id": "a", "task_id": "t", "messages": [{"role": "user", "content": "x"}]}).encode()


@pytest.mark.timeout(180)
def test_a_large_json_array_is_not_parsed_to_look_for_reports(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    n = (140 * MIB) // (len(REC) + 1)  # past the 128 MiB document limit: refused once, never held whole
    with open(d / "big.json", "wb") as f:
        f.write(b"[" + b",".join(REC for _ in range(n)) + b"]")
    out = _ingest_in_child(tmp_path, d)   # asserts the child's peak RSS stayed within the budget
    assert [q[0] for q in out["quarantine"]] == ["record_too_large"]


def test_report_sniff(tmp_path):
    report = {"astropy__astropy-12907": {"patch_is_None": False, "patch_exists": True,
                                         "patch_successfully_applied": True, "resolved": True}}
    summary = {"total_instances": 2, "submitted_instances": 2, "completed_ids": ["a"] * 20_000, "resolved_ids": ["a"]}
    records = [{"instance_id": "a", "model_patch": "", "note": "resolved"}] * 10
    for name, obj, found in (("r.json", report, True), ("s.json", summary, True), ("p.json", records, False)):
        (tmp_path / name).write_text(json.dumps(obj))
        assert (ing._report_file(tmp_path / name) is not None) is found, name
    # sniffed out from its head alone: the invalid tail is never read
    (tmp_path / "head.json").write_bytes(b'[{"trajectory_id": "a"}' + b" " * (2 * ing.REPORT_SNIFF_BYTES) + b"\xff")
    assert ing._report_file(tmp_path / "head.json") is None
    assert not ing._looks_like_report(b'[{"resolved": true}]') and ing._looks_like_report(b'\xef\xbb\xbf {"x": {"resolved"')


def test_any_one_of_a_run_summary_s_keys_in_the_head_is_enough(tmp_path):
    """A summary whose `resolved_ids` lies past the sniffed head is still a report when either
    count key is in it, whichever of them it has."""
    ids = ["a"] * 20_000   # pushes `resolved_ids` past the first 64 KiB
    for key in ("total_instances", "submitted_instances"):
        (tmp_path / f"{key}.json").write_text(json.dumps({key: 2, "completed_ids": ids, "resolved_ids": ["a"]}))
        assert ing._report_file(tmp_path / f"{key}.json") is not None, key
    (tmp_path / "neither.json").write_text(json.dumps({"completed_ids": ids, "resolved_ids": ["a"]}))
    assert ing._report_file(tmp_path / "neither.json") is None


def test_the_report_limits_are_the_documented_ones(tmp_path):
    """docs/ingest.md: a report is read only from a file of at most 32 MiB whose first 64 KiB name
    a `resolved` key: both bounds checked at the byte, from the documented numbers."""
    from pathlib import Path
    doc = " ".join((Path(__file__).parents[2] / "docs" / "ingest.md").read_text().split())
    assert "a file of at most 32 MiB whose first 64 KiB is a JSON object" in doc
    limit, head = 32 * MIB, 64 * 1024
    body = b'"astropy__astropy-12907": {"resolved": true}}'
    for size, found in ((limit, True), (limit + 1, False)):
        f = tmp_path / f"size-{size}.json"
        f.write_bytes(b"{" + body + b" " * (size - len(body) - 1))
        assert f.stat().st_size == size
        assert (ing._report_file(f) is not None) is found, size
    # `"resolved` ends at the head's last byte, or starts at the first byte past it
    for at, found in ((head - len(b'"resolved'), True), (head, False)):
        pad = at - len(b'{"astropy__astropy-12907": {')
        f = tmp_path / f"at-{at}.json"
        f.write_bytes(b'{"astropy__astropy-12907": {' + b" " * pad + b'"resolved": true}}')
        assert f.read_bytes().index(b'"resolved') == at
        assert (ing._report_file(f) is not None) is found, at


def test_a_report_cut_short_is_not_a_report_and_its_text_is_quarantined(tmp_path, wh):
    """A `.json` whose head looks like a report but that does not parse (a copy cut short) is no
    report: it is read as records, and its text is quarantined with the reason, not lost."""
    (tmp_path / "in").mkdir()
    f = tmp_path / "in" / "report.json"
    f.write_text('{"astropy__astropy-12907": {"patch_exists": true, "resolved": tr')
    assert ing._looks_like_report(f.read_bytes()) and ing._report_file(f) is None
    s = ing.ingest([tmp_path / "in"], wh)
    assert s.consistent and (s.read, s.quarantined, s.reports_joined) == (1, 1, 0), s.as_dict()
    assert s.quarantine_reasons == {"truncated_json": 1}, s.as_dict()


def test_a_compressed_or_utf16_report_is_a_report_and_its_decoded_size_is_bounded(tmp_path, wh):
    """A report is read decoded, as every other input is: gzipped or UTF-16 it still joins its
    predictions (it was quarantined as `unknown_format` and the outcome lost); and the 32 MiB
    bound holds for the decoded text, so a small gzip that inflates past it is not parsed."""
    import gzip

    report = {"astropy__astropy-12907": {"patch_exists": True, "resolved": True}}
    text = json.dumps(report)
    for name, data in (("r16.json", text.encode("utf-16")), ("rgz.json.gz", gzip.compress(text.encode()))):
        (tmp_path / name).write_bytes(data)
        assert ing._report_file(tmp_path / name) is not None, name
    pad = b" " * (32 * MIB)
    (tmp_path / "big.json.gz").write_bytes(gzip.compress(text.encode()[:-1] + pad + b"}"))
    assert (tmp_path / "big.json.gz").stat().st_size < MIB
    assert ing._report_file(tmp_path / "big.json.gz") is None
    # the same text as many small gzip members (`cat a.gz b.gz ...`): decoded chunks smaller than
    # the sniffed head still count towards the bound
    whole = text.encode()[:-1] + pad + b"}"
    step = 16 << 10
    (tmp_path / "members.json.gz").write_bytes(b"".join(gzip.compress(whole[i:i + step])
                                                        for i in range(0, len(whole), step)))
    assert (tmp_path / "members.json.gz").stat().st_size < 2 * MIB
    assert ing._report_file(tmp_path / "members.json.gz") is None

    for name, data in (("report.json", text.encode("utf-16")), ("report.json.gz", gzip.compress(text.encode()))):
        d = tmp_path / f"run-{name}"
        d.mkdir()
        (d / "preds.jsonl").write_text(json.dumps({"instance_id": "astropy__astropy-12907", "model_name_or_path": "m",
                                                   "model_patch": "diff --git a/x b/x\n"}) + "\n")
        (d / name).write_bytes(data)
        s = ing.ingest([d], wh)
        assert (s.accepted + s.duplicates, s.quarantined, s.reports_joined) == (1, 0, 1), (name, s.as_dict())


def test_reports_are_looked_for_beside_predictions_only(tmp_path, wh):
    """`report.json` files are searched for beside SWE-bench predictions (records naming both
    `instance_id` and `model_patch`), not beside every record that names an instance or a file
    that cannot be read: a report beside a task list given as a file does not describe the
    predictions of another folder."""
    report = {"astropy__astropy-12907": {"patch_exists": True, "resolved": True}}
    tasks = tmp_path / "a-tasks"
    tasks.mkdir()
    (tasks / "tasks.jsonl").write_text(json.dumps({"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy",
                                                   "problem_statement": "x"}) + "\n")
    (tasks / "report.json").write_text(json.dumps(report))
    preds = tmp_path / "b-preds"
    preds.mkdir()
    (preds / "preds.jsonl").write_text(json.dumps({"instance_id": "astropy__astropy-12907", "model_name_or_path": "m",
                                                   "model_patch": "diff --git a/x b/x\n"}) + "\n")
    (tasks / "broken.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00 not gzip")   # nor beside a file that cannot be read
    s = ing.ingest([tasks / "tasks.jsonl", tasks / "broken.jsonl.gz", preds], wh)
    assert s.reports_joined == 0 and s.quarantine_reasons.get("corrupt_compressed") == 1, s.as_dict()
    # beside the predictions, the same report joins
    (preds / "report.json").write_text(json.dumps(report))
    s = ing.ingest([preds / "preds.jsonl"], wh)
    assert s.reports_joined == 1, s.as_dict()
