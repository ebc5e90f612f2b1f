"""QuixBugs (tests/fixtures/quixbugs: 40 programs, MIT, upstream 4257f44) as a SWE-bench-style
source run through the real sandbox: each buggy program fails its own tests, each reference fix
passes them, and a program that never returns is the agent's failure, not the infrastructure's.
The subset here covers each kind of task (a loop forever, a graph suite with PASS_TO_PASS tests,
a skipped case); bench/quixbugs.py checks all 40."""
import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures import quixbugs as qb

SUBSET = ("bitcount", "breadth_first_search", "knapsack")
# bench/quixbugs.py runs qb.LIMITS (test_cpu_s 4: levenshtein's correct version needs over a CPU
# second for one case); none of the subset does, so a loop costs one CPU second here
LIMITS = {**qb.LIMITS, "test_cpu_s": 1}


def test_the_fixture_is_the_40_programs_with_their_source_and_licence(tmp_path):
    rows = qb.instances()
    names = sorted(r["instance_id"].removeprefix("quixbugs__") for r in rows)
    upstream = sorted(p.stem for p in (qb.HERE / "repo" / "python_programs").glob("*.py") if p.stem != "node")
    assert len(rows) == 40 and names == upstream
    assert "MIT" in (qb.HERE / "LICENSE").read_text()
    assert "https://github.com/jkoppel/QuixBugs" in (qb.HERE / "README.md").read_text()
    # upstream's correct programs are not copied: each fix exists only as its instance's patch
    assert not list((qb.HERE / "repo").rglob("correct_python_programs"))
    assert sorted(r["instance_id"] for r in rows if r["loops"]) == [f"quixbugs__{n}" for n in sorted(qb.LOOPING)]
    jsonl, repos = qb.materialize(tmp_path)
    repo = repos / "jkoppel__QuixBugs"

    def git(*args, stdin=None):
        return subprocess.run(["git", "-C", str(repo), *args], input=stdin, text=True, check=True,
                              capture_output=True).stdout.strip()

    # one base commit per program, holding its own bug and every other program fixed
    assert len({r["base_commit"] for r in rows}) == 40
    for r, other in zip(rows, rows[1:] + rows[:1]):
        prog = f"python_programs/{r['instance_id'].removeprefix('quixbugs__')}.py"
        assert [ln[6:] for ln in r["patch"].splitlines() if ln.startswith("+++ ")] == [prog]
        git("checkout", "-q", r["base_commit"])
        git("apply", "--check", "-", stdin=r["patch"])
        git("apply", "--check", "-R", "-", stdin=other["patch"])
    assert len(jsonl.read_text().splitlines()) == 40


def test_buggy_fails_fixed_passes_and_a_loop_is_the_agents_failure(tmp_path, runtime):
    from ratchet.task_sources import load_source, parse_sources, reference_episodes

    jsonl, repos = qb.materialize(tmp_path, SUBSET)
    spec, = parse_sources([{"kind": "swebench", "path": str(jsonl), "repos": str(repos), "limits": LIMITS}])
    loaded = load_source(spec, lambda: runtime)
    assert [(r.task, r.reason, r.detail) for r in loaded.rejections] == []
    assert sorted(b.task_id for b in loaded.bundles) == sorted(f"quixbugs__{n}" for n in SUBSET)
    for b in loaded.bundles:
        r = reference_episodes(runtime, b)
        seen = {k: (v.status, v.details.get("resolved")) for k, v in r.items()}
        assert seen == {"buggy": ("scored", False), "fixed": ("scored", True)}, (b.task_id, seen, r["buggy"].reasons)
        assert r["fixed"].value > 0 and r["buggy"].value == 0.0


def test_a_program_that_never_returns_fails_inside_the_tasks_limits(tmp_path, runtime):
    """bitcount's bug (n ^= n - 1) loops for ever: the test run ends on the per-test CPU limit,
    the tests fail, and the verification says nothing about the infrastructure."""
    from ratchet.task_sources import parse_sources, source_tasks
    from sandboxes.verify import verify

    jsonl, repos = qb.materialize(tmp_path, ["bitcount"])
    spec, = parse_sources([{"kind": "swebench", "path": str(jsonl), "repos": str(repos), "limits": LIMITS}])
    (bundle, _), = source_tasks(spec)
    with runtime.episode(bundle) as ep:
        v = verify(runtime, bundle, ep)
    test = "python_testcases/test_bitcount.py::test_bitcount"
    # the first case is ended by the CPU limit, the rest with it: an error, never an outcome-less run
    assert v.infra_error is None and v.agent_fault is None and v.outcomes[test] in ("failed", "error")
    assert not v.timed_out and v.duration_s < bundle.limits.verify_s
