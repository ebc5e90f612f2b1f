"""The harness baselines and scripted agents as policies: driven by the policy runner they make
the same calls, see the same observations and earn the same reward as `run_agent`."""
import pytest

from ratchet.policy import GenerationRequest, make_policy, run_policy_episode
from ratchet.policy.engines.harness import DivergedHistory
from sandboxes.agents import run_agent

pytestmark = pytest.mark.training


@pytest.mark.parametrize("pid,agent,seed", [("harness:sbfl", "sbfl", 0), ("harness:random", "random", 3),
                                            ("scripted:expert", "expert", 0), ("scripted:noisy", "noisy", 1)])
def test_policy_run_reproduces_the_agent_run(runtime, tasks, pid, agent, seed):
    b = tasks[0]
    ref = run_agent(agent, b, seed=seed, runtime=runtime)
    rec = run_policy_episode(make_policy(pid), b, seed=seed, runtime=runtime)
    assert rec.messages == ref.messages                     # every call, thought and observation
    assert [t.tool_calls[0]["name"] for t in rec.turn_records] == [s.tool for s in ref.steps]
    assert rec.reward == ref.reward.value and rec.status == ref.reward.status
    assert rec.passed == ref.accepted and rec.turns == len(ref.steps) == rec.tool_calls
    assert rec.outcome == ("pass" if ref.accepted else "fail") and rec.policy_id == pid
    assert rec.tokens_in == rec.tokens_out == 0 and rec.turn_records[0].completion_ids is None


def test_harness_policy_is_deterministic_and_seeded(runtime, tasks):
    b = tasks[1]
    a = run_policy_episode(make_policy("harness:random"), b, seed=5, runtime=runtime)
    again = run_policy_episode(make_policy("harness:random"), b, seed=5, runtime=runtime)
    other = run_policy_episode(make_policy("harness:random"), b, seed=6, runtime=runtime)
    assert a.messages == again.messages
    calls = lambda r: [m.get("tool_calls") for m in r.messages if m["role"] == "assistant"]
    assert calls(a) != calls(other)


def test_a_conversation_from_another_agent_is_refused(runtime, tasks):
    ref = run_agent("expert", tasks[0], runtime=runtime)      # starts view_issue, run_tests, ...
    req = GenerationRequest(ref.messages[:6], metadata={"task_id": tasks[0].task_id, "max_turns": 30})
    with pytest.raises(DivergedHistory, match="localize"):
        make_policy("harness:sbfl").generate([req])          # sbfl would have called localize first
    with pytest.raises(ValueError, match="task_id"):
        make_policy("harness:sbfl").generate([GenerationRequest(ref.messages[:2])])
