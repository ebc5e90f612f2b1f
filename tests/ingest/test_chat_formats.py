"""Anthropic Messages logs and OpenAI's legacy function calls are read as formats of their own
(calls, results, system prompt, usage), and a ShareGPT observation that follows several calls
answers all of them."""
import json
from pathlib import Path

import orjson

from ratchet import adapters
from ratchet.ingest import ingest

FIXTURES = Path(__file__).parent / "fixtures"


def _rows(wh):
    with wh.connect() as con:
        cur = con.execute("SELECT * FROM trajectories ORDER BY trajectory_id")
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_anthropic_messages_fixture_keeps_calls_results_system_and_usage(wh):
    s = ingest([FIXTURES / "anthropic_messages.jsonl"], wh)
    assert (s.read, s.accepted, s.quarantined) == (2, 2, 0) and s.by_format == {"anthropic_messages": 2}
    parallel, thinking = _rows(wh)
    assert parallel["trajectory_id"] == "msg_01Aq9w938a90dw8q"
    msgs = orjson.loads(parallel["messages"])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert parallel["prompt_text"] == ("You are a weather assistant. Answer in one sentence.\n"
                                       "What's the weather and the time in San Francisco?")
    calls = msgs[2]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"] and parallel["n_tool_calls"] == 2
    assert json.loads(calls[0]["function"]["arguments"]) == {"location": "San Francisco, CA", "unit": "celsius"}
    assert msgs[2]["content"] == "I'll check both at once."
    assert [(m["tool_call_id"], m["content"]) for m in msgs[3:5]] == [
        ("toolu_01A09q90qw90lq917835lq9", "15 degrees, partly cloudy"), ("toolu_01B19r01rx01mr028946mr0", "14:05 PDT")]
    assert (parallel["prompt_tokens"], parallel["completion_tokens"]) == (812, 96)
    extra = orjson.loads(parallel["extra"])
    assert extra["usage"]["service_tier"] == "standard" and extra["model"] == "claude-sonnet-4-5"
    assert extra["stop_reason"] == "end_turn"
    tools = orjson.loads(parallel["tools"])
    assert tools[0]["function"]["name"] == "get_weather" and tools[0]["function"]["parameters"]["required"] == ["location"]

    msgs = orjson.loads(thinking["messages"])
    assert msgs[0]["content"][0]["cache_control"] == {"type": "ephemeral"}  # system blocks kept as given
    assert thinking["prompt_text"] == "You are a careful code reviewer.\nIs src/pagination.py off by one?"
    assert msgs[2]["reasoning_content"] == "I should read the file before answering."
    assert msgs[2]["thinking_signature"].startswith("EqQB") and msgs[2]["content"] is None
    assert msgs[3]["is_error"] is False and msgs[3]["tool_call_id"] == msgs[2]["tool_calls"][0]["id"]
    assert thinking["prompt_tokens"] == 1320 + 1024  # input + cache creation + cache read


def test_anthropic_detection_and_a_bare_message_array():
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]
    assert adapters.detect({"messages": msgs}) == "anthropic_messages"
    assert adapters.detect(msgs) == "anthropic_messages"
    assert adapters.detect({"system": "s", "messages": msgs[:1]}) == "anthropic_messages"
    assert adapters.detect({"messages": msgs[:1], "usage": {"input_tokens": 3, "output_tokens": 1}}) == "anthropic_messages"
    assert adapters.detect({"messages": msgs[:1]}) == "openai_messages"          # plain text: either reads the same


def test_anthropic_array_file_and_text_after_results(tmp_path, wh):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "run it"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py", "is_error": True},
                                         {"type": "text", "text": "and now?"}]},
            {"role": "assistant", "content": "done"}]
    (tmp_path / "conv.json").write_text(json.dumps(msgs))
    s = ingest([tmp_path / "conv.json"], wh)
    assert (s.accepted, s.by_format) == (1, {"anthropic_messages": 1})
    got = orjson.loads(_rows(wh)[0]["messages"])
    assert [(m["role"], m["content"]) for m in got] == [
        ("user", "run it"), ("assistant", None), ("tool", "a.py"), ("user", "and now?"), ("assistant", "done")]
    assert got[2]["is_error"] is True


def test_openai_legacy_function_calls(wh):
    s = ingest([FIXTURES / "openai_legacy_functions.jsonl"], wh)
    assert (s.read, s.accepted, s.quarantined) == (2, 2, 0), s.as_dict()
    assert s.by_format == {"openai_functions": 2}
    rows = sorted(_rows(wh), key=lambda r: r["n_tool_calls"])
    msgs = orjson.loads(rows[0]["messages"])
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "get_current_weather",
                                                    "arguments": "{\"location\": \"Boston, MA\"}"}
    assert msgs[2]["role"] == "tool" and msgs[2]["tool_call_id"] == msgs[1]["tool_calls"][0]["id"]
    assert msgs[2]["name"] == "get_current_weather"
    assert orjson.loads(rows[0]["tools"])[0]["function"]["name"] == "get_current_weather"
    assert rows[1]["n_tool_calls"] == 2 and rows[1]["n_turns"] == 3


def test_legacy_function_answer_without_a_call_is_an_orphan(tmp_path, wh):
    rec = {"messages": [{"role": "user", "content": "x"}, {"role": "function", "name": "f", "content": "y"}]}
    (tmp_path / "o.jsonl").write_text(json.dumps(rec) + "\n")
    s = ingest([tmp_path / "o.jsonl"], wh)
    assert s.quarantine_reasons == {"orphan_tool_result": 1}


def test_sharegpt_observation_after_two_calls_answers_both(tmp_path, wh):
    calls = [{"name": "weather", "arguments": {"city": "Paris"}}, {"name": "weather", "arguments": {"city": "Rome"}}]
    one = {"conversations": [{"from": "human", "value": "Paris and Rome?"},
                             {"from": "function_call", "value": json.dumps(calls)},
                             {"from": "observation", "value": "[{\"t\": 14}, {\"t\": 19}]"},
                             {"from": "gpt", "value": "14 and 19."}]}
    two = {"conversations": one["conversations"][:3] + [{"from": "observation", "value": "{\"t\": 19}"},
                                                        one["conversations"][3]]}
    (tmp_path / "s.jsonl").write_text(json.dumps(one) + "\n" + json.dumps(two) + "\n")
    s = ingest([tmp_path / "s.jsonl"], wh)
    assert (s.accepted, s.quarantined) == (2, 0)
    tools = sorted(([m for m in orjson.loads(r["messages"]) if m["role"] == "tool"] for r in _rows(wh)),
                   key=lambda ms: ms[1]["content"])
    shared, own = tools  # one observation for both calls / one observation each
    assert [m["tool_call_id"] for m in shared] == ["call_1_0", "call_1_1"]
    assert {m["content"] for m in shared} == {"[{\"t\": 14}, {\"t\": 19}]"}
    assert all(m["observation_shared_by"] == 2 for m in shared)
    assert [(m["tool_call_id"], "observation_shared_by" in m) for m in own] == [("call_1_0", False), ("call_1_1", False)]
