"""The scripted expert: read the issue, reproduce, localise, try the quick fixes of the most
suspicious lines one by one (re-running the tests, undoing failures), then submit with a
root-cause explanation naming the function, the line and the wrong token."""
from __future__ import annotations

import re

from sandboxes.agents.base import AgentRun, Editor, Session, enclosing_function
from sandboxes.observations import (
    failing_tests,
    parse_candidates,
    parse_localize,
    parse_source,
    tests_all_passed,
)

AGENT_ID = "expert-scripted@v1"
_REPLACE = re.compile(r"replace `(.+?)` with `(.+?)`")


def explain(function: str | None, path: str, line: int, description: str, line_text: str) -> str:
    m = _REPLACE.search(description)
    what = (f"the token `{m.group(1)}` should be `{m.group(2)}`" if m
            else description.split(":")[0].strip())
    fn = f"`{function}`" if function else "the function"
    return (f"Root cause: in {fn} ({path}, line {line}: `{line_text.strip()}`) {what}. "
            f"Fix: {description.split(': `')[0]}; a one-token change, the failing tests now pass "
            f"and no test was modified.")


_NO_TOKENS = re.compile(r"^\s*(def |class |else:|try:|finally:|pass$|break$|continue$|return$|$)")


def _editable(source: str, line: int) -> bool:
    """Skip lines that can carry no single-token fix (a def, `else:`): saves a propose_edits turn."""
    text = source.splitlines()
    return line <= len(text) and not _NO_TOKENS.match(text[line - 1])


def run_expert(env, *, top_lines: int = 10, reserve_turns: int = 2) -> AgentRun:
    s = Session(env, AGENT_ID)
    s.call("view_issue", {}, "Let me read the issue first.")
    obs = s.call("run_tests", {}, "Reproducing: run the test suite.")
    if tests_all_passed(obs):
        s.submit("All tests already pass; no change is needed.", "Nothing fails; submitting no change.")
        return s.finish()
    failing = failing_tests(obs)
    ranked = parse_localize(s.call("localize", {"top": 10}, f"{len(failing)} test(s) fail. "
                                   "Localising the fault from test coverage."))
    if not ranked:
        s.submit("Could not localise the fault: no suspicious lines.", "No lead; giving up.")
        return s.finish()
    path = ranked[0][0]
    source = parse_source(s.call("read_file", {"path": path}, f"Reading {path}."))
    editor = Editor(s, path, source)
    lines = [ln for f, ln, _ in ranked if f == path and _editable(source, ln)]
    for line in lines[:top_lines]:
        if s.done or s.turns_left <= reserve_turns + 3:
            break
        file = path
        cands = parse_candidates(s.call("propose_edits", {"path": file, "line": line},
                                        f"Line {line} is suspicious; listing candidate fixes."))
        for index, desc in cands:
            if s.done or s.turns_left <= reserve_turns + 2:
                break
            s.attempts += 1
            if not editor.apply(line, index, f"Trying candidate [{index}]: {desc}"):
                continue
            res = s.call("run_tests", {}, "Re-running the tests.")
            if tests_all_passed(res):
                s.fixed_at = s.attempts
                text = source.splitlines()[line - 1] if line <= len(source.splitlines()) else ""
                s.submit(explain(enclosing_function(source, line), path, line, desc, text),
                         "All tests pass; submitting with the root cause.")
                return s.finish()
            if not editor.revert():
                break
    if not s.done:
        top = ranked[0]
        s.submit(f"Could not find a passing fix. The most suspicious line is {top[0]} line {top[1]} in "
                 f"`{enclosing_function(source, top[1]) or '?'}`; no change submitted.",
                 "No candidate fixed the tests; submitting my analysis.")
    return s.finish()
