"""R_judge: a pluggable Judge protocol and an embedded deterministic rubric judge.

The rubric judge grades a root-cause explanation and the patch's maintainability against the
task's ground truth (metadata). It is deterministic so it can be calibrated against gold labels
(`cohen_kappa`) and swapped for an LLM judge behind the same protocol. It is never the acceptance
test: R_tests is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

from sandboxes.rootcause import root_cause, task_source

FAMILY_WORDS = {
    "comparison": ("comparison", "compare", "operator", "inequality", "boundary", "off-by-one",
                   "<", ">", "==", "!="),
    "arithmetic": ("arithmetic", "operator", "plus", "minus", "sign", "division", "multipl"),
    "boolean": ("and", "or", "boolean", "logic", "condition"),
    "constant": ("constant", "off-by-one", "off by one", "literal", "index", "true", "false"),
    "negation": ("not", "negat", "invert", "condition"),
    "variable": ("variable", "wrong name", "uses", "instead of"),
    "arguments": ("argument", "swap", "order"),
}
DEBRIS = re.compile(r"^\+(?!\+\+).*(\bprint\(|\bbreakpoint\(|\bpdb\b|TODO|FIXME|XXX)", re.M)
SWALLOW = re.compile(r"^\+\s*except(\s+(Exception|BaseException))?\s*:\s*(pass)?\s*$", re.M)


@dataclass(frozen=True)
class JudgeResult:
    score: float               # 0..1
    rationale: str
    criteria: dict = field(default_factory=dict)

    @property
    def label(self) -> int:
        """Binary accept label used for calibration against gold labels."""
        return int(self.score >= 0.5)


@runtime_checkable
class Judge(Protocol):
    name: str

    def judge(self, bundle, explanation: str, diff: str, *, blast_score: float | None = None) -> JudgeResult:
        ...


def _mentions_line(text: str, line: int) -> bool:
    return re.search(rf"\b(line|l\.|:)\s*{line}\b", text, re.I) is not None


def _maintainability(bundle, diff: str, blast_score: float | None) -> tuple[float, dict]:
    """0.4 minimal (the blast score) + 0.2 each: no debug debris, no swallowed errors, no
    hard-coded test values; 0 for an empty patch."""
    added = "\n".join(l for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++"))
    c = {"minimal": blast_score if blast_score is not None else (1.0 if diff.strip() else 0.0),
         "no_debris": DEBRIS.search(diff) is None, "no_swallow": SWALLOW.search(diff) is None,
         "no_hardcode": not _hardcodes_tests(added, bundle)}
    maint = 0.4 * c["minimal"] + 0.2 * c["no_debris"] + 0.2 * c["no_swallow"] + 0.2 * c["no_hardcode"]
    return (maint if diff.strip() else 0.0), c


def _result(root: float, maint: float, c: dict, rc: dict | None = None) -> JudgeResult:
    score = round(0.5 * root + 0.5 * maint, 4)
    missed = [k for k, v in c.items() if v is False or (k == "minimal" and v < 1.0)]
    rationale = (f"root cause {root:.2f} (function={c['function']}, location={c['location']}, "
                 f"cause={c['cause']}); maintainability {maint:.2f}"
                 + (f"; missed: {', '.join(missed)}" if missed else ""))
    source = (rc or {}).get("source")
    if source == "reference patch":
        rationale += "; root cause derived from the reference patch"
    elif source == "none":
        rationale += ("; the task records no root cause and no reference patch: the root-cause "
                      "half cannot be earned")
    c = {**c, "root_cause_source": source} if source and source != "metadata" else c
    return JudgeResult(score, rationale, c)


class KeywordRubricJudge:
    """The first rubric judge (rubric-v1, kept to measure against): keyword matching. Its
    root-cause verdict drifts from the gold labels (docs/evaluation.md): common words ("and",
    "not", "uses") credit a cause, any line number anywhere credits the location, and a
    substring credits the function."""

    name = "rubric-v1"

    def judge(self, bundle, explanation: str, diff: str, *, blast_score: float | None = None) -> JudgeResult:
        rc = root_cause(bundle)
        text = explanation or ""
        low = text.lower()
        c = {"function": bool(rc.get("function")) and rc["function"].lower() in low}
        line_text = (rc.get("line_text") or "").strip()
        c["location"] = bool(rc.get("line")) and (
            _mentions_line(text, rc["line"]) or (len(line_text) > 3 and line_text in text))
        tokens = [t.strip() for t in (rc.get("original"), rc.get("mutated")) if t and t.strip()]
        words = FAMILY_WORDS.get(rc.get("family", ""), ())
        c["cause"] = any(f"`{t}`" in text or f"'{t}'" in text or f'"{t}"' in text for t in tokens) or \
            any(w in low for w in words if len(w) > 2)
        c["root_cause_identified"] = bool(c["function"] and c["location"] and c["cause"])
        maint, m = _maintainability(bundle, diff, blast_score)
        root = (c["function"] + c["location"] + c["cause"]) / 3
        return _result(root, maint, {**c, **m}, rc)


# Precise wording that names a mutation operator without quoting its token. Generic words that
# occur in any prose ("and", "not", "condition", "uses") are deliberately absent.
OPERATOR_PHRASES = {
    "constant_plus_one": ("off-by-one", "off by one"), "constant_minus_one": ("off-by-one", "off by one"),
    "argument_swap": ("swapped argument", "arguments are swapped", "argument order", "arguments swapped"),
    "negation_add": ("spurious negation", "extra negation", "extra `not`", "should not be negated"),
    "negation_drop": ("missing negation", "missing `not`", "negation was dropped", "should be negated"),
}
_QUOTED = re.compile(r"`([^`\n]+)`|'([^'\n]+)'|\"([^\"\n]+)\"")
_LINES = re.compile(r"\b(?:lines?|l\.?)\s*(\d+)(?:\s*(-|to|and|,)\s*(\d+))?|\.py:(\d+)", re.I)
MAX_LINES, MAX_QUOTED = 2, 8          # more than this is a shotgun answer, not a diagnosis
MAX_CHARS = 4000                      # rubric-v3: a longer explanation is a shotgun answer (and unparsed)


def quoted_snippets(text: str) -> list[str]:
    return [next(g for g in m.groups() if g is not None).strip() for m in _QUOTED.finditer(text)]


def line_numbers(text: str) -> set[int]:
    out: set[int] = set()
    for a, sep, b, c in _LINES.findall(text):
        if c:
            out.add(int(c))
        elif a:
            lo, hi = int(a), int(b or a)
            if sep in ("-", "to") and hi >= lo:      # a range names every line in it
                out.update(range(lo, min(hi, lo + 50) + 1))
            else:
                out.update((lo, hi))
    return out


def fix_tokens(rc: dict) -> set[str]:
    """The wrong token and its correction ("not" for a negation whose other side is empty)."""
    toks = {t.strip() for t in (rc.get("original"), rc.get("mutated")) if t and t.strip()}
    return toks or ({"not"} if rc.get("family") == "negation" else set())


class RubricJudgeV2:
    """The second rubric judge (rubric-v2, kept to measure against). Root cause (half the score): names the function (a
    whole word), locates the fault (the line number, at most MAX_LINES lines named, or the faulty
    line's code quoted) and names the cause (the wrong token or its fix quoted, at most MAX_QUOTED
    quoted snippets, or a precise phrase for the operator: "off-by-one", "swapped arguments").
    `criteria["root_cause_identified"]` is the binary verdict calibrated against gold labels.
    Maintainability (the other half): minimal patch, no debug debris, no swallowed errors, no
    hard-coded test values. Measured against hand labels it missed natural explanations that
    quote an expression (`return False` should be `return True`) rather than the bare token, and
    a bare token is cheap to hit by quoting every token of the line (docs/evaluation.md)."""

    name = "rubric-v2"

    def judge(self, bundle, explanation: str, diff: str, *, blast_score: float | None = None) -> JudgeResult:
        rc = root_cause(bundle)
        text = explanation or ""
        fn = rc.get("function") or ""
        c = {"function": bool(fn) and re.search(rf"(?<![\w.]){re.escape(fn)}(?!\w)", text, re.I) is not None}
        lines, quoted = line_numbers(text), quoted_snippets(text)
        line_text = (rc.get("line_text") or "").strip()
        c["location"] = bool(rc.get("line")) and (
            (rc["line"] in lines and len(lines) <= MAX_LINES)
            or (len(line_text) > 3 and any(line_text in q for q in quoted)))
        tokens = fix_tokens(rc)
        distinct = set(quoted)
        c["cause"] = (bool(tokens & distinct) and len(distinct) <= MAX_QUOTED) or any(
            p in text.lower() for p in OPERATOR_PHRASES.get(rc.get("operator", ""), ()))
        c["root_cause_identified"] = bool(c["function"] and c["location"] and c["cause"])
        maint, m = _maintainability(bundle, diff, blast_score)
        root = (c["function"] + c["location"] + c["cause"]) / 3
        return _result(root, maint, {**c, **m}, rc)


# ------------------------------------------------------------ rubric-v3: claims about the fix
# The explanation's evidence (each quoted snippet, each pair of adjacent snippets, each operator
# phrase) is checked against the space of single-token fixes of the buggy file (the suite's own
# operator table), so hedging between candidate fixes is caught as well as a missing cause.
_BACKTICKS = re.compile(r"`([^`\n]+)`")
_PLAIN_QUOTES = re.compile(r"(?<!\w)'([^'\n]+)'(?!\w)|(?<!\w)\"([^\"\n]+)\"(?!\w)")
_LINE_REFS = re.compile(r"\blines?\b\s*(\d+(?:(?:\s*(?:,|\band\b|\bor\b|&))+\s*\d+|\s*(?:-|–|\bto\b)\s*\d+)*)"
                        r"|\.py:(\d+)", re.I)
_NOT = r"[`'\"]not[`'\"]"
V3_PHRASES = (  # (wording, the operators it names); "boundary" = `<`/`<=` or `>`/`>=` swapped
    (r"\boff[- ]by[- ]one\b", {"constant_plus_one", "constant_minus_one", "boundary"}),
    (r"\bswapped arguments?\b|\barguments? (?:are |were )?swapped\b|\bargument order\b", {"argument_swap"}),
    (r"\b(?:spurious|extra|redundant) negation\b|\bshould not be negated\b"
     rf"|\b(?:drop|remove|delete|spurious|extra|redundant)\s+(?:the\s+|an?\s+)?{_NOT}", {"negation_add"}),
    (r"\bmissing negation\b|\bnegation (?:was|is) dropped\b|\bshould be negated\b"
     rf"|\b(?:missing|add|insert)\s+(?:the\s+|an?\s+)?{_NOT}", {"negation_drop"}),
)


def squash(code: str) -> str:
    """Code compared without whitespace (`a<=b` and `a <= b` are the same claim)."""
    return re.sub(r"\s+", "", code)


def v3_quotes(text: str) -> list[str]:
    """Quoted snippets in order: backtick spans, then single/double quotes outside them whose
    quote marks are not glued to a word (so "it's" and "tests'" are not quotes)."""
    found = [(m.start(), m.group(1)) for m in _BACKTICKS.finditer(text)]
    masked = _BACKTICKS.sub(lambda m: "\n" * len(m.group(0)), text)
    found += [(m.start(), m.group(1) or m.group(2)) for m in _PLAIN_QUOTES.finditer(masked)]
    return [q for _, q in sorted(found) if squash(q)]


def v3_lines(text: str) -> set[int]:
    """Line numbers named: "line 7", "lines 3-5, 9 and 12" (a range names every line in it),
    "solution.py:7"."""
    out: set[int] = set()
    for m in _LINE_REFS.finditer(text):
        if m.group(2):
            out.add(int(m.group(2)))
            continue
        prev, span = None, False
        for tok in re.findall(r"\d+|-|–|\bto\b", m.group(1), re.I):
            if not tok.isdigit():
                span = True
                continue
            n = int(tok)
            out.update(range(prev, min(n, prev + 50) + 1) if span and prev is not None and n >= prev else (n,))
            prev, span = n, False
    return out


def _squashed_edit(lines: list[str], n: int, col: int, end: int, new: str) -> tuple:
    """(line, squashed line before, span start, span end, squashed new text, squashed line after)."""
    before = squash(lines[n - 1])
    a, b, s = len(squash(lines[n - 1][:col])), len(squash(lines[n - 1][:end])), squash(new)
    return n, before, a, b, s, before[:a] + s + before[b:]


@lru_cache(maxsize=1024)
def fix_space(source: str, line: int, col: int, end: int, original: str, mutated: str):
    """(squashed buggy lines, the recorded fix, every other single-token edit of the file), or
    None when the recorded root cause does not match the source."""
    from sandboxes.humaneval.operators import all_edits

    lines = source.splitlines()
    if not 1 <= line <= len(lines) or lines[line - 1][col:end] != mutated:
        return None
    true = _squashed_edit(lines, line, col, end, original)
    try:
        edits = all_edits(source)
    except SyntaxError:
        edits = []
    others = [e for e in (_squashed_edit(lines, x.line, x.col, x.end_col, x.new) for x in edits)
              if (e[0], e[5]) != (true[0], true[5])]
    return tuple(squash(x) for x in lines), true, tuple(others)


def _around(p: str, q: str, e: tuple) -> bool:
    """p is a stretch of the buggy line covering e's span and q is that stretch after e."""
    _, before, a, b, new, _ = e
    i = before.find(p)
    while i != -1:
        if i <= a and i + len(p) >= b and p[:a - i] + new + p[b - i:] == q:
            return True
        i = before.find(p, i + 1)
    return False


def operator_names(rc: dict) -> set[str]:
    names = {rc.get("operator", "")}
    if {(rc.get("original") or "").strip(), (rc.get("mutated") or "").strip()} in ({"<", "<="}, {">", ">="}):
        names.add("boundary")
    return names


def truth_space(bundle, rc: dict):
    """fix_space of the task's buggy file, or None (no recorded root cause, or it does not match)."""
    src = task_source(bundle, rc.get("file") or "solution.py")
    if not src or not rc.get("line") or rc.get("col") is None or rc.get("end_col") is None:
        return None
    return fix_space(src, rc["line"], rc["col"], rc["end_col"], rc.get("original") or "", rc.get("mutated") or "")


def fix_claims(space, rc: dict, text: str, quotes: list[str]) -> tuple[bool, bool]:
    """(right, wrong): some evidence supports the recorded fix; some supports only other edits."""
    right = wrong = False
    if space is not None:
        buggy, true, others = space
        snips = list(dict.fromkeys(squash(q) for q in quotes))
        fresh = {q for q in snips if not any(q in l for l in buggy)}     # code the file lacks

        def supports(ev, e):
            return ev[0] in fresh and ev[0] in e[5] if len(ev) == 1 else \
                _around(ev[0], ev[1], e) or _around(ev[1], ev[0], e)

        sq = [squash(q) for q in quotes]
        for ev in [(q,) for q in snips] + [(p, q) for p, q in zip(sq, sq[1:]) if p != q]:
            if supports(ev, true):
                right = True
            elif any(supports(ev, e) for e in others):
                wrong = True
    low, names = text.lower(), operator_names(rc)
    for pattern, ops in V3_PHRASES:
        if re.search(pattern, low):
            right, wrong = right or bool(ops & names), wrong or not ops & names
    return right, wrong


class RubricJudge:
    """The embedded rubric judge (rubric-v3, the default). Root cause (half the score): names the
    function (a whole word); locates the fault (names the faulty line's number, or names no line
    and quotes the line's code); and states the fix: some evidence is right and none is wrong. Evidence is a
    quoted snippet (right when it is code only the recorded fix produces: in the fixed line, in
    no line of the buggy file), a pair of adjacent quoted snippets (right when one is a stretch
    of the buggy line around the wrong token and the other is that stretch fixed, in either
    order) or an operator phrase ("off-by-one", "swapped arguments", "drop the `not`"). Evidence
    that supports another single-token edit of the file (and not the recorded one) is wrong: a
    list of candidate fixes earns nothing. A shotgun answer (more than MAX_QUOTED distinct
    snippets, more than MAX_LINES lines named or whole lines quoted, more than MAX_CHARS
    characters) earns neither location nor cause. Quoting the faulty line or the wrong token alone locates, but states no fix.
    Maintainability (the other half) as rubric-v2. Deterministic; never the acceptance test."""

    name = "rubric-v3"

    def judge(self, bundle, explanation: str, diff: str, *, blast_score: float | None = None) -> JudgeResult:
        rc = root_cause(bundle)
        text = explanation or ""
        fn = rc.get("function") or ""
        c = {"function": bool(fn) and re.search(rf"(?<![\w.]){re.escape(fn)}(?!\w)", text, re.I) is not None}
        short = len(text) <= MAX_CHARS
        lines, quotes = (v3_lines(text), v3_quotes(text)) if short else (set(), [])
        code, space = squash(rc.get("line_text") or ""), truth_space(bundle, rc)
        src = task_source(bundle, rc.get("file") or "solution.py") or ""
        # whole lines of code (a one-word line, e.g. a doctest's `True`, is a token, not a line)
        whole = {x for x in map(squash, src.splitlines()) if len(x) > 3 and not re.fullmatch(r"\w+", x)}
        whole |= {space[1][5]} if space else set()
        sq = {squash(q) for q in quotes}
        c["focused"] = short and len(sq) <= MAX_QUOTED and len(lines) <= MAX_LINES and len(sq & whole) <= MAX_LINES
        c["location"] = c["focused"] and bool(rc.get("line")) and (
            rc["line"] in lines or (not lines and len(code) > 3 and any(code in q for q in sq)))
        right, wrong = fix_claims(space, rc, text, quotes) if rc.get("line") and c["focused"] else (False, False)
        c["no_wrong_claim"] = not wrong
        c["cause"] = c["focused"] and right and not wrong
        c["root_cause_identified"] = bool(c["function"] and c["location"] and c["cause"])
        maint, m = _maintainability(bundle, diff, blast_score)
        root = (c["function"] + c["location"] + c["cause"]) / 3
        return _result(root, maint, {**c, **m}, rc)


def _hardcodes_tests(added: str, bundle) -> bool:
    """An added `if x == <literal from the tests>` special-cases the tests instead of fixing."""
    tests = "\n".join(v for k, v in bundle.files.items() if "test" in k.rsplit("/", 1)[-1])
    for m in re.finditer(r"(==|\bin)\s*(\[[^\]]{3,}\]|\"[^\"]{3,}\"|'[^']{3,}'|-?\d{3,})", added):
        if m.group(2) in tests:
            return True
    return False


def cohen_kappa(a, b) -> float:
    """Cohen's kappa between two raters' labels (any hashable categories, same length).

    1.0 perfect agreement, 0.0 chance level. When both raters use a single identical category
    (expected agreement 1) kappa is defined here as 1.0 if they agree everywhere.
    """
    a, b = list(a), list(b)
    if len(a) != len(b) or not a:
        raise ValueError("cohen_kappa needs two non-empty label lists of equal length")
    n = len(a)
    cats = sorted(set(a) | set(b), key=repr)
    po = sum(x == y for x, y in zip(a, b)) / n
    pe = sum((a.count(c) / n) * (b.count(c) / n) for c in cats)
    if pe == 1.0:
        return 1.0 if po == 1.0 else 0.0
    return (po - pe) / (1 - pe)


def make_judge(cfg: dict | None = None) -> Judge:
    """A judge from plain config (picklable, so pool workers can build their own):
    {"kind": "rubric"} (the default, rubric-v3; also "rubric-v3"), {"kind": "rubric-v2"}, {"kind": "rubric-v1"}
    (the older rubric judges, kept to measure against) or {"kind": "openai", "base_url", "model", ...}."""
    cfg = dict(cfg or {})
    kind = cfg.pop("kind", "rubric")
    if kind in ("rubric", "rubric-v3"):
        return RubricJudge()
    if kind == "rubric-v2":
        return RubricJudgeV2()
    if kind == "rubric-v1":
        return KeywordRubricJudge()
    if kind == "openai":
        return OpenAIJudge(**cfg)
    raise ValueError(f"unknown judge kind {kind!r}: 'rubric' (rubric-v3), 'rubric-v2', 'rubric-v1' or 'openai'")


# ------------------------------------------------------------------------ OpenAI-compatible judge
JUDGE_FILES = Path(__file__).with_name("judge_files")


class JudgeError(RuntimeError):
    """The judge could not grade (endpoint down, malformed reply): the episode is an infra
    failure, never a zero (RepairEnv turns a raising judge into one)."""


@dataclass
class OpenAIJudge:
    """An LLM judge behind any OpenAI-compatible `/chat/completions` endpoint (OpenAI, vLLM,
    llama.cpp, LM Studio...). Prompt and rubric are files (`judge_files/`); the reply must be
    {"root_cause": 0..1, "maintainability": 0..1, "rationale": str}; score = their mean.
    It sees what a reviewer sees (issue, diff, explanation), not the task's ground truth."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_chars: int = 12000
    prompt_path: str = str(JUDGE_FILES / "prompt.md")
    rubric_path: str = str(JUDGE_FILES / "rubric.md")

    @property
    def name(self) -> str:
        return f"openai:{self.model}"

    def messages(self, bundle, explanation: str, diff: str) -> list[dict]:
        system = Path(self.prompt_path).read_text() + "\n\n" + Path(self.rubric_path).read_text()
        user = (f"## Issue\n{bundle.issue_title}\n\n{bundle.issue_body}\n\n"
                f"## Diff\n```diff\n{diff[:self.max_chars]}\n```\n\n"
                f"## Root-cause explanation\n{(explanation or '(none)')[:self.max_chars]}")
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def judge(self, bundle, explanation: str, diff: str, *, blast_score: float | None = None) -> JudgeResult:
        import json
        import os
        import urllib.error
        import urllib.request

        body = {"model": self.model, "temperature": 0, "messages": self.messages(bundle, explanation, diff)}
        headers = {"Content-Type": "application/json"}
        if os.environ.get(self.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"
        req = urllib.request.Request(self.base_url.rstrip("/") + "/chat/completions",
                                     data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                reply = json.loads(resp.read().decode())
            content = reply["choices"][0]["message"]["content"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeError(f"judge {self.name} at {self.base_url}: {type(e).__name__}: {e}") from e
        return parse_verdict(content, self.name)


def parse_verdict(content: str, name: str = "judge") -> JudgeResult:
    """The first JSON object in the reply -> JudgeResult (JudgeError when absent or out of range)."""
    import json

    m = re.search(r"\{.*\}", content or "", re.S)
    try:
        d = json.loads(m.group(0)) if m else None
        rc, mt = float(d["root_cause"]), float(d["maintainability"])
    except (ValueError, TypeError, KeyError) as e:
        raise JudgeError(f"judge {name} replied without a valid verdict: {content[:200]!r}") from e
    if not (0.0 <= rc <= 1.0 and 0.0 <= mt <= 1.0):
        raise JudgeError(f"judge {name} scores out of 0..1: {rc}, {mt}")
    return JudgeResult(round(0.5 * rc + 0.5 * mt, 4), str(d.get("rationale", ""))[:1000],
                       {"root_cause": rc, "maintainability": mt})
