"""The LM harness: SBFL's ranked lines plus the candidate edits ranked by a language model.

    scorer = LMScorer(base_path)          # ratchet.policy.lm_score: log p(program) under the base model
    run = run_agent("lm", bundle, seed=0, scorer=scorer, k=4)

No weight changes: the pretrained base is used as a reader of code. Per SBFL score tier, every
candidate of the tier's lines is ranked by the model's log-likelihood of the whole patched
program (the version that reads most like code the model has seen first); an attempt = apply +
run the tests, a failed attempt is undone. It is the bar a policy trained from that base has to
beat: if the trained policy picks edits worse than its own base's likelihood does, training lost
information the base had. The acting loop is the prior harness's (sandboxes.agents.prior).
"""
from __future__ import annotations

import random

from sandboxes.agents.base import AgentRun, Editor, Session
from sandboxes.agents.prior import NO_FIX, _done, _long, _tiers
from sandboxes.observations import parse_candidates, parse_localize, parse_source, tests_all_passed

LM_ID = "baseline-lm@v1"


def ranked_by_scorer(scorer, source: str, lines_cands: list[tuple[int, list[tuple[int, str]]]]):
    """(line, index, description) of one tier, by the scorer's log p(patched program) (desc);
    ties: SBFL rank, then index. Candidates are rebuilt from `source` with the env's own
    generator (sandboxes.candidates), so index i is the env's index i."""
    from sandboxes.candidates import propose_edits

    rows = []
    for rank, (line, cands) in enumerate(lines_cands):
        local = {c.index: c for c in propose_edits(source, line)}
        keep = [(i, d) for i, d in cands if i in local]
        scores = scorer.edit_scores(source, line, [local[i].apply(source) for i, _ in keep])
        rows += [(-s, rank, line, i, d) for s, (i, d) in zip(scores, keep)]
    return [(line, i, d) for _, _, line, i, d in sorted(rows)]


def run_lm(env, rng: random.Random | None = None, *, scorer=None, k: int = 4, top: int = 10,
           max_tiers: int = 3) -> AgentRun:
    if scorer is None:
        raise ValueError("run_lm needs scorer= (ratchet.policy.lm_score.LMScorer of the base model); "
                         "the harness:lm policy makes one from the base checkpoint")
    s = Session(env, LM_ID)
    ranked = parse_localize(s.call("localize", {"top": top}, "Ranking suspicious lines."))
    if not ranked:
        return _done(s, NO_FIX)
    path = ranked[0][0]
    source = parse_source(s.call("read_file", {"path": path}, f"Reading {path}."))
    editor = Editor(s, path, source)
    for tier in _tiers(ranked, path)[:max_tiers]:
        cands = []
        for line in tier:
            if s.done or s.turns_left <= 3:
                break
            got = parse_candidates(s.call("propose_edits", {"path": path, "line": line},
                                          f"Quick fixes for line {line}?"))
            if got:
                cands.append((line, got))
        for line, index, desc in ranked_by_scorer(scorer, source, cands):
            if s.attempts >= k or s.done or s.turns_left <= 2:
                return _done(s, NO_FIX)
            s.attempts += 1
            if not editor.apply(line, index, f"Attempt {s.attempts}: candidate [{index}] on line {line}."):
                continue
            if tests_all_passed(s.call("run_tests", {}, "Running the tests.")):
                s.fixed_at = s.attempts
                return _done(s, _long(editor, line, desc))
            if not editor.revert():
                return _done(s, NO_FIX)
    return _done(s, NO_FIX)
