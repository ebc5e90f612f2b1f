"""The data verdict (`sandboxes.verdict`): the built-in tasks' tests run in a judge process the
agent's code never ran in, against values that cross as plain data.

Each behaviour is checked in a real bubblewrap sandbox (the `runtime` fixture) and, for the
exploits, on Docker too where an engine runs (`test_reward_integrity.py`).
"""
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sandboxes.bundle import Limits
from sandboxes.verdict import DataPlan, plan_for, sandbox_bundle
from sandboxes.verdict_worker import NotData, decode, encode
from sandboxes.verify import verify

pytestmark = pytest.mark.security
FAST = Limits(wall_s=4, cpu_s=4, verify_s=8, test_cpu_s=0.5)


@pytest.fixture(scope="module")
def he_task():
    from sandboxes.humaneval import build_suite
    return replace(build_suite(seed=0, limit=2, per_problem=1).tasks[0], limits=FAST)


def _fixed(bundle) -> str:
    from sandboxes.verifiers.diffs import apply_diff
    return apply_diff(bundle.files, bundle.metadata["fix_diff"])["solution.py"]


def _verdict(runtime, bundle, solution: str):
    with runtime.episode(bundle) as ep:
        ep.write_file("solution.py", solution)
        return verify(runtime, bundle, ep, timeout=bundle.limits.verify_s)


def _ids(bundle):
    return [*bundle.fail_to_pass, *bundle.pass_to_pass]


# ------------------------------------------------------------------------------- the codec
def test_plain_data_round_trips_with_its_exact_types():
    values = [None, True, False, 0, -7, 1 << 80, -(1 << 70), 2.5, float("inf"), float("-inf"), "",
              "é\ud800", b"\x00\xff", 3 + 4j, [1, [2, (3,)]], (1, "a", None), {1: "a", (2, 3): [4]},
              {1, 2.5, "x"}, frozenset({(1, 2)}), [True, 1, 1.0]]
    for v in values:
        back = decode(encode(v))
        assert back == v and type(back) is type(v), v
    assert [type(x) for x in decode(encode([True, 1, 1.0]))] == [bool, int, float]
    assert math.isnan(decode(encode(float("nan"))))


def test_anything_that_is_not_plain_data_is_refused():
    class Liar(int):
        def __eq__(self, other):
            return True
    lying = type("E", (), {"__eq__": lambda s, o: True})()
    for v in (lying, Liar(3), [1, lying], {"k": Liar(1)}, (x for x in [1]), object(), print):
        with pytest.raises(NotData):
            encode(v)
    for raw in ({"$x": 1}, {"a": 1, "b": 2}, {"$t": "not a list"}, {"$i": 12}, {"$f": "1e400x"}):
        with pytest.raises(NotData):
            decode(raw)


# ------------------------------------------------------------------------------- which tasks
def test_the_builtin_tasks_get_a_plan_and_imported_ones_do_not(he_task, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    import quixbugs
    plan = plan_for(he_task)
    assert isinstance(plan, DataPlan) and plan.functions == (he_task.metadata["entry_point"],)
    assert sorted(plan.node_id(n) for n in plan.test_names) == sorted(_ids(he_task))
    assert "test_solution.py" not in sandbox_bundle(he_task, plan).files
    assert plan_for(quixbugs.bundle("kth", tmp_path)) is None
    assert plan_for(replace(he_task, environment_id="env://elsewhere@v1")) is None
    assert plan_for(replace(he_task, fail_to_pass=("test_solution.py::test_nope",))) is None


# ------------------------------------------------------------------------------- the verdict
def test_the_true_fix_passes_and_the_bug_fails_as_recorded(runtime, he_task):
    ver = _verdict(runtime, he_task, _fixed(he_task))
    assert ver.verdict == "data" and ver.infra_error is None
    assert ver.outcomes == {i: "passed" for i in _ids(he_task)}
    bug = _verdict(runtime, he_task, he_task.files["solution.py"])
    assert {i: o for i, o in bug.outcomes.items()} == \
        {**{i: "failed" for i in he_task.fail_to_pass}, **{i: "passed" for i in he_task.pass_to_pass}}


def test_same_outcomes_as_recorded_on_a_sample_of_the_suite(runtime):
    """The recorded FAIL_TO_PASS / PASS_TO_PASS came from pytest; the data verdict reproduces them,
    for the bug and for the fix (all 1,210 tasks agreed when this was written; a seeded sample
    here, plus the three problems whose tests call a helper of the module: 32, 38, 50)."""
    from sandboxes.humaneval import build_suite
    suite = build_suite(seed=0)
    pick = random.Random(7).sample(suite.tasks, 6)
    pick += [next(t for t in suite.tasks if t.metadata["problem_id"] == p)
             for p in ("HumanEval/32", "HumanEval/38", "HumanEval/50")]
    for t in pick:
        t = replace(t, limits=replace(t.limits, verify_s=20))
        assert _verdict(runtime, t, _fixed(t)).outcomes == {i: "passed" for i in _ids(t)}, t.task_id
        got = _verdict(runtime, t, t.files["solution.py"]).outcomes
        assert got == {**{i: "failed" for i in t.fail_to_pass}, **{i: "passed" for i in t.pass_to_pass}}, t.task_id


def test_an_object_that_equals_anything_fails(runtime, he_task):
    fn = he_task.metadata["entry_point"]
    src = he_task.files["solution.py"] + (
        f"\n\ndef {fn}(*args, **kwargs):\n    return type('E', (), {{'__eq__': lambda s, o: True}})()\n")
    ver = _verdict(runtime, he_task, src)
    assert set(ver.outcomes.values()) == {"failed"} and "not plain data" in ver.output
    sub = he_task.files["solution.py"] + (
        f"\n\nclass Yes(int):\n    def __eq__(self, o):\n        return True\n\n\n"
        f"def {fn}(*args, **kwargs):\n    return Yes(1)\n")
    assert set(_verdict(runtime, he_task, sub).outcomes.values()) == {"failed"}


def test_the_callee_sees_no_test_no_caller_and_no_history(runtime, he_task):
    """The code under test looks for its tests everywhere it could: the calling frames, the test
    file, the snapshot's git history. Nothing is there, so it records what it found as its answer
    and every test fails; the record shows what it saw."""
    fn = he_task.metadata["entry_point"]
    probe = he_task.files["solution.py"] + f'''

def {fn}(*args, **kwargs):
    import os, subprocess, traceback
    frames = [f.filename for f in traceback.extract_stack()]
    files = sorted(os.listdir("."))
    git = subprocess.run(["git", "log", "--all", "--name-only", "--format="], capture_output=True, text=True)
    raise RuntimeError(repr((frames, files, git.stdout, ("cand" + "idate(") in "".join(
        open(f).read() for f in files if f.endswith(".py")))))
'''
    ver = _verdict(runtime, he_task, probe)
    assert set(ver.outcomes.values()) == {"failed"}
    seen = ver.output
    assert "test_solution" not in seen.replace("test_solution.py::test_check", "")
    assert "'solution.py'" in seen and "pytest" not in seen and "False)" in seen


def test_helpers_come_from_the_tasks_own_file(runtime):
    """find_zero's tests check `poly(coeffs, x)` with the module's own `poly`: an agent that also
    rewrites `poly` to return 0 would pass under pytest; the judge uses the task's `poly`."""
    from sandboxes.humaneval import build_suite
    t = next(t for t in build_suite(seed=0).tasks if t.metadata["problem_id"] == "HumanEval/32")
    t = replace(t, limits=replace(t.limits, verify_s=20))
    rigged = t.files["solution.py"] + "\n\ndef poly(xs, x):\n    return 0\n\n\ndef find_zero(xs):\n    return 0.0\n"
    ver = _verdict(runtime, t, rigged)
    assert set(ver.outcomes.values()) == {"failed"}, ver.outcomes


def test_a_loop_fails_at_the_per_test_cpu_limit_and_stops_the_run(runtime, he_task):
    fn = he_task.metadata["entry_point"]
    src = he_task.files["solution.py"] + f"\n\ndef {fn}(*args, **kwargs):\n    while True:\n        pass\n"
    ver = _verdict(runtime, he_task, src)
    first, *rest = sorted(ver.outcomes)
    assert ver.outcomes[first] == "failed" and {ver.outcomes[i] for i in rest} == {"error"}
    assert "per-test CPU limit" in ver.agent_fault and ver.infra_error is None


def test_code_that_ends_its_process_is_the_agents_failure(runtime, he_task):
    for body in ("import os as o\no._exit(0)\n", "import os as o, signal as s\no.kill(o.getpid(), s.SIGKILL)\n",
                 "raise SystemExit(3)\n"):
        ver = _verdict(runtime, he_task, body + he_task.files["solution.py"])
        assert ver.infra_error is None and set(ver.outcomes.values()) <= {"failed", "error"}, body
        assert "passed" not in ver.outcomes.values()


def test_a_module_that_does_not_import_fails_every_test(runtime, he_task):
    ver = _verdict(runtime, he_task, "import no_such_module_here\n" + he_task.files["solution.py"])
    assert set(ver.outcomes.values()) == {"failed"} and "does not import" in ver.output


def test_a_callee_broken_by_the_harness_is_an_infra_failure_not_a_zero(broken_verdict_runtime, he_task):
    """A callee that dies is the agent's failure only if a callee on a harness-owned module still
    works (`verdict.callee_probe`); when the harness's own script is what breaks, it is infra."""
    rt = broken_verdict_runtime
    ver = _verdict(rt, he_task, _fixed(he_task))
    assert ver.outcomes is None and "health probe" in ver.infra_error, ver


def test_a_verdict_is_reused_only_for_exactly_the_same_files(tmp_path, he_task):
    """With the runtime's test-result cache (the holdout evaluation's), the same carried files
    are judged once; other files, and a run that crashed or timed out, are judged again."""
    from sandboxes.runtime import LocalRuntime, SandboxUnavailable
    try:
        rt = LocalRuntime(tmp_path / "rt", test_cache=tmp_path / "cache.sqlite")
    except SandboxUnavailable as e:
        pytest.skip(f"sandbox unavailable: {e}")
    fixed = _fixed(he_task)
    first, again = _verdict(rt, he_task, fixed), _verdict(rt, he_task, fixed)
    assert first.outcomes == again.outcomes == {i: "passed" for i in _ids(he_task)}
    assert (rt.test_cache.hits, first.reused_s, again.reused_s > 0) == (1, 0.0, True)
    assert set(_verdict(rt, he_task, fixed + "\n# another file\n").outcomes.values()) == {"passed"}
    assert rt.test_cache.hits == 1
    crash = "import os as o\no._exit(0)\n" + he_task.files["solution.py"]
    assert _verdict(rt, he_task, crash).agent_fault and _verdict(rt, he_task, crash).agent_fault
    assert rt.test_cache.hits == 1
