"""The OpenAI-compatible HTTP engine against a tiny local HTTP server standing in for a served
model (StandinServer: a remote LLM API cannot run here): tool calls, usage and cost, retries on
429/500 with backoff and Retry-After, timeouts, and failures that come back as infra failures."""
import json
import time

import pytest

from ratchet.policy import GenerationRequest, make_policy
from tests.policy.standin_server import StandinServer, chat_reply

pytestmark = pytest.mark.training

REQ = GenerationRequest([{"role": "user", "content": "fix it"}], tools=[{"type": "function", "function": {
    "name": "run_tests", "parameters": {"type": "object", "properties": {}}}}], seed=4, max_tokens=64,
    stop=("</s>",))


def _policy(url, **kw):
    kw = {"backoff_s": 0.01, "timeout_s": 2.0, "price_in_per_mtok": 2.0, "price_out_per_mtok": 8.0, **kw}
    return make_policy("openai:standin-model", base_url=url, api_key="sk-test", **kw)


def test_tool_calls_usage_and_cost():
    reply = chat_reply("Running the tests.", [("run_tests", "{}"), ("read_file", '{"path": "a.py"')],
                       prompt_tokens=1000, completion_tokens=250)
    with StandinServer([(200, reply, {}, 0)]) as srv:
        p = _policy(srv.url)
        [[c]] = p.generate([REQ])
    sent = srv.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer sk-test"
    body = sent["body"]
    assert (body["model"], body["seed"], body["max_tokens"], body["stop"]) == ("standin-model", 4, 64, ["</s>"])
    assert body["tools"] == REQ.tools and body["messages"] == REQ.messages
    assert c.text == "Running the tests." and c.finish_reason == "tool_calls"
    assert [(t.name, t.arguments, t.id) for t in c.tool_calls] == [("run_tests", {}, "call_0"),
                                                                   ("read_file", None, "call_1")]
    assert c.tool_calls[1].raw == '{"path": "a.py"'          # broken JSON kept for the env to answer
    assert (c.prompt_tokens, c.completion_tokens) == (1000, 250)
    assert c.cost_usd == pytest.approx((1000 * 2.0 + 250 * 8.0) / 1e6)
    assert c.token_ids is None and c.latency_s > 0


def test_server_reported_cost_and_n_choices_share_usage():
    with StandinServer([(200, chat_reply("a", prompt_tokens=10, completion_tokens=7, cost=0.003, n=2), {}, 0)]) as srv:
        [cs] = _policy(srv.url).generate([GenerationRequest([{"role": "user", "content": "x"}], n=2)])
    assert len(cs) == 2 and [c.completion_tokens for c in cs] == [4, 3]
    assert sum(c.cost_usd for c in cs) == pytest.approx(0.003) and all(c.prompt_tokens == 10 for c in cs)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retries_then_succeeds(status):
    err = {"error": {"message": "busy"}}
    headers = {"Retry-After": "0.2"} if status == 429 else {}
    with StandinServer([(status, err, headers, 0), (status, err, headers, 0), (200, chat_reply("ok"), {}, 0)]) as srv:
        p = _policy(srv.url, max_retries=3)
        t0 = time.monotonic()
        [[c]] = p.generate([REQ])
        took = time.monotonic() - t0
    assert c.text == "ok" and c.error is None and len(srv.requests) == 3 and p.attempts == 3
    if status == 429:                                         # waited as the server asked, twice
        assert took >= 0.4


def test_timeout_is_retried_and_then_fails_as_an_infra_error():
    with StandinServer([(200, chat_reply("late"), {}, 1.5), (200, chat_reply("on time"), {}, 0)]) as srv:
        [[c]] = _policy(srv.url, timeout_s=0.3, max_retries=2).generate([REQ])
    assert c.text == "on time" and len(srv.requests) == 2
    with StandinServer([(200, chat_reply("late"), {}, 1.0)]) as srv:
        t0 = time.monotonic()
        [[c]] = _policy(srv.url, timeout_s=0.2, max_retries=1).generate([REQ])
    assert c.finish_reason == "error" and "timed out" in c.error.lower() and "2 attempts" in c.error
    assert len(srv.requests) == 2 and time.monotonic() - t0 < 1.5


def test_client_errors_are_not_retried_and_batches_run_concurrently():
    with StandinServer([(400, {"error": {"message": "bad model"}}, {}, 0)]) as srv:
        [[c]] = _policy(srv.url, max_retries=5).generate([REQ])
    assert c.finish_reason == "error" and "HTTP 400" in c.error and "bad model" in c.error
    assert len(srv.requests) == 1
    with StandinServer([(200, chat_reply("x"), {}, 0.3)]) as srv:
        t0 = time.monotonic()
        out = _policy(srv.url, max_concurrency=8).generate([REQ] * 6)
        took = time.monotonic() - t0
    assert [o[0].text for o in out] == ["x"] * 6 and took < 6 * 0.3
    assert json.loads(json.dumps(srv.requests[0]["body"]))["n"] == 1
