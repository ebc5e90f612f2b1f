"""The episode runner: any policy through RepairEnv, one at a time or many at once with batched
generation (same results), exact token ids per assistant turn, and infra failures (a dead model
server, a broken sandbox) recorded as such, never scored."""
import pytest

from ratchet.policy import Sampling, make_policy, run_episodes, run_policy_episode, training_sequence
from ratchet.policy.engines.transformers_engine import TransformersPolicy
from tests.policy.standin_server import StandinServer, chat_reply

pytestmark = pytest.mark.training

SAMPLING = Sampling(temperature=1.0, max_tokens=10)


def test_model_episode_records_turns_tokens_and_a_reward(tiny, runtime, tasks):
    p = TransformersPolicy(*tiny, policy_id="hf:tiny")
    rec = run_policy_episode(p, tasks[0], seed=1, runtime=runtime, max_turns=3, sampling=SAMPLING)
    # a random model writes no valid call: each reply costs a turn, the budget ends the episode,
    # which is then scored as it stands (nothing changed: a fail, not an infra failure)
    assert rec.outcome == "fail" and rec.reward == 0.0 and rec.error is None and not rec.passed
    assert rec.turns == 3 and rec.tool_calls == 0 and len(rec.turn_records) == 3
    assert [m["role"] for m in rec.messages] == ["system", "user"] + ["assistant", "user"] * 3
    assert rec.messages[3]["content"].startswith("error: your reply contained no tool call")
    assert rec.tokens_out == sum(len(t.completion_ids) for t in rec.turn_records) == 30
    assert rec.tokens_in == sum(len(t.prompt_ids) for t in rec.turn_records)
    assert rec.policy_s > 0 and rec.sandbox_s > 0 and rec.latency_s >= rec.policy_s
    seq = training_sequence(rec)
    assert sum(seq["env_mask"]) == 30 and len(seq["completion_ids"]) == len(seq["env_mask"]) == len(seq["logprobs"])
    assert seq["prompt_ids"] == rec.turn_records[0].prompt_ids


def test_batched_runner_equals_one_at_a_time(tiny, runtime, tasks):
    p = TransformersPolicy(*tiny, policy_id="hf:tiny")
    jobs = [(b, s) for b in tasks[:2] for s in (0, 1)]
    alone = [run_policy_episode(p, b, seed=s, runtime=runtime, max_turns=2, sampling=SAMPLING) for b, s in jobs]
    calls = []
    gen = p.generate
    p.generate = lambda reqs: calls.append(len(reqs)) or gen(reqs)        # count batch sizes
    together = run_episodes(p, jobs, concurrency=4, runtime=runtime, max_turns=2, sampling=SAMPLING)
    assert [r.task_id for r in together] == [b.task_id for b, _ in jobs]
    for a, b in zip(alone, together):
        assert a.messages == b.messages and a.reward == b.reward and a.outcome == b.outcome
        assert [t.completion_ids for t in a.turn_records] == [t.completion_ids for t in b.turn_records]
    assert max(calls) > 1                      # the model really generated for several episodes at once


def test_harness_policies_run_concurrently(runtime, tasks):
    jobs = [(b, 0) for b in tasks[:2]]
    recs = run_episodes(make_policy("harness:sbfl"), jobs, concurrency=2, runtime=runtime)
    single = [run_policy_episode(make_policy("harness:sbfl"), b, 0, runtime=runtime) for b, _ in jobs]
    for r, one in zip(recs, single):  # on a mismatch, say which message differs and how
        diff = next((i for i, (m, n) in enumerate(zip(r.messages, one.messages)) if m != n), None)
        assert diff is None and len(r.messages) == len(one.messages), (
            r.task_id, diff, len(r.messages), len(one.messages),
            diff is not None and (r.messages[diff], one.messages[diff]))
    assert all(r.outcome in ("pass", "fail") for r in recs)


def test_dead_model_server_is_an_infra_failure_never_scored(runtime, tasks):
    """A local stand-in for a served model that answers 503 to everything: the episode is an
    infra failure with the reason, no reward, and never a scored zero."""
    with StandinServer([(503, {"error": {"message": "overloaded"}}, {}, 0)]) as srv:
        p = make_policy("openai:standin", base_url=srv.url, max_retries=1, backoff_s=0.01)
        rec = run_policy_episode(p, tasks[0], seed=0, runtime=runtime)
    assert rec.outcome == "infra_failure" and rec.reward is None and rec.status == "infra_failure"
    assert not rec.passed and rec.components == {} and "HTTP 503" in rec.error and "overloaded" in rec.error
    assert rec.tests_passed is None and len(srv.requests) == 2


def test_served_model_drives_the_env(runtime, tasks):
    """The stand-in server plays a model: its tool calls are executed in the real sandbox."""
    script = [(200, chat_reply("Running the tests.", [("run_tests", "{}")], 50, 9), {}, 0),
              (200, chat_reply("Done.", [("submit", '{"explanation": "no idea"}')], 80, 12), {}, 0)]
    with StandinServer(script) as srv:
        p = make_policy("openai:standin", base_url=srv.url, price_in_per_mtok=1.0, price_out_per_mtok=2.0)
        rec = run_policy_episode(p, tasks[0], seed=0, runtime=runtime)
    assert [t.tool_calls[0]["name"] for t in rec.turn_records] == ["run_tests", "submit"]
    assert "failed" in rec.turn_records[0].observations[0]           # a real pytest run in the sandbox
    assert rec.outcome == "fail" and rec.reward == 0.0 and (rec.tokens_in, rec.tokens_out) == (130, 21)
    assert rec.cost_usd == pytest.approx((130 * 1.0 + 21 * 2.0) / 1e6)
    assert srv.requests[1]["body"]["messages"][-1]["role"] == "tool"


class _BrokenSandbox:
    """A real LocalRuntime whose episodes lose their sandbox binary after they start (fault
    injection, as tests/sandboxes/test_runtime.py does): every command is a harness failure."""

    def __init__(self, rt):
        self.rt = rt

    def __getattr__(self, name):
        return getattr(self.rt, name)

    def episode(self, bundle, **kw):
        ep = self.rt.episode(bundle, **kw)
        ep._runner._prefix[0] = "/nonexistent/bwrap"
        return ep


def test_broken_sandbox_is_an_infra_failure_never_scored(runtime, tasks):
    rec = run_policy_episode(make_policy("harness:sbfl"), tasks[0], seed=0, runtime=_BrokenSandbox(runtime))
    assert rec.outcome == "infra_failure" and rec.reward is None and rec.components == {}
    assert "spawn failed" in rec.error and rec.turn_records                 # the policy did act


def test_evaluation_seam(tiny, runtime, tasks, tmp_path):
    """ratchet.evaluation.episodes.run_policy_episode makes the policy from its id and runs it
    through this runner: a learned checkpoint by path, and a dead server as an infra failure."""
    from ratchet.evaluation import episodes

    from dataclasses import replace

    model, tok = tiny
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    task = replace(tasks[0], limits=replace(tasks[0].limits, max_turns=4))     # a short episode
    row = episodes.run_policy_episode("hf:tiny", "", task, 0, runtime=runtime, policy_kwargs={
        "path": str(tmp_path / "ckpt"), "sampling": {"max_tokens": 4, "temperature": 0.5}})
    assert row["policy_id"] == "hf:tiny" and row["outcome"] == "fail" and row["reward"] == 0.0
    assert row["turns"] == 4 and row["tokens_out"] == 4 * 4
    assert row["error"] is None
    with StandinServer([(503, {}, {}, 0)]) as srv:
        bad = episodes.run_policy_episode("openai:standin", "", tasks[0], 0, runtime=runtime,
                                          policy_kwargs={"base_url": srv.url, "max_retries": 0})
    assert bad["outcome"] == "infra_failure" and bad["reward"] is None and "HTTP 503" in bad["error"]
