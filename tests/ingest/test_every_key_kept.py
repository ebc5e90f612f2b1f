"""Every key a source has is mapped to a column or kept, at every level, in every format; the
content id covers all of it; and a warehouse export re-ingests to the same ids.

Each format's record carries marker keys (`x_<where>`) with unique values at every level it
has (top level, nested objects, messages, steps, calls, results, metrics, ...). The checks:
every marker key and value is in the stored row; every key name of the source is in the stored
row or is one the format maps to a column (MAPPED, the documented mapping); two records that
differ only in one marker's value are two records, not a duplicate; and Parquet and JSON
exports of the rows re-ingest as duplicates of themselves."""
import json
import re

import orjson
import pytest

from ratchet.ingest import ingest

PATCH = "diff --git a/x.py b/x.py\n"


def _native():
    return {
        "trajectory_id": "n-1", "task_id": "t-1", "tenant_id": "acme", "consent_id": "C1", "x_top": "v_top",
        "messages": [{"role": "system", "content": "sys", "x_msg": "v_msg"},
                     {"role": "user", "content": "fix it"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "x_call": "v_call",
                          "function": {"name": "bash", "arguments": "{}", "x_fn": "v_fn"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "x_usage": "v_usage",
                  "prompt_tokens_details": {"cached_tokens": 1}},
        "outcome": {"tests_passed": True, "reward": 0.75, "x_outcome": "v_outcome"},
        "deliverable": {"patch": PATCH, "x_deliverable": "v_deliverable"},
        "environment": {"id": "env", "image": "python:3.12", "x_env": "v_env"},
        "approvals": [{"step": 1, "approver": "a", "decision": "approved", "at": "2026-11-01T10:00:00Z",
                       "x_approval": "v_approval"}],
        "cost_usd": 0.5,                                # flat key beside its nested object: kept
        "extra": {"x_extra": "v_extra"},
    }


def _openai_messages():
    return {"id": "om-1", "x_top": "v_top", "parallel_tool_calls": False,
            "messages": [{"role": "user", "content": "hi", "x_msg": "v_msg"},
                         {"role": "assistant", "content": "hello", "weight": 1}],
            "usage": {"prompt_tokens": 3, "x_usage": "v_usage"}}


def _sharegpt():
    return {"conversations": [
        {"from": "human", "value": "weather?", "x_msg": "v_msg"},
        {"from": "function_call", "value": json.dumps([{"name": "w", "arguments": {"c": "a"}, "x_call": "v_call"},
                                                       {"name": "w", "arguments": {"c": "b"}}])},
        {"from": "observation", "value": "[1, 2]"},
        {"from": "gpt", "value": "sunny"}],
        "system": "be brief", "tools": json.dumps([{"name": "w"}]), "x_top": "v_top"}


def _message_list():
    return [{"role": "user", "content": "q", "x_msg": "v_msg"}, {"role": "assistant", "content": "a"}]


def _openai_functions():
    return {"x_top": "v_top", "functions": [{"name": "w", "parameters": {}}],
            "messages": [{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": None,
                          "function_call": {"name": "w", "arguments": "{}", "x_call": "v_call"}},
                         {"role": "function", "name": "w", "content": "sunny", "x_msg": "v_msg"}]}


def _anthropic():
    return {"model": "claude-x", "x_top": "v_top", "system": [{"type": "text", "text": "be brief",
                                                                 "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "w", "description": "d", "input_schema": {"type": "object"}, "x_tool": "v_tool"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "sig"},
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "tu1", "name": "w", "input": {"c": "a"}, "x_call": "v_call"}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "tu1", "content": "sunny", "is_error": False,
                     "x_result": "v_result"},
                    {"type": "text", "text": "thanks"}], "x_msg": "v_msg"}],
            "usage": {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 2, "x_usage": "v_usage"}}


def _mini_swe_agent():
    return {"trajectory_format": "mini-swe-agent-1.1", "instance_id": "a__b-1", "x_top": "v_top",
            "info": {"exit_status": "Submitted", "submission": PATCH, "mini_version": "2.0",
                     "model_stats": {"instance_cost": 0.1, "api_calls": 2, "x_stats": "v_stats"},
                     "x_info": "v_info"},
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "task", "x_msg": "v_msg"},
                         {"role": "assistant", "content": "```mswea_bash_command\nls\n```",
                          "extra": {"actions": [{"command": "ls", "x_action": "v_action"}], "cost": 0.1}},
                         {"role": "user", "content": "a.py", "extra": {"returncode": 0, "timestamp": 1.0}},
                         {"role": "exit", "content": "", "extra": {"exit_status": "Submitted", "x_exit": "v_exit"}}]}


def _swe_agent_steps():
    steps = [{"thought": "look", "action": "ls", "observation": "a.py", "response": "look\n```\nls\n```",
              "state": '{"open_file": "n/a"}', "execution_time": 0.1, "query": [{"role": "system", "content": "s"}],
              "extra_info": {}, "x_step": "v_step"}]
    history = [{"role": "system", "content": "s", "agent": "main", "message_type": "system_prompt"},
               {"role": "user", "content": "task", "agent": "main", "message_type": "observation", "x_msg": "v_msg"},
               {"role": "assistant", "content": "look\n```\nls\n```", "agent": "main", "message_type": "action"},
               {"role": "user", "content": "OBSERVATION:\na.py", "agent": "main", "message_type": "observation"}]
    return {"trajectory": steps, "history": history, "environment": "swe_main", "replay_config": "{}",
            "x_top": "v_top",
            "info": {"submission": PATCH, "exit_status": "submitted", "swe_agent_version": "1.1",
                     "edited_files30": "a.py", "x_info": "v_info",
                     "model_stats": {"instance_cost": 0.1, "tokens_sent": 5, "tokens_received": 1, "api_calls": 1,
                                     "x_stats": "v_stats"}}}


def _swe_agent_calls():
    rec = _swe_agent_steps()
    rec["history"] = rec["history"][:2] + [
        {"role": "assistant", "content": "look", "thought": "look", "action": "ls", "agent": "main",
         "message_type": "action", "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "content": "a.py", "tool_call_ids": ["c1"], "agent": "main", "message_type": "observation"}]
    return rec


def _swe_agent_history_only():
    rec = _swe_agent_steps()
    del rec["trajectory"]
    rec["history"][2]["action"] = "ls"
    return rec


def _atif():
    return {
        "schema_version": "ATIF-v1.4", "session_id": "s-1", "x_top": "v_top",
        "continued_trajectory_ref": {"session_id": "s-2", "trajectory_path": "next.json"},
        "agent": {"name": "terminus", "version": "2", "model_name": "m", "extra": {"x_agent": "v_agent"}},
        "steps": [
            {"step_id": 1, "timestamp": "2026-11-02T09:00:00Z", "source": "user", "message": "task", "x_step": "v_step"},
            {"step_id": 2, "timestamp": "2026-11-02T09:00:01Z", "source": "agent", "message": "go",
             "model_name": "m", "extra": {"x_step_extra": "v_step_extra"},
             "tool_calls": [{"tool_call_id": "t1", "function_name": "f", "arguments": {}, "x_call": "v_call"}],
             "observation": {"results": [
                 {"source_call_id": "t1", "content": "done", "x_result": "v_result"},
                 {"subagent_trajectory_ref": [{"session_id": "sub-1", "trajectory_path": "sub.json"}]}],
                 "x_obs": "v_obs"},
             "metrics": {"prompt_tokens": 3, "completion_tokens": 1, "cost_usd": 0.01, "cached_tokens": 1,
                         "completion_token_ids": [1, 2], "x_metric": "v_metric"}}],
        "final_metrics": {"total_prompt_tokens": 3, "total_completion_tokens": 1, "total_cost_usd": 0.01,
                          "total_steps": 2, "x_final": "v_final"},
        "notes": "n", "extra": {"task_id": "task-1", "patch": PATCH, "x_extra": "v_extra"},
    }


def _swebench():
    return {"instance_id": "a__b-1", "model_name_or_path": "m", "model_patch": PATCH, "x_top": "v_top"}


# what each format maps to a column (or to the contract's form) instead of keeping by name
COMMON = {"trajectory_id", "task_id", "tenant_id", "consent_id", "messages", "role", "content", "tool_calls",
          "tool_call_id", "id", "type", "function", "name", "arguments", "tools", "extra", "usage", "outcome",
          "deliverable", "environment", "approvals", "step", "approver", "decision", "at", "patch", "tests_passed",
          "prompt_tokens", "completion_tokens", "cost_usd"}
FORMATS = {
    "openai_chat": (_native, "n.jsonl", set()),
    "openai_messages": (_openai_messages, "om.jsonl", set()),
    "sharegpt": (_sharegpt, "sg.jsonl", {"conversations", "from", "value", "system"}),
    "message_list": (_message_list, "ml.json", set()),
    "openai_functions": (_openai_functions, "of.jsonl", {"function_call", "functions", "parameters"}),
    "anthropic_messages": (_anthropic, "an.jsonl", {"system", "input", "input_schema", "tool_use_id", "thinking",
                                                    "signature", "input_tokens", "output_tokens", "text"}),
    "mini_swe_agent": (_mini_swe_agent, "a__b-1.traj.json", {"info", "submission", "model_stats", "instance_cost",
                                                            "instance_id"}),
    "swe_agent/steps": (_swe_agent_steps, "a.traj", {"trajectory", "history", "info", "submission", "model_stats",
                                                    "instance_cost", "tokens_sent", "tokens_received", "thought",
                                                    "action", "observation", "swe_agent_version"}),
    "swe_agent/calls": (_swe_agent_calls, "b.traj", {"trajectory", "history", "info", "submission", "model_stats",
                                                    "instance_cost", "tokens_sent", "tokens_received", "observation",
                                                    "swe_agent_version"}),
    "swe_agent/history": (_swe_agent_history_only, "c.traj", {"history", "info", "submission", "model_stats",
                                                             "instance_cost", "tokens_sent", "tokens_received",
                                                             "swe_agent_version"}),
    "atif": (_atif, "s.json", {"schema_version", "session_id", "agent", "steps", "source", "message", "function_name",
                              "source_call_id", "completion_token_ids", "results", "final_metrics", "version",
                              "model_name", "total_prompt_tokens", "total_completion_tokens", "total_cost_usd"}),
    "swebench_prediction": (_swebench, "p.jsonl", {"instance_id", "model_name_or_path", "model_patch"}),
}


def _keys(obj, out: set) -> set:
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(k)
            _keys(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _keys(v, out)
    return out


def _markers(obj, out: dict) -> dict:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str) and k.startswith("x_"):
                out[k] = v
            _markers(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _markers(v, out)
    elif isinstance(obj, str) and obj.startswith(("[", "{")):  # markers inside JSON text (ShareGPT calls)
        try:
            _markers(json.loads(obj), out)
        except ValueError:
            pass
    return out


def _stored(row: dict) -> object:
    """The stored row with its JSON columns parsed (tool arguments too)."""
    out = dict(row)
    for k in ("messages", "tools", "approvals", "extra"):
        if out.get(k):
            out[k] = orjson.loads(out[k])
    for m in out.get("messages") or []:
        for c in m.get("tool_calls") or []:
            try:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            except (TypeError, ValueError):
                pass
    return out


def _write(tmp_path, name: str, rec) -> object:
    f = tmp_path / name
    f.write_bytes(orjson.dumps(rec) + (b"\n" if name.endswith(".jsonl") else b""))
    return f


def _rows(wh, where: str = "true") -> list[dict]:
    with wh.connect() as con:
        cur = con.execute(f"SELECT * FROM trajectories WHERE {where} ORDER BY record_id")
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_source_key_is_in_the_stored_row(tmp_path, wh, fmt):
    build, name, mapped = FORMATS[fmt]
    rec = build()
    s = ingest([_write(tmp_path, name, rec)], wh)
    assert (s.accepted, s.quarantined) == (1, 0), s.as_dict()
    assert list(s.by_format) == [fmt.split("/")[0]]
    row = _stored(_rows(wh)[0])
    stored_keys = _keys(row, set(row))
    stored_markers = _markers(row, {})
    want = _markers(rec, {})
    assert want
    for k, v in want.items():
        assert stored_markers.get(k) == v, (k, v, stored_markers.get(k))
    missing = _keys(rec, set()) - stored_keys - COMMON - mapped
    assert not missing, f"{fmt}: source keys absent from the stored row: {sorted(missing)}"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_records_that_differ_only_in_one_kept_key_are_not_duplicates(tmp_path, wh, fmt):
    build, name, _ = FORMATS[fmt]
    base = build()
    text = json.dumps(base)
    # (a marker inside JSON text, as in ShareGPT's calls, ends with an escaped quote)
    variants = [base] + [json.loads(re.sub(rf'(?<="){v}(?=\\?")', f"{v}-changed", text))
                         for v in _markers(base, {}).values()]
    paths = []
    for i, rec in enumerate(variants):  # each differs from the first in one marker's value only
        (tmp_path / str(i)).mkdir()
        paths.append(_write(tmp_path / str(i), name, rec))
    s = ingest(paths, wh)
    assert (s.read, s.accepted, s.duplicates) == (len(variants), len(variants), 0), s.as_dict()
    again = ingest(paths[:1], wh)
    assert (again.read, again.duplicates) == (1, 1)


def test_warehouse_export_reingests_to_the_same_content_ids(tmp_path, wh):
    d = tmp_path / "in"
    d.mkdir()
    for fmt, (build, name, _) in FORMATS.items():
        (d / fmt.replace("/", "_")).mkdir()
        _write(d / fmt.replace("/", "_"), name, build())
    first = ingest([d], wh)
    assert (first.accepted, first.quarantined) == (len(FORMATS), 0), first.as_dict()
    ids = sorted(r["record_id"] for r in _rows(wh))
    for kind in ("parquet", "json"):
        out = tmp_path / f"export.{'parquet' if kind == 'parquet' else 'jsonl'}"
        with wh.connect() as con:
            con.execute(f"COPY (SELECT * FROM trajectories) TO '{out}' (FORMAT {kind})")
        s = ingest([out], wh)
        assert (s.read, s.accepted, s.quarantined, s.duplicates) == (len(FORMATS), 0, 0, len(FORMATS)), (
            kind, s.as_dict())
    assert sorted(r["record_id"] for r in _rows(wh)) == ids
