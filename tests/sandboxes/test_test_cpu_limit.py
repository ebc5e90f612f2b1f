"""Limits.test_cpu_s: a looping test fails after its own CPU limit instead of holding the whole
run to limits.wall_s, the run stops there (later tests: error), and a looping patch is still the
agent's failure: scored, never a pass, never an infra failure."""
import textwrap
import time

import pytest

from sandboxes.bundle import Limits, TaskBundle

pytestmark = pytest.mark.security

SOL = "def grow(x):\n    return x + 1\n"
LOOP = "def grow(x):\n    while x > 0:\n        x = x + 1 if x < 5 else x\n    return x + 1\n"
TESTS = textwrap.dedent("""\
    from solution import grow

    def test_zero():
        assert grow(0) == 1

    def test_one():
        assert grow(1) == 2

    def test_swallow():
        for _ in range(3):          # code that swallows the timeout keeps getting it
            try:
                grow(2)
            except BaseException:
                pass
        assert grow(-1) == 0

    def test_last():
        assert grow(-2) == -1
    """)
IDS = ("test_solution.py::test_zero", "test_solution.py::test_one", "test_solution.py::test_swallow",
       "test_solution.py::test_last")


def bundle(sol=SOL, **limits):
    return TaskBundle(task_id="t-loop", files={"solution.py": sol, "test_solution.py": TESTS},
                      fail_to_pass=IDS[1:2], pass_to_pass=IDS[:1] + IDS[2:],
                      limits=Limits(**{"wall_s": 20.0, "cpu_s": 30, "test_cpu_s": 0.5, **limits}))


def test_a_looping_test_fails_at_its_cpu_limit_and_stops_the_run(runtime):
    with runtime.episode(bundle(LOOP)) as ep:
        t0 = time.monotonic()
        rep = ep.run_tests()
        took = time.monotonic() - t0
        assert rep.infra_error is None and rep.agent_fault is None and not rep.timed_out
        assert rep.outcomes == {IDS[0]: "passed", IDS[1]: "failed", IDS[2]: "error", IDS[3]: "error"}
        assert rep.test_timeouts == (IDS[1],)
        assert "TestTimeout" in rep.output
        assert took < 10, f"one looping test held the run {took:.1f} s (wall_s is 20)"
        # coverage runs (localize) get the same limit and keep the coverage of what ran
        cov = ep.run_tests(coverage=True)
        assert cov.test_timeouts == (IDS[1],) and cov.outcomes[IDS[0]] == "passed"
        assert cov.coverage[IDS[1]]["solution.py"] >= {2, 3}
        # a test that catches the timeout (bare except) is hit again until it gives up the loop
        sw = ep.run_tests([IDS[2], IDS[3]])
        assert sw.outcomes == {IDS[2]: "failed", IDS[3]: "error"} and sw.test_timeouts == (IDS[2],)
        # correct code in the same worker runs every test
        ep.write_file("solution.py", SOL)
        ok = ep.run_tests()
        assert ok.outcomes == dict.fromkeys(IDS, "passed") and ok.test_timeouts == ()


def test_without_a_per_test_limit_the_run_wall_limit_still_applies(runtime):
    b = bundle(LOOP, wall_s=2.0, cpu_s=30, test_cpu_s=None)
    with runtime.episode(b) as ep:
        rep = ep.run_tests([IDS[1]])
        assert rep.timed_out and rep.outcomes == {IDS[1]: "error"} and rep.test_timeouts == ()


def test_a_looping_patch_is_scored_as_a_failure_never_a_pass_or_infra(runtime):
    from sandboxes.env import RepairEnv

    with RepairEnv(bundle(), runtime=runtime) as env:
        env.reset()
        env.step("write_file", {"path": "solution.py", "content": LOOP})
        obs = env.step("run_tests", {})
        assert "FAILED test_solution.py::test_one" in obs and "TestTimeout" in obs
        t0 = time.monotonic()
        env.step("submit", {"explanation": "grow loops"})
        assert time.monotonic() - t0 < 15          # verify_s is 120: the per-test limit ended it
        r = env.reward
        assert r.status == "scored" and not r.infra_failure
        assert env.tests_passed is False and r.components["tests"] < 1.0
        assert env.final_outcomes[IDS[1]] == "failed"


def test_the_limit_is_part_of_the_environment_digest_only_when_set():
    plain = bundle(test_cpu_s=None)
    assert "test_cpu_s" not in plain.to_dict()["limits"]        # bundles written before it: same digest
    limited = bundle(test_cpu_s=2.0)
    assert limited.to_dict()["limits"]["test_cpu_s"] == 2.0
    assert limited.environment_digest != plain.environment_digest
    assert TaskBundle.from_dict(limited.to_dict()).environment_digest == limited.environment_digest
    with pytest.raises(ValueError, match="test_cpu_s"):
        Limits(test_cpu_s=0)


def test_the_humaneval_suite_sets_the_limit():
    from sandboxes.humaneval.build import TEST_CPU_S
    from sandboxes.humaneval.suite import build_suite

    suite = build_suite(seed=0, limit=1, per_problem=1, cache=False)
    assert suite.tasks and all(t.limits.test_cpu_s == TEST_CPU_S for t in suite.tasks)


def test_the_docker_runtime_enforces_the_same_per_test_limit(docker_runtime):
    with docker_runtime.episode(bundle(LOOP)) as ep:
        rep = ep.run_tests()
        assert rep.infra_error is None and not rep.timed_out
        assert rep.test_timeouts == (IDS[1],) and rep.outcomes[IDS[1]] == "failed"
