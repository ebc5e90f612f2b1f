"""The Policy interface: requests validate, completions and tool calls round-trip, the registry
makes every id in the eval contract (or says why not)."""
import json

import pytest

from ratchet.policy import (Completion, GenerationRequest, Policy, ToolCall, engine_names, format_tool_call,
                            make_policy, parse_tool_calls, register_engine)

pytestmark = pytest.mark.training


def test_request_validates_and_normalises():
    r = GenerationRequest([{"role": "user", "content": "x"}], stop="STOP")
    assert r.stop == ("STOP",) and r.n == 1 and r.temperature == 0.0
    for bad in ({"n": 0}, {"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            GenerationRequest([], **bad)


def test_tool_call_parsing_round_trip():
    args = {"path": "solution.py", "line": 3, "index": 0}
    text = "Trying a fix.\n" + format_tool_call("apply_edit", args)
    content, calls = parse_tool_calls(text)
    assert content == "Trying a fix." and [(c.name, c.arguments) for c in calls] == [("apply_edit", args)]
    assert json.loads(calls[0].raw) == args
    _, bare = parse_tool_calls('{"name": "run_tests", "arguments": {}}')
    assert [(c.name, c.arguments) for c in bare] == [("run_tests", {})]
    assert parse_tool_calls("no call here") == ("no call here", [])
    # broken arguments stay raw (the env answers them with an error), never silently dropped
    bad = ToolCall.from_raw("read_file", '{"path": "solution.py')
    assert bad.arguments is None and bad.raw == '{"path": "solution.py'
    assert bad.openai()["function"]["arguments"] == '{"path": "solution.py'


def test_completion_round_trips_and_renders_a_message():
    c = Completion("Reading.", [ToolCall.from_raw("read_file", {"path": "a.py"})], "stop", 12, 3, 0.5,
                   [5, 6, 7], [-0.1, -0.2, -0.3], [1, 2], None)
    again = Completion.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c
    msg = c.message()
    assert msg["role"] == "assistant" and msg["content"] == "Reading."
    assert msg["tool_calls"][0]["id"] == "call_0"
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"path": "a.py"}
    f = Completion.failed("server down")
    assert f.finish_reason == "error" and f.error == "server down" and not f.tool_calls


def test_registry_makes_contract_ids_and_rejects_unknown():
    for pid, agent in (("harness:random", "random"), ("harness:sbfl", "sbfl"), ("scripted:expert", "expert"),
                       ("scripted:noisy", "noisy")):
        p = make_policy(pid)
        assert isinstance(p, Policy) and p.policy_id == pid and p.spec["config"]["agent"] == agent
    assert make_policy("harness:sbfl", k=2).spec["config"]["k"] == 2
    o = make_policy("openai:some-model", base_url="http://127.0.0.1:9/v1")
    assert o.policy_id == "openai:some-model" and o.spec["engine"] == "openai_http"
    with pytest.raises(ValueError, match="unknown engine"):
        make_policy("nope:x")
    with pytest.raises(ValueError, match="<engine>:<name>"):
        make_policy("harness")
    with pytest.raises(ValueError, match="no agent"):
        make_policy("harness:telepathy")
    with pytest.raises(FileNotFoundError, match="never the hub"):
        make_policy("hf:Qwen/Qwen2.5-0.5B-Instruct")          # a hub id is not a local folder
    assert {"harness", "scripted", "hf", "embedded", "openai"} <= set(engine_names())


def test_register_engine_adds_a_prefix_once():
    class Echo:
        spec = {}

        def __init__(self, name, policy_id):
            self.policy_id, self.name = policy_id, name

        def generate(self, requests):
            return [[Completion(self.name)] * r.n for r in requests]

    if "echo-test" not in engine_names():
        register_engine("echo-test", Echo)
    with pytest.raises(ValueError, match="already registered"):
        register_engine("echo-test", Echo)
    p = make_policy("echo-test:hi")
    assert p.generate([GenerationRequest([], n=2)]) == [[Completion("hi"), Completion("hi")]]
