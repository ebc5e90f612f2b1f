import orjson
import pytest

from ratchet.contract import SCHEMA_VERSION, Message, RecordError, ToolCall, Trajectory, normalise


def _traj(**kw):
    base = dict(trajectory_id="t-1", task_id="task-1", tenant_id="acme", consent_id="C-1", messages=[
        Message("system", "sys"), Message("user", "fix the bug"),
        Message("assistant", "look", tool_calls=[ToolCall("c1", "read_file", {"path": "a.py"}),
                                                 ToolCall("c2", "search", {"q": "x"})], token_ids=[1, 2, 3]),
        Message("tool", "content of a.py", tool_call_id="c1"), Message("tool", "3 hits", tool_call_id="c2"),
        Message("assistant", "done")], started_at="2026-11-01T10:00:00Z", ended_at="2026-11-01T10:01:00Z",
        cost_usd=0.01, latency_s=60.0)
    base.update(kw)
    return Trajectory(**base)


def test_typed_model_round_trips_through_normalise():
    rec = _traj().to_record()
    assert rec["schema_version"] == SCHEMA_VERSION
    row = normalise(orjson.loads(orjson.dumps(rec)))
    assert row["trajectory_id"] == "t-1" and row["tenant_id"] == "acme"
    assert (row["n_messages"], row["n_turns"], row["n_tool_calls"]) == (6, 2, 2)
    msgs = orjson.loads(row["messages"])
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path":"a.py"}'}
    assert msgs[2]["token_ids"] == [1, 2, 3]  # token ids survive (no retokenisation drift)
    assert row["prompt_text"] == "sys\nfix the bug"
    assert row["started_at"].isoformat() == "2026-11-01T10:00:00+00:00"


def test_record_id_is_a_content_hash():
    a = normalise(_traj().to_record())
    b = normalise(_traj().to_record())
    c = normalise(_traj(cost_usd=0.02).to_record())
    assert a["record_id"] == b["record_id"] != c["record_id"]
    assert len(a["record_id"]) == 64


def test_unknown_fields_are_kept_in_extra():
    rec = {**_traj().to_record(), "harness_build": "4.2.0"}
    row = normalise(rec)
    assert orjson.loads(row["extra"])["harness_build"] == "4.2.0"


def test_dict_arguments_become_openai_json_strings():
    rec = _traj().to_record()
    rec["messages"][2]["tool_calls"][0]["function"]["arguments"] = {"path": "b.py"}
    row = normalise(rec)
    assert orjson.loads(row["messages"])[2]["tool_calls"][0]["function"]["arguments"] == '{"path":"b.py"}'


@pytest.mark.badinput
@pytest.mark.parametrize("mutate, code", [
    (lambda r: r.pop("trajectory_id"), "missing_id"),
    (lambda r: r.update(task_id="  "), "missing_id"),
    (lambda r: r.update(messages={"role": "user"}), "wrong_type"),
    (lambda r: r["messages"].append({"role": "robot", "content": "x"}), "bad_role"),
    (lambda r: r["messages"].append({"role": "tool", "tool_call_id": "zzz", "content": "x"}), "orphan_tool_result"),
    (lambda r: r["messages"].append({"role": "tool", "tool_call_id": "c1", "content": "again"}), "orphan_tool_result"),
    (lambda r: r.update(started_at="yesterday"), "bad_timestamp"),
    (lambda r: r["usage"].update(cost_usd="cheap"), "wrong_type"),
    (lambda r: r["usage"].update(latency_s=-1), "out_of_range"),
    (lambda r: r["outcome"].update(accepted="yes"), "wrong_type"),
    (lambda r: r.update(ended_at="2026-11-01T09:00:00Z"), "out_of_range"),
    (lambda r: r["messages"][2].update(token_ids=[1, "2"]), "wrong_type"),
    (lambda r: r.update(schema_version="ratchet.trajectory/v9"), "unsupported_version"),
])
def test_contract_violations_have_stable_codes(mutate, code):
    rec = _traj().to_record()
    mutate(rec)
    with pytest.raises(RecordError) as e:
        normalise(rec)
    assert e.value.code == code
    assert e.value.detail  # a human-readable reason
