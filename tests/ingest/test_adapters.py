"""Each format adapter on realistic samples (several turns, parallel tool calls, long observations)."""
import json

import orjson
import pytest

from ratchet import adapters, samples
from ratchet.ingest import ingest


def _rows(wh, where="true"):
    with wh.connect() as con:
        return con.execute(f"SELECT * FROM trajectories WHERE {where} ORDER BY trajectory_id").df()


def test_detection_is_by_content():
    assert adapters.detect(samples.mini_swe_agent_traj()) == "mini_swe_agent"
    assert adapters.detect(samples.swe_agent_traj()) == "swe_agent"
    assert adapters.detect(samples.atif_traj()) == "atif"
    assert adapters.detect(samples.swebench_predictions()[0][0]) == "swebench_prediction"
    assert adapters.detect({"trajectory_id": "x", "task_id": "y", "messages": []}) == "openai_chat"


def test_mini_swe_agent(tmp_path, wh):
    f = tmp_path / "acme__billing-1042.traj.json"
    f.write_text(json.dumps(samples.mini_swe_agent_traj()))
    s = ingest([f], wh)
    assert (s.accepted, s.quarantined) == (1, 0)
    r = _rows(wh).iloc[0]
    assert r.trajectory_id == "mini-swe-agent:acme__billing-1042" and r.task_id == "acme__billing-1042"
    assert r.repo == "acme/billing" and r.agent_id == "mini-swe-agent/gpt-5-mini"
    msgs = orjson.loads(r.messages)
    calls = [m for m in msgs if m.get("tool_calls")]
    assert len(calls) == 3  # the turn with a format error has no command block, so no tool call
    assert json.loads(calls[0]["tool_calls"][0]["function"]["arguments"])["command"].startswith("grep -rn")
    tool_msgs = [m for m in msgs if m["role"] == "tool"]
    assert len(tool_msgs) == 3 and len(tool_msgs[0]["content"]) > 20_000  # long observation kept whole
    assert r.patch == samples.PATCH and r.cost_usd == pytest.approx(0.0831)


@pytest.mark.parametrize("function_calling", [True, False])
def test_swe_agent(tmp_path, wh, function_calling):
    f = tmp_path / "acme__billing-1042.traj"
    f.write_text(json.dumps(samples.swe_agent_traj(function_calling)))
    s = ingest([f], wh)
    assert s.accepted == 1, s.as_dict()
    r = _rows(wh).iloc[0]
    msgs = orjson.loads(r.messages)
    assert [m["role"] for m in msgs[:3]] == ["system", "user", "assistant"]
    assert r.n_tool_calls == 4 and r.n_turns == 4
    assert r.prompt_tokens == 18233 and r.completion_tokens == 911
    assert r.latency_s == pytest.approx(0.41 + 0.22 + 0.9 + 0.3)
    assert r.patch == samples.PATCH


def test_atif_parallel_calls_and_token_ids(tmp_path, wh):
    f = tmp_path / "session.json"
    f.write_text(json.dumps(samples.atif_traj()))
    assert ingest([f], wh).accepted == 1
    r = _rows(wh).iloc[0]
    msgs = orjson.loads(r.messages)
    first = next(m for m in msgs if m.get("tool_calls"))
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["search", "read_file"]  # parallel calls
    assert first["token_ids"] == [151644, 872, 198, 3838, 374]
    assert first["reasoning_content"].startswith("Two searches")
    assert [m["tool_call_id"] for m in msgs if m["role"] == "tool"] == ["t1", "t2", "t3"]
    assert r.agent_id == "terminus-2/2.0.0/qwen3-coder-30b" and r.task_id == "acme/billing#1042"
    assert (r.prompt_tokens, r.completion_tokens) == (11320, 105) and r.cost_usd == pytest.approx(0.0123)
    assert str(r.started_at).startswith("2026-11-02 09:00:00") and r.patch == samples.PATCH


@pytest.mark.parametrize("packed", ["plain", "gzip", "gzip-members", "utf-16"])
def test_swebench_predictions_join_reports(tmp_path, wh, packed):
    """Predictions given alone find the reports beside them, whether the predictions file is
    plain, gzipped (in one member or in many small ones, whose decoded pieces are sniffed
    together) or UTF-16 (each is read decoded)."""
    import gzip

    preds, reports = samples.swebench_predictions()
    text = "".join(json.dumps(p) + "\n" for p in preds)
    name = {"plain": "preds.jsonl", "gzip": "preds.jsonl.gz", "gzip-members": "preds.jsonl.gz", "utf-16": "preds.jsonl"}[packed]
    raw = text.encode()
    data = {"plain": raw, "gzip": gzip.compress(raw), "utf-16": text.encode("utf-16"),
            "gzip-members": b"".join(gzip.compress(raw[i:i + 50]) for i in range(0, len(raw), 50))}[packed]
    (tmp_path / name).write_bytes(data)
    for inst, rep in reports.items():
        d = tmp_path / "logs" / inst
        d.mkdir(parents=True)
        (d / "report.json").write_text(json.dumps(rep))
    s = ingest([tmp_path / name], wh, )  # reports are found beside the predictions
    assert (s.read, s.accepted, s.reports_joined) == (3, 3, 2)
    df = _rows(wh).set_index("task_id")
    assert bool(df.loc["astropy__astropy-12907"].tests_passed) is True
    assert bool(df.loc["sympy__sympy-20590"].tests_passed) is False
    assert df.loc["django__django-11099"].tests_passed is None or str(df.loc["django__django-11099"].tests_passed) in ("<NA>", "None", "nan")
    extra = orjson.loads(df.loc["sympy__sympy-20590"].extra)
    assert extra["report"]["tests_status"]["FAIL_TO_PASS"]["failure"] == ["test_immutable"]
    assert df.loc["astropy__astropy-12907"].repo == "astropy/astropy"


def test_batch_attribution_flags_and_sidecar(tmp_path, wh):
    d = tmp_path / "landing" / "harness"
    d.mkdir(parents=True)
    (d / "_batch.yaml").write_text("tenant_id: initech\nconsent_id: C-INITECH\n")
    (d / "s.json").write_text(json.dumps(samples.atif_traj()))
    (tmp_path / "other.traj.json").write_text(json.dumps(samples.mini_swe_agent_traj()))
    ingest([tmp_path / "landing"], wh)
    from ratchet.ingest import IngestOptions
    ingest([tmp_path / "other.traj.json"], wh, IngestOptions(tenant_id="acme", consent_id="C-ACME"))
    got = {r.source_format: (r.tenant_id, r.consent_id) for r in _rows(wh).itertuples()}
    assert got == {"atif": ("initech", "C-INITECH"), "mini_swe_agent": ("acme", "C-ACME")}


def test_sidecar_ids_yaml_reads_as_numbers_or_dates_stay_text(tmp_path, wh):
    from ratchet.synth import trajectory

    rec = trajectory(0, __import__("random").Random(0))
    rec["tenant_id"] = rec["consent_id"] = None
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "_batch.yaml").write_text("tenant_id: 12345\nconsent_id: 2026-09-01\n")
    (tmp_path / "a" / "t.jsonl").write_bytes(orjson.dumps(rec) + b"\n")
    assert ingest([tmp_path / "a"], wh).accepted == 1
    assert [(r.tenant_id, r.consent_id) for r in _rows(wh).itertuples()] == [("12345", "2026-09-01")]
    (tmp_path / "a" / "_batch.yaml").write_text("tenant_id: [acme]\n")
    with pytest.raises(ValueError, match="tenant_id must be a string"):
        ingest([tmp_path / "a"], wh)


def test_sidecar_states_acceptance_for_logs_that_carry_none(tmp_path, wh):
    """SWE-agent and ATIF logs have no acceptance field; a curated folder's `accepted:` fills it on
    the general and the fast (native) path alike, and a record's own value wins."""
    from ratchet.synth import trajectory

    ok, bad = tmp_path / "accepted", tmp_path / "failed"
    for d, flag in ((ok, "true"), (bad, "false")):
        d.mkdir()
        (d / "_batch.yaml").write_text(f"tenant_id: globex\nconsent_id: C-G\naccepted: {flag}\n")
    (ok / "a.traj").write_text(json.dumps(samples.swe_agent_traj()))
    (bad / "s.json").write_text(json.dumps(samples.atif_traj()))
    own, unset = trajectory(0, __import__("random").Random(0)), trajectory(1, __import__("random").Random(1))
    own["outcome"]["accepted"], unset["outcome"]["accepted"] = False, None
    (ok / "n.jsonl").write_bytes(orjson.dumps(own) + b"\n" + orjson.dumps(unset) + b"\n")
    # the same two cases in a JSON array: the general path
    own2, unset2 = trajectory(2, __import__("random").Random(2)), trajectory(3, __import__("random").Random(3))
    own2["outcome"]["accepted"], unset2["outcome"]["accepted"] = False, None
    (ok / "arr.json").write_bytes(orjson.dumps([own2, unset2]))
    assert ingest([tmp_path], wh).accepted == 6
    got = {(r.source_format, r.trajectory_id): r.accepted for r in _rows(wh).itertuples()}
    assert got == {("swe_agent", _rows(wh, "source_format = 'swe_agent'").trajectory_id[0]): True,
                   ("atif", _rows(wh, "source_format = 'atif'").trajectory_id[0]): False,
                   ("openai_chat", own["trajectory_id"]): False, ("openai_chat", unset["trajectory_id"]): True,
                   ("openai_chat", own2["trajectory_id"]): False, ("openai_chat", unset2["trajectory_id"]): True}
    (ok / "_batch.yaml").write_text("tenant_id: globex\naccepted: maybe\n")
    with pytest.raises(ValueError, match="accepted must be true or false"):
        ingest([tmp_path], wh)


def test_sidecar_says_when_runs_without_timestamps_ended(tmp_path, wh):
    """SWE-agent files carry no timestamps, and consent counts such a record as expired; the
    folder's `ended_at:` fills it (general and fast path), a record's own timestamps win."""
    import datetime

    from ratchet.synth import trajectory

    d = tmp_path / "swe"
    d.mkdir()
    (d / "_batch.yaml").write_text("tenant_id: globex\nconsent_id: C-G\nended_at: 2026-12-01\n")
    (d / "a.traj").write_text(json.dumps(samples.swe_agent_traj()))
    (d / "s.json").write_text(json.dumps(samples.atif_traj()))
    bare, own = trajectory(0, __import__("random").Random(0)), trajectory(1, __import__("random").Random(1))
    bare["started_at"] = bare["ended_at"] = None
    (d / "n.jsonl").write_bytes(orjson.dumps(bare) + b"\n" + orjson.dumps(own) + b"\n")
    assert ingest([tmp_path], wh).accepted == 4
    got = {r.trajectory_id: r.ended_at for r in _rows(wh).itertuples()}
    midnight = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
    swe = _rows(wh, "source_format = 'swe_agent'").trajectory_id[0]
    atif = _rows(wh, "source_format = 'atif'").trajectory_id[0]
    assert got[swe] == midnight and got[bare["trajectory_id"]] == midnight
    assert got[atif] != midnight and got[own["trajectory_id"]] == datetime.datetime.fromisoformat(
        own["ended_at"].replace("Z", "+00:00"))
    (d / "_batch.yaml").write_text("tenant_id: globex\nended_at: soon\n")
    with pytest.raises(ValueError, match="ended_at must be a date or an ISO 8601 timestamp"):
        ingest([tmp_path], wh)


def test_parquet_export_reingests_as_duplicates(tmp_path, wh):
    from ratchet.synth import write_jsonl

    write_jsonl(tmp_path / "a.jsonl", 30)
    assert ingest([tmp_path / "a.jsonl"], wh).accepted == 30
    with wh.connect() as con:
        con.execute(f"COPY (SELECT * FROM trajectories) TO '{tmp_path / 'export.parquet'}' (FORMAT parquet)")
    s = ingest([tmp_path / "export.parquet"], wh)
    assert (s.read, s.accepted, s.duplicates) == (30, 0, 30)  # same content, same ids


def test_a_records_own_tenant_and_consent_win_over_the_folders(tmp_path, wh):
    """A folder's `_batch.yaml` fills attribution a record lacks and never overrides one it has,
    on the fast path (JSONL lines of the native contract) and the general one (a JSON array file)."""
    from ratchet.synth import trajectory

    d = tmp_path / "landing"
    d.mkdir()
    (d / "_batch.yaml").write_text("tenant_id: globex\nconsent_id: C-G\n")
    recs = [trajectory(i, __import__("random").Random(i)) for i in range(4)]
    for r in recs:
        r["tenant_id"], r["consent_id"] = "acme", "C-A"
    recs[1]["tenant_id"] = recs[1]["consent_id"] = None
    recs[3]["tenant_id"] = recs[3]["consent_id"] = None
    (d / "lines.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs[:2]))
    (d / "array.json").write_bytes(orjson.dumps(recs[2:]))
    assert ingest([d], wh).accepted == 4
    got = {r.trajectory_id: (r.tenant_id, r.consent_id) for r in _rows(wh).itertuples()}
    assert got == {recs[0]["trajectory_id"]: ("acme", "C-A"), recs[1]["trajectory_id"]: ("globex", "C-G"),
                   recs[2]["trajectory_id"]: ("acme", "C-A"), recs[3]["trajectory_id"]: ("globex", "C-G")}
