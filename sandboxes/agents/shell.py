"""The shell agent: the prior harness's decisions, acted out through the tools real coding agents
use (`bash` and `str_replace_editor`), so its logs look like a SWE-agent's or an OpenHands' run.

    run = run_agent("shell", bundle, seed=0, prior=fit_prior(train_tasks), k=6)

It runs the tests with bash, ranks lines with `localize`, reads the file with the editor's `view`,
then tries the prior's candidate edits (computed from the file it read, the ones `propose_edits`
would list) as `str_replace` calls, re-running the tests with bash after each, and takes a
failed attempt back with `undo_edit`. What it writes is the training data a pretrained base
learns the editor's and bash's call formats from (sandboxes.foreign_logs writes it as SWE-agent
and ATIF files).
"""
from __future__ import annotations

import random
import re

from sandboxes.agents.base import AgentRun, Session, unique_window
from sandboxes.agents.prior import NO_FIX, _tiers, as_prior, line_scores, short_explanation
from sandboxes.observations import parse_localize

SHELL_ID = "agent@shell-v1"
TEST_COMMAND = "python -m pytest -q -p no:cacheprovider 2>&1 | tail -n 15"
_VIEW_ROW = re.compile(r"^\s*\d+\t(.*)$")
_PASSED = re.compile(r"\b(\d+) passed\b")
_FAILED = re.compile(r"\b(\d+) (failed|error)")


def view_source(obs: str) -> str:
    """The file text back from the editor's numbered `view`."""
    rows = obs.split("\n")[1:]          # the first row names the file
    return "".join((m.group(1) if (m := _VIEW_ROW.match(r)) else "") + "\n" for r in rows)


def tests_green(obs: str) -> bool:
    return bool(_PASSED.search(obs)) and not _FAILED.search(obs) and "[exit code 0]" in obs


def run_shell(env, rng: random.Random | None = None, *, prior=None, k: int = 6, top: int = 10,
              max_tiers: int = 3) -> AgentRun:
    if prior is None:
        raise ValueError("run_shell needs prior= (fit_prior on train tasks)")
    from sandboxes.candidates import propose_edits

    prior = as_prior(prior)
    s = Session(env, SHELL_ID)
    s.call("bash", {"command": TEST_COMMAND}, "Run the tests to see what fails.")
    ranked = parse_localize(s.call("localize", {"top": top}, "Rank the lines the failing tests point at."))
    if not ranked:
        return _submit(s, NO_FIX)
    path = ranked[0][0]
    source = view_source(s.call("str_replace_editor", {"command": "view", "path": path}, f"Read {path}."))
    for tier in _tiers(ranked, path)[:max_tiers]:
        rows = []
        for rank, line in enumerate(tier):
            cands = propose_edits(source, line)
            listed = [(c.index, c.description) for c in cands]
            rows += [(-sc, rank, line, c) for sc, c in zip(line_scores(listed, prior), cands)]
        for _, _, line, cand in sorted(rows, key=lambda r: r[:3] + (r[3].index,)):
            if s.attempts >= k or s.done or s.turns_left <= 3:
                return _submit(s, NO_FIX)
            patched = cand.apply(source)
            win = unique_window(source, patched, line)
            if win is None:
                continue
            s.attempts += 1
            s.call("str_replace_editor", {"command": "str_replace", "path": path, "old_str": win[0],
                                          "new_str": win[1]}, f"Attempt {s.attempts}: {cand.description}.")
            if tests_green(s.call("bash", {"command": TEST_COMMAND}, "Run the tests again.")):
                s.fixed_at = s.attempts
                return _submit(s, short_explanation(path, line, cand.description))
            s.call("str_replace_editor", {"command": "undo_edit", "path": path}, "That was not it; undo.")
    return _submit(s, NO_FIX)


def _submit(s: Session, explanation: str) -> AgentRun:
    if not s.done:
        s.submit(explanation, "Submitting.")
    return s.finish()
