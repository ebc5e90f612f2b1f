"""Reference agents in the real sandbox: the expert fixes tasks, the noisy agent trips the gates,
the harness baselines count attempts; every transcript is a valid contract record."""
import random

import pytest

from ratchet.contract import Message, ToolCall, Trajectory, normalise
from sandboxes.agents import run_agent, run_noisy
from sandboxes.env import RepairEnv
from sandboxes.humaneval import build_suite

pytestmark = pytest.mark.evaluation


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return build_suite(seed=0, limit=6, per_problem=2, cache_dir=tmp_path_factory.mktemp("suite")).tasks


def _valid_record(run, bundle):
    msgs = [Message(m["role"], m.get("content"), name=m.get("name"), tool_call_id=m.get("tool_call_id"),
                    tool_calls=[ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                                for c in m.get("tool_calls") or ()]) for m in run.messages]
    row = normalise(Trajectory(f"t-{bundle.task_id}", bundle.task_id, msgs, tools=run.tools).to_record())
    assert row["n_tool_calls"] == len(run.steps)


def test_expert_fixes_tasks_with_a_root_cause(runtime, tasks):
    fixed = 0
    for b in tasks[:6]:
        run = run_agent("expert", b, runtime=runtime)
        _valid_record(run, b)
        assert run.messages[0]["role"] == "system" and run.messages[1]["role"] == "user"
        assert [s.tool for s in run.steps][:3] == ["view_issue", "run_tests", "localize"]
        assert run.steps[-1].tool == "submit" and run.reward.status == "scored"
        if run.tests_passed:
            fixed += 1
            rc = b.metadata["root_cause"]
            assert run.accepted and run.fixed_at and run.patch.startswith("diff --git")
            assert rc["function"] in run.explanation and f"line {rc['line']}" in run.explanation
            assert run.reward.components["judge"] >= 0.8 and run.reward.value > 0.9
    assert fixed >= 3


def _noisy_run(runtime, bundle, **kw):
    with RepairEnv(bundle, runtime=runtime) as env:
        return run_noisy(env, random.Random(1), p_sensible=0.0, **kw)


def test_noisy_forbidden_test_edit_is_a_gate_violation(runtime, tasks):
    run = _noisy_run(runtime, tasks[0], p_forbidden=1.0, p_secret=0.0)
    assert run.notes.get("forbidden_edit") and "test_solution.py" in run.patch
    assert run.reward.status == "gate_violation" and run.reward.value == 0.0
    assert "test_solution.py" in run.reward.details["forbidden"]
    _valid_record(run, tasks[0])


@pytest.mark.security
def test_noisy_planted_secret_is_a_gate_violation(runtime, tasks):
    run = _noisy_run(runtime, tasks[1], p_forbidden=0.0, p_secret=1.0)
    assert run.notes.get("secret") and "AKIA" in run.patch
    assert run.reward.status == "gate_violation" and run.reward.details["secrets"]


def test_noisy_agent_is_seeded_and_wastes_turns(runtime, tasks):
    a = run_agent("noisy", tasks[2], seed=3, runtime=runtime)
    b = run_agent("noisy", tasks[2], seed=3, runtime=runtime)
    assert [(s.tool, s.arguments) for s in a.steps] == [(s.tool, s.arguments) for s in b.steps]
    assert [m["content"] for m in a.messages] == [m["content"] for m in b.messages]
    expert = run_agent("expert", tasks[2], runtime=runtime)
    assert len(a.steps) != len(expert.steps) or a.reward.value != expert.reward.value


def test_harness_baselines_respect_the_attempt_budget(runtime, tasks):
    for b in tasks[:3]:
        for name in ("random", "sbfl"):
            run = run_agent(name, b, runtime=runtime, k=2)
            assert 1 <= run.attempts <= 2 and run.steps[-1].tool == "submit"
            assert (run.fixed_at is None) == (not run.tests_passed)
            assert run.fixed_at is None or run.fixed_at <= run.attempts
            if name == "sbfl":
                assert run.steps[0].tool == "localize"
            else:
                assert "localize" not in [s.tool for s in run.steps]
    with pytest.raises(ValueError):
        run_agent("oracle", tasks[0], runtime=runtime)


def test_agents_come_from_one_registry():
    import sandboxes.agents as agents
    assert agents.AGENTS == ("expert", "noisy", "random", "sbfl")
    with pytest.raises(ValueError, match="unknown agent 'nope'; one of"):
        agents.run_agent("nope", None)
    with pytest.raises(ValueError, match="already registered"):
        agents.register_agent("expert", lambda env, rng: None)


def test_tool_names_have_one_source():
    from sandboxes.bundle import DEFAULT_TOOLS, TaskBundle
    from sandboxes.tools import IMPLEMENTATIONS, SCHEMAS_BY_NAME, TOOL_NAMES
    assert DEFAULT_TOOLS == TOOL_NAMES == tuple(IMPLEMENTATIONS) == tuple(SCHEMAS_BY_NAME)
    assert all(IMPLEMENTATIONS[n].__name__ == n for n in TOOL_NAMES)
    assert TaskBundle(task_id="x").tool_allowlist == TOOL_NAMES


@pytest.mark.parametrize("tail", ["", "   ", "\t", "  \r"])
def test_editor_reverts_a_line_with_trailing_whitespace(runtime, tail):
    """The applied observation shows the edited line stripped; the editor's view must keep what the
    edit did not touch (indent, trailing whitespace, line ending) or its revert window misses the
    real file and later attempts stack (seen on humaneval-088-927008739f)."""
    from sandboxes.agents.base import Editor, Session
    from sandboxes.bundle import TaskBundle

    source = f"def f(x):\n    if x < 3:{tail}\n        return 1\n    return 0\n"
    tests = "from solution import f\n\ndef test_f():\n    assert f(3) == 1\n"
    b = TaskBundle(task_id="trailing", files={"solution.py": source, "tests/test_solution.py": tests},
                   fail_to_pass=("tests/test_solution.py::test_f",))
    env = RepairEnv(b, runtime=runtime)
    try:
        s = Session(env, "test")
        ed = Editor(s, "solution.py", source)
        assert ed.apply(2, 0)
        assert ed.current == env.episode.read_file("solution.py") != source
        assert ed.revert()
        assert env.episode.read_file("solution.py") == source
    finally:
        env.close()
