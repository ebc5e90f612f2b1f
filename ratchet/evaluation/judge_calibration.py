"""Judge calibration: gold labels, Cohen's kappa with a bootstrap CI, the drift / gate status.

Gold labels, two sources:
* the embedded suite's recorded ground truth (`gold_root_cause`): "root cause identified" when
  the explanation (1) names the mutated function as a whole word, (2) locates the fault: names
  the mutated line's number (naming at most 2 lines) or quotes the mutated line's code, and
  (3) names the operator: quotes the wrong token or its fix (at most 8 quoted snippets), or uses
  the operator's precise name ("off-by-one" for +-1 constants, "swapped arguments"). Written
  apart from the judges, from sandboxes.humaneval's recorded `root_cause` (function, line,
  line_text, original, mutated, operator). Items are explanations of several kinds per task
  (`embedded_items`, the diff is the recorded fix) plus the explanations agents actually
  submitted in logged runs of suite tasks (`transcript_items`, with their patches);
* human labels from a CSV (`load_human_labels`): task_id, explanation, optional diff/patch,
  label (1/0, yes/no, true/false), optional rater; several raters of one item -> the majority.

The calibrated verdict is the judge's root-cause call (`judge_label`): the rubric judge's
`criteria["root_cause_identified"]`, an LLM judge's root_cause score >= 0.5, else score >= 0.5.
Status: kappa >= 0.80 "ok"; 0.78 <= kappa < 0.80 "blocked" (promotion requires >= 0.80);
kappa < 0.78 "drift" (the drift alert fires, and promotion is blocked too).
"""
from __future__ import annotations

import csv
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

WARN_BELOW = 0.78
BLOCK_BELOW = 0.80
OPERATOR_NAMES = {"constant_plus_one": ("off-by-one", "off by one"),
                  "constant_minus_one": ("off-by-one", "off by one"),
                  "argument_swap": ("swapped argument", "arguments are swapped", "argument order",
                                    "arguments swapped")}


@dataclass(frozen=True)
class Item:
    task_id: str
    kind: str                 # how the explanation was made (template kind, "human", "trajectory")
    explanation: str
    diff: str
    gold: int                 # 1 = root cause identified
    source: str = ""          # the policy that wrote it, when known (a judge never grades its own)


# ------------------------------------------------------------------------------ gold rule
def _tokens(rc: Mapping) -> set[str]:
    t = {x.strip() for x in (rc.get("original"), rc.get("mutated")) if x and x.strip()}
    return t or ({"not"} if rc.get("family") == "negation" else set())


def _quoted(text: str) -> list[str]:
    return [s.strip() for s in re.findall(r"`([^`\n]+)`", text) + re.findall(r"'([^'\n]+)'", text)
            + re.findall(r'"([^"\n]+)"', text)]


def _lines(text: str) -> set[int]:
    nums: set[int] = set()
    for m in re.finditer(r"\blines?\s+(\d+)(?:\s*(?:-|to)\s*(\d+))?", text, re.I):
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        nums.update(range(lo, min(hi, lo + 50) + 1))
    for m in re.finditer(r"\blines?\s+\d+((?:\s*(?:,|and)\s*\d+)+)", text, re.I):
        nums.update(int(x) for x in re.findall(r"\d+", m.group(1)))
    nums.update(int(x) for x in re.findall(r"\.py:(\d+)", text))
    return nums


def gold_root_cause(bundle, explanation: str) -> int | None:
    """1 / 0 per the rule in the module doc; None when the task records no root cause."""
    rc = (bundle.metadata or {}).get("root_cause") or {}
    if not rc.get("function") or not rc.get("line"):
        return None
    text = explanation or ""
    named = re.search(rf"(?<![\w.]){re.escape(rc['function'])}(?!\w)", text, re.I) is not None
    quoted = _quoted(text)
    lines = _lines(text)
    code = (rc.get("line_text") or "").strip()
    located = (rc["line"] in lines and len(lines) <= 2) or (len(code) > 3 and any(code in q for q in quoted))
    cause = (bool(_tokens(rc) & set(quoted)) and len(set(quoted)) <= 8) or \
        any(p in text.lower() for p in OPERATOR_NAMES.get(rc.get("operator", ""), ()))
    return int(named and located and cause)


# ---------------------------------------------------------------------------- items
VAGUE = ("Fixed the bug.", "Should work now.", "Changed the logic in the function.",
         "I think the tests pass now.", "The function returned the wrong value; it is fixed now.")


def _kinds(b, rng: random.Random) -> list[tuple[str, str]]:
    rc = b.metadata["root_cause"]
    fn, n, code = rc["function"], rc["line"], (rc.get("line_text") or "").strip()
    toks = sorted(_tokens(rc)) or ["?"]
    mut = (rc.get("mutated") or "").strip() or toks[0]
    org = (rc.get("original") or "").strip() or toks[0]
    other = n + rng.choice((-3, -2, 2, 3)) if n > 3 else n + 2
    out = [
        ("expert", f"Root cause: in `{fn}` (solution.py, line {n}: `{code}`) the token `{mut}` should be "
                   f"`{org}`. Fix: a one-token change; the failing tests now pass."),
        ("terse", f"{fn}, line {n}: `{mut}` -> `{org}`."),
        ("line_code", f"In {fn}() the statement `{code}` uses `{mut}` where `{org}` belongs."),
        ("located_only", f"The bug is in `{fn}` at line {n}. Fixed it."),
        ("wrong_line", f"In `{fn}`, line {other}: `{mut}` should be `{org}`."),
        ("wrong_function", f"In `helper_{fn[:3]}` at line {n}, `{mut}` should be `{org}`."),
        ("vague", rng.choice(VAGUE)),
        ("cause_only", f"The operator was wrong: `{mut}` should have been `{org}`."),
        ("shotgun", f"Something in `{fn}` is off; it could be line {max(1, n - 1)}, line {n} or line {n + 1} "
                    f"or line {n + 2}; I changed `{mut}` to `{org}`."),
        ("keyword_bait", f"Could not find a passing fix and not sure why. The logic and the condition in "
                         f"`{fn}` uses variables; the most suspicious line is line {n}."),
    ]
    phrase = OPERATOR_NAMES.get(rc.get("operator", ""))
    if phrase:
        out.append(("operator_words", f"Off-by-one in {fn} on line {n}." if "off" in phrase[0]
                    else f"{fn} line {n}: the arguments are swapped."))
    return out


def embedded_items(bundles: Iterable, *, seed: int = 0, max_items: int | None = 600) -> list[Item]:
    """Explanations of every kind for each task with recorded ground truth, gold by the rule,
    diff = the recorded fix; a seeded sample of at most `max_items` (kinds kept balanced by
    sampling tasks, not items)."""
    rng = random.Random(seed)
    items = []
    for b in sorted(bundles, key=lambda x: x.task_id):
        rc = (b.metadata or {}).get("root_cause")
        if not rc or not rc.get("line"):
            continue
        diff = b.metadata.get("fix_diff") or ""
        for kind, text in _kinds(b, rng):
            g = gold_root_cause(b, text)
            if g is not None:
                items.append(Item(b.task_id, kind, text, diff, g))
    if max_items and len(items) > max_items:
        tasks = sorted({i.task_id for i in items})
        per = max(1, len(items) // len(tasks))
        keep = set(rng.sample(tasks, max(1, max_items // per)))
        items = [i for i in items if i.task_id in keep]
    return items


def _submitted_explanation(messages) -> str | None:
    import json

    msgs = json.loads(messages) if isinstance(messages, str) else (messages or [])
    for m in reversed(msgs):
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            if fn.get("name") == "submit":
                args = fn.get("arguments")
                try:
                    args = json.loads(args) if isinstance(args, str) else (args or {})
                except ValueError:
                    return None
                return str(args.get("explanation") or "") if isinstance(args, dict) else None
    return None


def transcript_items(records: Iterable[Mapping], bundles: Mapping[str, object]) -> list[Item]:
    """Items from logged agent runs (trajectories rows: task_id, messages, patch, agent_id) of
    tasks with recorded ground truth: the explanation the agent submitted, its patch, gold by the
    rule. Real agent wording, beside the templated kinds."""
    out = []
    for r in records:
        b = bundles.get(r.get("task_id"))
        expl = _submitted_explanation(r.get("messages")) if b is not None else None
        if expl is None:
            continue
        g = gold_root_cause(b, expl)
        if g is not None:
            out.append(Item(r["task_id"], "transcript", expl, r.get("patch") or "", g, r.get("agent_id") or ""))
    return out


_TRUE, _FALSE = {"1", "yes", "y", "true", "t", "accept"}, {"0", "no", "n", "false", "f", "reject"}


def load_human_labels(path: str | Path) -> tuple[list[Item], list[str]]:
    """Items from a CSV of human labels (columns: task_id, explanation, label; optional diff or
    patch, rater, source). Rows of one (task_id, explanation, diff) by several raters are reduced
    to their majority (a tie is dropped). Returns (items, problems): a bad row is reported, not
    silently skipped."""
    votes: dict[tuple, list[int]] = defaultdict(list)
    sources: dict[tuple, str] = {}
    problems: list[str] = []
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = {"task_id", "explanation", "label"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {sorted(missing)}")
        for n, r in enumerate(reader, start=2):
            lab = (r.get("label") or "").strip().lower()
            if lab not in _TRUE | _FALSE or not (r.get("task_id") or "").strip():
                problems.append(f"line {n}: label {r.get('label')!r} / task_id {r.get('task_id')!r} not usable")
                continue
            key = (r["task_id"].strip(), r["explanation"] or "", r.get("diff") or r.get("patch") or "")
            votes[key].append(int(lab in _TRUE))
            sources[key] = (r.get("source") or "").strip()
    items = []
    for key, vs in votes.items():
        c = Counter(vs)
        if c[0] == c[1]:
            problems.append(f"task {key[0]}: raters tie {c[1]}-{c[0]}, dropped")
            continue
        items.append(Item(key[0], "human", key[1], key[2], int(c[1] > c[0]), sources[key]))
    return items, problems


# ---------------------------------------------------------------------------- kappa
def judge_label(result) -> int:
    c = result.criteria or {}
    if "root_cause_identified" in c:
        return int(bool(c["root_cause_identified"]))
    if "root_cause" in c:
        return int(float(c["root_cause"]) >= 0.5)
    return int(result.score >= 0.5)


def status(kappa: float | None, warn_below: float = WARN_BELOW, block_below: float = BLOCK_BELOW) -> str:
    if kappa is None:
        return "no_labels"
    return "drift" if kappa < warn_below else "blocked" if kappa < block_below else "ok"


def calibrate(judge, items: Sequence[Item], bundles: Mapping[str, object], *, gold_source: str,
              n_boot: int = 2000, seed: int = 0, warn_below: float = WARN_BELOW,
              block_below: float = BLOCK_BELOW) -> tuple[dict, list[int]]:
    """Judge every item (whose task is known) and compare with gold: a judge_calibration row and
    the judge's labels. Refuses to grade an item written by the judge itself."""
    from ratchet.evaluation.stats import kappa_ci

    name = getattr(judge, "name", type(judge).__name__)
    own = [i for i in items if i.source and i.source == name]
    if own:
        raise ValueError(f"judge {name!r} would grade {len(own)} item(s) it wrote itself")
    usable = [i for i in items if i.task_id in bundles]
    labels = [judge_label(judge.judge(bundles[i.task_id], i.explanation, i.diff, blast_score=None))
              for i in usable]
    gold = [i.gold for i in usable]
    row = {"judge_id": name, "gold_source": gold_source, "items": len(usable), "n_boot": n_boot, "ci_seed": seed,
           "warn_below": warn_below, "block_below": block_below}
    if not usable:
        row.update(kappa=None, kappa_ci_lo=None, kappa_ci_hi=None, agreement=None, judge_positive_rate=None,
                   gold_positive_rate=None, status=status(None), confusion={}, disagreements=[])
        return row, labels
    k = kappa_ci(gold, labels, n_boot=n_boot, seed=seed)
    conf = Counter(f"gold{g}_judge{j}" for g, j in zip(gold, labels))
    by_kind = Counter(i.kind for i, j in zip(usable, labels) if j != i.gold)
    row.update(kappa=k.estimate, kappa_ci_lo=k.lo, kappa_ci_hi=k.hi,
               agreement=sum(g == j for g, j in zip(gold, labels)) / len(gold),
               judge_positive_rate=sum(labels) / len(labels), gold_positive_rate=sum(gold) / len(gold),
               status=status(k.estimate, warn_below, block_below), confusion=dict(sorted(conf.items())),
               disagreements={"by_kind": dict(by_kind.most_common()),
                              "examples": [{"task_id": i.task_id, "kind": i.kind, "gold": i.gold, "judge": j,
                                            "explanation": i.explanation[:300]}
                                           for i, j in zip(usable, labels) if j != i.gold][:5]})
    return row, labels
