"""The prior harness: SBFL's ranked lines plus a count prior over candidate kinds.

    prior = fit_prior(train_tasks)                 # TaskBundles or `tasks` rows with split == "train"
    run = run_agent("prior", bundle, seed=0, prior=prior, k=4)

A third no-weights baseline, the bar a learned policy has to clear: it knows what single-token
bugs usually look like (which fix kinds are frequent in the TRAINING problems) and where SBFL
points. The kind of a candidate is read from `propose_edits`' own description (what an agent
sees), e.g. "replace `!=` with `==` at column 9 (comparison)" is a comparison_swap (`kind_key`).

Fitting: for each train task, the candidate of `propose_edits` on the faulty line that equals the
task's recorded fix (`metadata["fix"]`) gives one count to its kind. A row whose `split` is not
"train" is skipped, so a validation or holdout problem can never shape the prior.

Acting (`run_prior`): localize; then per SBFL score tier (lines with equal suspiciousness), the
candidates of every line in the tier, ordered by the prior's count (ties: SBFL rank, then index);
an attempt = apply + run the tests; a failed attempt is undone. `structured=True` acts with the
structured tools only (localize, propose_edits, apply_edit, run_tests, submit): it undoes an
attempt by applying the inverse candidate, as a model restricted to those tools has to, and
writes the short explanation `short_explanation` builds. That is the production agent
"agent@v7-structured" of the demo's logs (sandboxes.generate).
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sandboxes.agents.base import AgentRun, Editor, Session, enclosing_function
from sandboxes.observations import (
    parse_applied,
    parse_candidates,
    parse_localize,
    parse_source,
    tests_all_passed,
)

PRIOR_ID = "baseline-prior@v1"
STRUCTURED_ID = "agent@v7-structured"
_COLUMN = re.compile(r" at column \d+")


_REPLACE = re.compile(r"^replace `(.+?)` with `(.+?)` \((\w+)\)$")


def kind_key(description: str) -> str:
    """A candidate's kind, read from the description `propose_edits` lists (what an agent sees):
    the operator tables' kinds (comparison_swap, constant_plus_one, negation_drop, ...). Coarse
    on purpose: measured on 141 held-out tasks of 40 problems, these kinds rank the true fix first
    for 41.8% (top 3: 70.9%) against 36.9% (66.0%) for token-level kinds, which are sparse."""
    head = _COLUMN.sub("", description.split(": `", 1)[0]).strip()
    if head.startswith("swap arguments"):
        return "argument_swap"
    if head in ("insert `not`", "remove `not`"):
        return "negation_add" if head.startswith("insert") else "negation_drop"
    m = _REPLACE.match(head)
    if not m:
        return head
    old, new, family = m.groups()
    if family == "constant":
        if old.lstrip("-").isdigit() and new.lstrip("-").isdigit():
            return "constant_plus_one" if int(new) > int(old) else "constant_minus_one"
        return "bool_swap" if {old, new} <= {"True", "False"} else "constant_swap"
    return {"variable": "variable_swap"}.get(family, f"{family}_swap")


def _family(key: str) -> str:
    return key.split("_", 1)[0]


@dataclass(frozen=True)
class Prior:
    counts: dict                               # kind -> train tasks whose fix is of that kind
    task_ids: tuple = ()                       # the tasks it was fit on
    families: dict = field(default_factory=dict)

    def score(self, description: str) -> float:
        """The count of the candidate's kind, plus a fraction of its family's count as backoff."""
        key = kind_key(description)
        return self.counts.get(key, 0) + 1e-3 * self.families.get(_family(key), 0)

    def to_json(self) -> str:
        return json.dumps({"counts": self.counts, "task_ids": list(self.task_ids)}, sort_keys=True)

    @classmethod
    def from_counts(cls, counts: Mapping, task_ids: Iterable = ()) -> "Prior":
        fam: Counter = Counter()
        for k, n in counts.items():
            fam[_family(k)] += n
        return cls(dict(sorted(counts.items())), tuple(task_ids), dict(sorted(fam.items())))

    @classmethod
    def from_json(cls, text: str) -> "Prior":
        d = json.loads(text)
        return cls.from_counts(d["counts"], d.get("task_ids", ()))


def _bundle(item):
    """A TaskBundle from a bundle, or from a `tasks` row (its `bundle` column), else None."""
    from sandboxes.bundle import TaskBundle

    if isinstance(item, TaskBundle):
        return item
    raw = item.get("bundle")
    if raw is None:
        return None
    return TaskBundle.from_dict(json.loads(raw) if isinstance(raw, str) else raw)


def fix_kind(bundle) -> str | None:
    """The kind of the candidate on the faulty line that is the task's recorded fix."""
    from sandboxes.candidates import propose_edits

    fix, cause = bundle.metadata.get("fix"), bundle.metadata.get("root_cause")
    if not fix or not cause:
        return None
    source = bundle.files.get(cause.get("file") or fix.get("file"), "")
    for c in propose_edits(source, int(cause["line"])):
        if (c.col, c.old, c.new) == (fix.get("col"), fix.get("old"), fix.get("new")):
            return kind_key(c.description)
    return None


def fit_prior(tasks: Iterable) -> Prior:
    """Count the fix kinds of the train tasks. `tasks`: TaskBundles (the caller vouches they are
    train tasks) or `tasks` table rows with a `split` column (rows not in "train" are skipped).
    Deterministic: the counts do not depend on the order of `tasks`."""
    counts: Counter = Counter()
    ids = []
    for t in tasks:
        if isinstance(t, Mapping) and t.get("split") != "train":
            continue
        b = _bundle(t)
        if b is None:
            continue
        k = fix_kind(b)
        if k is not None:
            counts[k] += 1
            ids.append(b.task_id)
    return Prior.from_counts(counts, sorted(ids))


def as_prior(prior) -> Prior:
    if isinstance(prior, Prior):
        return prior
    if isinstance(prior, str):
        return Prior.from_json(prior)
    if isinstance(prior, Mapping):
        return Prior.from_counts(prior.get("counts", prior), prior.get("task_ids", ()))
    raise TypeError(f"prior must be a Prior, its JSON, or a counts mapping, not {type(prior).__name__}")


def short_explanation(path: str, line: int, description: str) -> str:
    """The submit text of the structured agent (and of the policy-side action mask)."""
    return f"Fixed {path} line {line}: {description.split(': `', 1)[0]}."[:120]


NO_FIX = "No candidate fixed the tests."


def line_scores(cands: list[tuple[int, str]], prior: Prior) -> list[float]:
    """The prior's score of each candidate of ONE line's list: its kind's count shared by the
    line's candidates of that kind (one line offers many variable swaps, one true fix: 36.9% vs
    18.4% top-1 on held-out tasks)."""
    same = Counter(kind_key(d) for _, d in cands)
    return [prior.score(d) / same[kind_key(d)] for _, d in cands]


def prior_order(cands: list[tuple[int, str]], prior: Prior) -> list[tuple[int, str]]:
    """One line's candidates in the prior's order (score desc; ties: the environment's order).
    The order the harness tries a line's candidates in, and the order the embedded policy's view
    lists them in (`ratchet.policy.embedded.chat.policy_view`)."""
    scores = line_scores(cands, prior)
    return [c for _, _, c in sorted((-s, pos, c) for pos, (s, c) in enumerate(zip(scores, cands)))]


def ranked_candidates(tiers: list[list[tuple[int, list[tuple[int, str]]]]], prior: Prior):
    """(line, index, description) in the order the prior harness tries them: tier by tier, the
    tier's candidates by `line_scores` (desc), then SBFL rank, then index. Within one line this is
    `prior_order`, so every pick is the first untried row of a list in the policy's view."""
    out = []
    for tier in tiers:
        rows = []
        for rank, (line, cands) in enumerate(tier):
            rows += [(-s, rank, line, i, d) for s, (i, d) in zip(line_scores(cands, prior), cands)]
        out += [(line, i, d) for _, _, line, i, d in sorted(rows)]
    return out


def _tiers(ranked, path: str) -> list[list[int]]:
    tiers: list[list[int]] = []
    last = None
    for f, line, score in ranked:
        if f != path:
            continue
        if score != last:
            tiers.append([])
            last = score
        if line not in (x for t in tiers for x in t):
            tiers[-1].append(line)
    return tiers


def run_prior(env, rng: random.Random | None = None, *, prior=None, k: int = 4, top: int = 10,
              max_tiers: int = 3, structured: bool = False) -> AgentRun:
    if prior is None:
        raise ValueError("run_prior needs prior= (fit_prior on train tasks); the harness:prior policy "
                         "fits one from the warehouse's train split when none is given")
    prior = as_prior(prior)
    s = Session(env, STRUCTURED_ID if structured else PRIOR_ID)
    s.notes["prior_tasks"] = len(prior.task_ids)
    loc = s.call("localize", {"top": top}, "" if structured else "Ranking suspicious lines.")
    ranked = parse_localize(loc)
    s.notes["_lines"] = localized_code(loc)
    if not ranked:
        return _done(s, NO_FIX)
    path = ranked[0][0]
    editor = None
    if not structured:
        source = parse_source(s.call("read_file", {"path": path}, f"Reading {path}."))
        editor = Editor(s, path, source)
    # structured: the policy-side action mask's flow (ratchet.policy.action_mask.narrow), so every
    # call of these demonstrations is one the mask offers: every tier; an attempt starts only with
    # room to undo it and submit (5 turns: apply, test, undo x2, submit), since after a failed test
    # the mask offers only the undo, and the give-up submit comes on the clean file, late
    stop_proposing, stop_trying = (5, 4) if structured else (3, 2)
    for tier in _tiers(ranked, path)[:None if structured else max_tiers]:
        cands = []
        for line in tier:
            if s.done or s.turns_left <= stop_proposing:
                break
            got = parse_candidates(s.call("propose_edits", {"path": path, "line": line},
                                          "" if structured else f"Quick fixes for line {line}?"))
            if got:
                cands.append((line, got))
        for line, index, desc in ranked_candidates([cands], prior):
            if s.attempts >= k or s.done or s.turns_left <= stop_trying:
                return _done(s, NO_FIX)
            s.attempts += 1
            applied = _apply(s, editor, path, line, index, desc, structured)
            if applied is None:
                continue
            if tests_all_passed(s.call("run_tests", {}, "" if structured else "Running the tests.")):
                s.fixed_at = s.attempts
                return _done(s, short_explanation(path, line, desc) if structured else _long(editor, line, desc))
            if not _undo(s, editor, path, line, applied, structured):
                return _done(s, NO_FIX)
    return _done(s, NO_FIX)


def _apply(s: Session, editor, path, line, index, desc, structured):
    if structured:
        obs = s.call("apply_edit", {"path": path, "line": line, "index": index})
        a = parse_applied(obs)
        return a
    ok = editor.apply(line, index, f"Attempt {s.attempts}: candidate [{index}] on line {line}.")
    return ok or None


_LOC_CODE = re.compile(r"^\s*\d+\.\s+(.+?):(\d+)\s+score=\S+\s+\| (.*)$")


def localized_code(obs: str) -> dict[int, str]:
    """line -> its code (stripped) as localize's observation shows it."""
    out = {}
    for row in obs.splitlines():
        m = _LOC_CODE.match(row)
        if m:
            out[int(m.group(2))] = m.group(3).strip()
    return out


def _undo(s: Session, editor, path, line, applied, structured) -> bool:
    """Put the line back. Structured: propose_edits on the edited line lists the inverse edit
    (the operator tables are symmetric), i.e. the candidate whose line reads as before."""
    if not structured:
        return editor.revert()
    want = s.notes.get("_lines", {}).get(line)
    if want is None:
        return False
    for i, d in parse_candidates(s.call("propose_edits", {"path": path, "line": line})):
        if d.split(": `", 1)[-1][:-1] == want:
            return parse_applied(s.call("apply_edit", {"path": path, "line": line, "index": i})) is not None
    return False


def _long(editor, line: int, desc: str) -> str:
    from sandboxes.agents.expert import explain

    text = editor.original.splitlines()[line - 1]
    return explain(enclosing_function(editor.original, line), editor.path, line, desc, text)


def _done(s: Session, explanation: str) -> AgentRun:
    s.notes.pop("_lines", None)
    if not s.done:
        s.submit(explanation, "" if s.agent_id == STRUCTURED_ID else "Submitting.")
    return s.finish()
