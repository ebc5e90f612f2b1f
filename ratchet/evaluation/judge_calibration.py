"""Judge calibration: gold labels, Cohen's kappa with a bootstrap CI, the drift / gate status.

Gold labels, two sources:
* the embedded suite's recorded ground truth (`gold_root_cause`, rule v3): "root cause
  identified" when the explanation
  (1) names the mutated function as a whole word;
  (2) locates the fault: names the mutated line's number, or names no line number and quotes
      the line's code (a wrong line number is not rescued by the code);
  (3) states the fix: some evidence is right and none is wrong. Evidence: each quoted snippet
      (backticks; quotes not glued to a word), each pair of adjacent snippets, each operator
      phrase ("off-by-one", "swapped arguments", "drop the `not`", "missing `not`"). Against the
      space of single-token edits of the buggy file (the suite's operator table, the recorded
      fix among them; whitespace ignored), a snippet supports an edit when it is code that edit
      produces and no line of the buggy file holds; a pair supports it when one snippet is a
      stretch of the buggy line around the edited span and the other is that stretch edited (in
      either order); a phrase supports the recorded fix when it names its operator ("off-by-one"
      also names a `<`/`<=` or `>`/`>=` swap), else another edit. Right = supports the recorded
      fix; wrong = supports other edits only (a hedge between candidate fixes);
  and it is no shotgun answer: at most 2 lines named, at most 2 whole lines quoted (a line of
  more than one word, so a doctest's `True` is not one), at most 8
  distinct snippets, at most 4,000 characters. Quoting the faulty line (or the wrong token) alone locates but states no
  fix. Written apart from the judges, from sandboxes.humaneval's recorded `root_cause`
  (function, line, col, end_col, original, mutated, operator). Items are explanations of many
  kinds per task (`embedded_items`, the diff is the recorded fix) plus the explanations agents
  actually submitted in logged runs of suite tasks (`transcript_items`, with their patches);
* human labels from a CSV (`load_human_labels`): task_id, explanation, optional diff/patch,
  label (1/0, yes/no, true/false), optional rater; several raters of one item -> the majority.

The calibrated verdict is the judge's root-cause call (`judge_label`): the rubric judge's
`criteria["root_cause_identified"]`, an LLM judge's root_cause score above 0.5 (its rubric's 0.5
is "located, cause vague": not identified), else score >= 0.5.
Status: kappa >= 0.80 "ok"; 0.78 <= kappa < 0.80 "blocked" (promotion requires >= 0.80);
kappa < 0.78 "drift" (the drift alert fires, and promotion is blocked too).
"""
from __future__ import annotations

import csv
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

WARN_BELOW = 0.78
BLOCK_BELOW = 0.80


@dataclass(frozen=True)
class Item:
    task_id: str
    kind: str                 # how the explanation was made (template kind, "human", "trajectory")
    explanation: str
    diff: str
    gold: int                 # 1 = root cause identified
    source: str = ""          # the policy that wrote it, when known (a judge never grades its own)


# ------------------------------------------------------------------------------ gold rule
# Written apart from the judges (sandboxes.verifiers.judge.RubricJudge implements the same rule
# its own way; tests require the two to agree on every embedded item and adversarial case).
MAX_NAMED = 2       # lines named or whole lines quoted; more is a shotgun answer
MAX_SNIPPETS = 8    # distinct quoted snippets; more is a shotgun answer
MAX_TEXT = 4000     # characters; a longer explanation is a shotgun answer (and is not parsed)
OPERATOR_WORDS = (  # (regex over the lower-cased text, the operators it names)
    (r"\boff[- ]by[- ]one\b", ("constant_plus_one", "constant_minus_one", "boundary")),
    (r"\bswapped arguments?\b|\barguments? (?:are |were )?swapped\b|\bargument order\b", ("argument_swap",)),
    (r"\b(?:spurious|extra|redundant) negation\b|\bshould not be negated\b|"
     r"\b(?:drop|remove|delete|spurious|extra|redundant)\s+(?:the\s+|an?\s+)?[`'\"]not[`'\"]", ("negation_add",)),
    (r"\bmissing negation\b|\bnegation (?:was|is) dropped\b|\bshould be negated\b|"
     r"\b(?:missing|add|insert)\s+(?:the\s+|an?\s+)?[`'\"]not[`'\"]", ("negation_drop",)),
)


def _nows(s: str) -> str:
    return "".join(s.split())


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _quoted(text: str) -> list[str]:
    """Quoted snippets in reading order: `backticks`; outside them 'single' or "double" quotes
    whose marks are not glued to a word character."""
    hits, masked, i = [], list(text), 0
    while i < len(text):
        if text[i] == "`":
            j = text.find("`", i + 1)
            nl = text.find("\n", i + 1)
            if j > i + 1 and (nl == -1 or j < nl):
                hits.append((i, text[i + 1:j]))
                masked[i:j + 1] = "\n" * (j + 1 - i)
                i = j + 1
                continue
        i += 1
    plain, i = "".join(masked), 0
    while i < len(plain):
        ch = plain[i]
        if ch in "'\"" and (i == 0 or not _word(plain[i - 1])):
            j = plain.find(ch, i + 1)
            nl = plain.find("\n", i + 1)
            if j > i + 1 and (nl == -1 or j < nl) and (j + 1 == len(plain) or not _word(plain[j + 1])):
                hits.append((i, plain[i + 1:j]))
                i = j + 1
                continue
        i += 1
    return [s for _, s in sorted(hits) if _nows(s)]


def _lines(text: str) -> set[int]:
    """"line N", "lines N-M" / "N to M" (every line in the range, at most 51), lists joined by
    commas, "and", "or", "&"; "file.py:N"."""
    nums: set[int] = set()
    nums.update(int(x) for x in re.findall(r"\.py:(\d+)", text))
    toks = re.findall(r"\blines?\b|\d+|[-–,&]|\bto\b|\band\b|\bor\b|\S", text, re.I)
    k = 0
    while k < len(toks):
        if toks[k].lower() in ("line", "lines") and k + 1 < len(toks) and toks[k + 1].isdigit():
            k += 1
            last, ranged = None, False
            while k < len(toks):
                t = toks[k].lower()
                if t.isdigit():
                    n = int(t)
                    if ranged and last is not None and n >= last:
                        nums.update(range(last, min(n, last + 50) + 1))
                    else:
                        nums.add(n)
                    last, ranged = n, False
                elif t in ("-", "–", "to") and last is not None and k + 1 < len(toks) and toks[k + 1].isdigit():
                    ranged = True
                elif t in (",", "and", "or", "&") and last is not None:
                    ranged = False
                else:
                    break
                k += 1
            continue
        k += 1
    return nums


@lru_cache(maxsize=1024)
def _edit_space(source: str, line: int, col: int, end: int, original: str, mutated: str):
    """Every single-token edit of the buggy file as (line, text before, text after, squashed
    prefix, old, new, suffix), the recorded fix first; None when the root cause does not match."""
    from sandboxes.humaneval.operators import all_edits

    rows = source.splitlines()
    if not 0 < line <= len(rows) or rows[line - 1][col:end] != mutated:
        return None

    def edit(n, c, e, new):
        t = rows[n - 1]
        return (n, _nows(t), _nows(t[:c] + new + t[e:]), _nows(t[:c]), _nows(t[c:e]), _nows(new), _nows(t[e:]))

    try:
        cands = [edit(x.line, x.col, x.end_col, x.new) for x in all_edits(source)]
    except SyntaxError:
        cands = []
    fix = edit(line, col, end, original)
    return tuple(_nows(t) for t in rows), (fix, *[x for x in cands if (x[0], x[2]) != (fix[0], fix[2])])


def _stretch(a: str, b: str, ed: tuple) -> bool:
    """`a` = x + old + y with x ending the text before the edit and y starting the text after it,
    and `b` = x + new + y."""
    _, _, _, pre, old, new, post = ed
    for k in range(len(a) + 1):
        x, rest = a[:k], a[k:]
        if rest.startswith(old) and pre.endswith(x) and post.startswith(rest[len(old):]) \
                and b == x + new + rest[len(old):]:
            return True
    return False


def gold_root_cause(bundle, explanation: str) -> int | None:
    """1 / 0 per the rule in the module doc; None when the task records no root cause."""
    rc = (bundle.metadata or {}).get("root_cause") or {}
    if not rc.get("function") or not rc.get("line"):
        return None
    text = explanation or ""
    if len(text) > MAX_TEXT:
        return 0
    named = re.search(rf"(?<![\w.]){re.escape(rc['function'])}(?!\w)", text, re.I) is not None
    quoted = _quoted(text)
    flat = [_nows(q) for q in quoted]
    distinct = set(flat)
    lines = _lines(text)
    source = (bundle.files or {}).get(rc.get("file") or "solution.py") or ""
    space = None
    if source and rc.get("col") is not None and rc.get("end_col") is not None:
        space = _edit_space(source, rc["line"], rc["col"], rc["end_col"], rc.get("original") or "",
                            rc.get("mutated") or "")
    full = {x for x in (_nows(t) for t in source.splitlines())
            if len(x) > 3 and not all(ch.isalnum() or ch == "_" for ch in x)}     # a line, not a word
    if space:
        full.add(space[1][0][2])
    if len(distinct) > MAX_SNIPPETS or len(lines) > MAX_NAMED or len(distinct & full) > MAX_NAMED:
        return 0                                          # shotgun: neither location nor cause
    code = _nows(rc.get("line_text") or "")
    located = rc["line"] in lines or (not lines and len(code) > 3 and any(code in q for q in distinct))
    # Evidence -> the set of edits it supports; right = supports the recorded fix (index 0),
    # wrong = supports other edits only.
    verdicts = []
    if space:
        buggy, edits = space
        for q in distinct:
            if not any(q in t for t in buggy):
                verdicts.append({i for i, ed in enumerate(edits) if q in ed[2]})
        for a, b in zip(flat, flat[1:]):
            if a != b:
                verdicts.append({i for i, ed in enumerate(edits) if _stretch(a, b, ed) or _stretch(b, a, ed)})
    names = {rc.get("operator", "")}
    if {(rc.get("original") or "").strip(), (rc.get("mutated") or "").strip()} in ({"<", "<="}, {">", ">="}):
        names.add("boundary")
    for pattern, ops in OPERATOR_WORDS:
        if re.search(pattern, text.lower()):
            verdicts.append({0} if names & set(ops) else {1})   # {1}: names some other edit
    right = any(0 in v for v in verdicts)
    wrong = any(v and 0 not in v for v in verdicts)
    return int(named and located and right and not wrong)


# ---------------------------------------------------------------------------- items
VAGUE = ("Fixed the bug.", "Should work now.", "Changed the logic in the function.",
         "I think the tests pass now.", "The function returned the wrong value; it is fixed now.")


def _expressions(b, rc) -> tuple[str, str]:
    """The wrong token with its neighbouring tokens on the buggy line, and that stretch fixed
    (`return False` / `return True`): how people quote a fault."""
    raw = b.files[rc.get("file") or "solution.py"].splitlines()[rc["line"] - 1]
    col, end = rc["col"], rc["end_col"]
    toks = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]+", raw)]
    lo = max([s for s, e in toks if e <= col] or [col])
    hi = min([e for s, e in toks if s >= end] or [end])
    return raw[lo:hi].strip(), (raw[lo:col] + (rc.get("original") or "") + raw[end:hi]).strip()


def _alternative(b, rc) -> tuple[str, str] | None:
    """Another single-token edit of the faulty line (a hedge beside the real fix)."""
    from sandboxes.humaneval.operators import all_edits

    src = b.files[rc.get("file") or "solution.py"]
    edits = [e for e in all_edits(src, lines={rc["line"]}) if e.old.strip() and e.new.strip()
             and (e.col, e.new) != (rc["col"], rc.get("original"))]
    same = [e for e in edits if e.col == rc["col"]]
    e = (same or edits or [None])[0]
    return (e.old.strip(), e.new.strip()) if e else None


def _kinds(b, rng: random.Random) -> list[tuple[str, str]]:
    rc = b.metadata["root_cause"]
    fn, n, code = rc["function"], rc["line"], (rc.get("line_text") or "").strip()
    bug, fix = _expressions(b, rc)
    raw = b.files[rc.get("file") or "solution.py"].splitlines()[n - 1]
    fixed_line = (raw[:rc["col"]] + (rc.get("original") or "") + raw[rc["end_col"]:]).strip()
    mut, org = (rc.get("mutated") or "").strip(), (rc.get("original") or "").strip()
    if not (mut and org):                                 # a negation: quote the expression
        mut, org = bug, fix
    other = n + rng.choice((-3, -2, 2, 3)) if n > 3 else n + 2
    line_toks = re.findall(r"\w+|[^\w\s]+", code)[:7]
    out = [
        ("expert", f"Root cause: in `{fn}` (solution.py, line {n}: `{code}`) the token `{mut}` should be "
                   f"`{org}`. Fix: a one-token change; the failing tests now pass."),
        ("terse", f"{fn}, line {n}: `{mut}` -> `{org}`."),
        ("line_code", f"In {fn}() the statement `{code}` is wrong; it should read `{fixed_line}`."),
        ("expression", f"In `{fn}` (line {n}) the expression `{bug}` should be `{fix}`."),
        ("fixed_only", f"`{fn}`, line {n}: it must be `{fix}`."),
        ("located_only", f"The bug is in `{fn}` at line {n}. Fixed it."),
        ("verbatim_line", f"The bug is in `{fn}`, line {n}: `{code}`."),
        ("wrong_token_only", f"In `{fn}` line {n} the `{mut}` is wrong."),
        ("token_shotgun", f"`{fn}` line {n}: " + " ".join(f"`{t}`" for t in line_toks) + "."),
        ("wrong_line", f"In `{fn}`, line {other}: `{mut}` should be `{org}`."),
        ("wrong_function", f"In `helper_{fn[:3]}` at line {n}, `{mut}` should be `{org}`."),
        ("vague", rng.choice(VAGUE)),
        ("cause_only", f"The operator was wrong: `{mut}` should have been `{org}`."),
        ("shotgun", f"Something in `{fn}` is off; it could be line {max(1, n - 1)}, line {n} or line {n + 1} "
                    f"or line {n + 2}; I changed `{mut}` to `{org}`."),
        ("keyword_bait", f"Could not find a passing fix and not sure why. The logic and the condition in "
                         f"`{fn}` uses variables; the most suspicious line is line {n}."),
        ("wrong_words", f"`{fn}` line {n}: `{mut}` should be `{org}` "
                        + ("(an off-by-one)." if rc.get("operator") == "argument_swap" else "(the arguments are swapped).")),
    ]
    alt = _alternative(b, rc)
    if alt:
        out.append(("candidates", f"In `{fn}` line {n}, either `{mut}` should be `{org}` or `{alt[0]}` "
                                  f"should be `{alt[1]}`."))
    words = {"constant_plus_one": f"Off-by-one in {fn} on line {n}.",
             "constant_minus_one": f"Off-by-one in {fn} on line {n}.",
             "argument_swap": f"{fn} line {n}: the arguments are swapped.",
             "negation_add": f"{fn} line {n}: drop the `not`.",
             "negation_drop": f"{fn} line {n}: a missing `not`."}.get(rc.get("operator", ""))
    if words:
        out.append(("operator_words", words))
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
        return int(float(c["root_cause"]) > 0.5)     # the LLM rubric's 0.5 = located, cause vague
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
