"""Build and verify the repair tasks of one HumanEval problem (runs inside a pool worker)."""
from __future__ import annotations

import ast
import difflib
import hashlib
from collections import Counter

from sandboxes.bundle import DEFAULT_FORBIDDEN, Limits, TaskBundle
from sandboxes.humaneval.issue import write_issue
from sandboxes.humaneval.mutate import code_lines, entry_function, mutants
from sandboxes.humaneval.operators import Edit, all_edits
from sandboxes.humaneval.runner import run_program
from sandboxes.humaneval.testgen import SOLUTION_FILE, TEST_FILE, generate_tests

ENVIRONMENT_ID = "env://ratchet-humaneval-repair@v1"
GENERATOR_VERSION = "humaneval-repair/9"    # 9: bash and str_replace_editor in the tool allowlist (new digests)
# How mutants are verified; keys the disk cache but is not written into tasks: a rule that gives the
# same suite on a quiet machine keeps every task digest, while a cache a busy machine built under an
# older rule is rebuilt. 2: slow or timed-out mutants are decided by the line budget alone.
VERIFY_RULES = 2
# Deterministic work limit: line events in solution.py per program. Untraced Python runs at most
# ~60M lines/s here, so a run finishing in FAST_S untraced is always within LINE_BUDGET.
LINE_BUDGET = 4_000_000
FAST_S = 0.05
# CPU seconds for a traced run: a backstop for loops whose lines grow ever costlier (big ints),
# which are timeouts whatever the limit. It must stay far above the slowest run that ends within
# LINE_BUDGET (2.8 CPU s traced here, HumanEval/75): at 3 s it rejected such runs on a slower or
# busier CPU (CI; two build workers on one core's threads) and gave another seed-0 suite.
BACKSTOP_S = 10.0
FORBIDDEN = tuple(dict.fromkeys((TEST_FILE, *DEFAULT_FORBIDDEN)))
# CPU seconds per test in an episode (`Limits.test_cpu_s`). The slowest test of any canonical
# solution or planted mutant of the seed-0 suite uses 0.43 CPU s under line tracing (localize's
# coverage run; HumanEval/75), untraced runs a tenth of that: 2 s is ~5x the worst correct test,
# and a candidate fix that makes the function loop fails after 2 s instead of holding the run to
# limits.wall_s (30 s).
TEST_CPU_S = 2.0


def _length_bucket(n: int) -> str:
    return "short" if n <= 5 else "medium" if n <= 12 else "long"


def _fail_bucket(n_fail: int, n_tests: int) -> str:
    return "all" if n_fail == n_tests else "most" if n_fail * 2 > n_tests else "few"


def fix_in_candidates(mutated: str, line: int, canonical: str) -> bool:
    """The quick-fix list of the faulty line must contain the edit that restores the canonical."""
    return any(e.apply(mutated) == canonical for e in all_edits(mutated, lines={line}))


def build_problem(problem: dict, *, seed: int, per_problem: int) -> dict:
    """Verify the canonical solution, then plant and verify mutants until `per_problem` survive.

    Returns {"problem_id", "tasks": [bundle dicts], "generated", "tried", "rejected": Counter,
    "unsampled", "dropped": reason | None}.
    """
    pid, fn = problem["task_id"], problem["entry_point"]
    res = {"problem_id": pid, "tasks": [], "generated": 0, "tried": 0, "rejected": Counter(),
           "unsampled": 0, "dropped": None}
    canonical = problem["prompt"] + problem["canonical_solution"]
    tests = generate_tests(problem["test"], fn)
    if not tests.names:
        res["dropped"] = "no_tests"
        return res
    base = run_program(canonical, tests.source, tests.names, per_test_s=5.0, total_s=60.0)
    if base["status"] != "ok" or any(base["outcomes"].get(n) != "passed" for n in tests.names):
        res["dropped"] = "canonical_fails"
        return res
    per_test_s = 0.5
    func = entry_function(ast.parse(canonical), fn)
    n_lines = code_lines(canonical, func)
    edits = mutants(canonical, fn, seed=seed, key=pid)
    res["generated"] = len(edits)
    for edit in edits:
        if len(res["tasks"]) >= per_problem:
            res["unsampled"] += 1
            continue
        res["tried"] += 1
        reason, task = _verify_mutant(problem, canonical, tests, edit, per_test_s, n_lines, seed)
        if reason:
            res["rejected"][reason] += 1
        else:
            res["tasks"].append(task)
    return res


def _verify_mutant(problem, canonical, tests, edit: Edit, per_test_s, n_lines, seed):
    mutated = edit.apply(canonical)
    fix = edit.inverse()
    if fix.apply(mutated) != canonical:
        return "fix_not_exact", None
    if not fix_in_candidates(mutated, fix.line, canonical):
        return "fix_not_in_candidates", None
    run = run_program(mutated, tests.source, tests.names, examples=tests.examples,
                      per_test_s=per_test_s, total_s=5.0)
    if run["status"] == "timeout" or (run["status"] == "ok" and run["seconds"] > FAST_S):
        # Slow or looping: the deterministic line budget decides. An untraced timeout is not final:
        # its CPU limit is time, and a mutant near it timed out on one machine and not another.
        run = run_program(mutated, tests.source, tests.names, examples=tests.examples,
                          per_test_s=BACKSTOP_S, total_s=BACKSTOP_S, line_budget=LINE_BUDGET)
    if run["status"] != "ok":
        return run["status"], None  # "timeout" (e.g. a loop that never ends) or "crash"
    failing = [n for n in tests.names if run["outcomes"].get(n) != "passed"]
    if not failing:
        return "equivalent", None
    return None, _task(problem, canonical, mutated, tests, edit, fix, failing, run, n_lines, seed)


def _task(problem, canonical, mutated, tests, edit, fix, failing, run, n_lines, seed) -> dict:
    pid, fn = problem["task_id"], problem["entry_point"]
    num = int(pid.split("/")[1])
    digest = hashlib.sha256(mutated.encode()).hexdigest()[:10]
    node = {n: f"{TEST_FILE}::{n}" for n in tests.names}
    title, body = write_issue(
        fn, failing=[node[n] for n in failing], n_tests=len(tests.names), actual=run["actual"],
        assert_text=tests.asserts[failing[0]], error=run["errors"].get(failing[0]),
        pick=int(digest, 16))
    fix_diff = "".join(difflib.unified_diff(
        mutated.splitlines(keepends=True), canonical.splitlines(keepends=True),
        f"a/{SOLUTION_FILE}", f"b/{SOLUTION_FILE}"))
    line_text = mutated.splitlines()[edit.line - 1]
    bundle = TaskBundle(
        task_id=f"humaneval-{num:03d}-{digest}",
        files={SOLUTION_FILE: mutated, TEST_FILE: tests.source},
        issue_title=title, issue_body=body,
        fail_to_pass=tuple(node[n] for n in failing),
        pass_to_pass=tuple(node[n] for n in tests.names if n not in failing),
        forbidden_paths=FORBIDDEN, environment_id=ENVIRONMENT_ID, limits=Limits(test_cpu_s=TEST_CPU_S),
        repo=f"humaneval/{pid}", issue_id=f"HE-{num:03d}-{digest}",
        metadata={
            "problem_id": pid, "entry_point": fn,
            "root_cause": {"file": SOLUTION_FILE, "function": fn, "line": edit.line,
                           "col": edit.col, "end_col": edit.col + len(edit.new),
                           "operator": edit.kind, "family": edit.family,
                           "original": edit.old, "mutated": edit.new,
                           "line_text": line_text.strip()},
            "fix": {"file": SOLUTION_FILE, **fix.to_dict()},
            "fix_diff": fix_diff,
            "slices": {"operator_family": edit.family, "length_bucket": _length_bucket(n_lines),
                       "fail_bucket": _fail_bucket(len(failing), len(tests.names))},
            "n_tests": len(tests.names), "function_lines": n_lines,
            "generator": {"version": GENERATOR_VERSION, "seed": seed},
        },
    )
    return bundle.to_dict()
