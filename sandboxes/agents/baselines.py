"""Harness baselines with no learned weights, each with an attempt budget k.

random candidate edit: a random code line of the function named in the issue, a random quick fix
    on it (no pair twice); SBFL-guided: the most suspicious line first, its candidates in order.
An attempt = apply one candidate + run the tests; a failed attempt is undone. `fixed_at` is the
1-based attempt that made every test pass, so first-try and within-k rates come from one run.
"""
from __future__ import annotations

import random

from sandboxes.agents.base import (
    AgentRun,
    Editor,
    Session,
    enclosing_function,
    function_lines,
    issue_function,
)
from sandboxes.agents.expert import explain
from sandboxes.observations import (
    parse_candidates,
    parse_file_list,
    parse_localize,
    parse_source,
    tests_all_passed,
)

RANDOM_ID = "baseline-random-edit@v1"
SBFL_ID = "baseline-sbfl@v1"


def _attempt(s: Session, editor: Editor, line: int, index: int, desc: str, source: str) -> bool:
    s.attempts += 1
    if not editor.apply(line, index, f"Attempt {s.attempts}: candidate [{index}] on line {line}."):
        return False
    if tests_all_passed(s.call("run_tests", {}, "Running the tests.")):
        s.fixed_at = s.attempts
        text = source.splitlines()[line - 1]
        s.submit(explain(enclosing_function(source, line), editor.path, line, desc, text))
        return True
    editor.revert()
    return False


def _give_up(s: Session) -> AgentRun:
    if not s.done:
        s.submit("No attempt within the budget made the tests pass.", "Budget spent.")
    return s.finish()


def _target_file(s: Session, issue: str) -> str:
    files = [f for f in parse_file_list(s.call("list_files", {}, "Listing the repository."))
             if f.endswith(".py") and not f.rsplit("/", 1)[-1].startswith("test_")]
    for f in files:
        if f in issue:
            return f
    return files[0] if files else "solution.py"


def run_random(env, rng: random.Random, k: int = 4) -> AgentRun:
    s = Session(env, RANDOM_ID)
    issue = s.messages[-1]["content"]
    path = _target_file(s, issue)
    source = parse_source(s.call("read_file", {"path": path}, f"Reading {path}."))
    lines = function_lines(source, issue_function(issue, source))
    editor, cands, tried = Editor(s, path, source), {}, set()
    while s.attempts < k and lines and not s.done:
        line = rng.choice(lines)
        if line not in cands:
            cands[line] = parse_candidates(s.call("propose_edits", {"path": path, "line": line},
                                                  f"Quick fixes for line {line}?"))
        left = [c for c in cands[line] if (line, c[0]) not in tried]
        if not left:
            lines.remove(line)
            continue
        index, desc = rng.choice(left)
        tried.add((line, index))
        if _attempt(s, editor, line, index, desc, source):
            return s.finish()
    return _give_up(s)


def run_sbfl(env, k: int = 4, top: int = 10) -> AgentRun:
    s = Session(env, SBFL_ID)
    ranked = parse_localize(s.call("localize", {"top": top}, "Ranking suspicious lines."))
    if not ranked:
        return _give_up(s)
    path = ranked[0][0]
    source = parse_source(s.call("read_file", {"path": path}, f"Reading {path}."))
    return try_ranked(s, path, source, ranked, k)


def try_ranked(s, path: str, source, ranked, k: int):
    """SBFL's loop: each ranked line of `path` in order, each of its candidates, until a fix passes
    or `k` attempts are spent (shared by the harness variants in ratchet.evaluation.variants)."""
    editor = Editor(s, path, source)
    for file, line, _ in ranked:
        if s.attempts >= k or s.done:
            break
        if file != path:
            continue
        for index, desc in parse_candidates(s.call("propose_edits", {"path": path, "line": line},
                                                   f"Quick fixes for line {line}?")):
            if s.attempts >= k or s.done:
                break
            if _attempt(s, editor, line, index, desc, source):
                return s.finish()
    return _give_up(s)
