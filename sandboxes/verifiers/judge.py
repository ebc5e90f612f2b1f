"""R_judge: a pluggable Judge protocol and an embedded deterministic rubric judge.

The rubric judge grades a root-cause explanation and the patch's maintainability against the
task's ground truth (metadata). It is deterministic so it can be calibrated against gold labels
(`cohen_kappa`) and swapped for an LLM judge behind the same protocol. It is never the acceptance
test: R_tests is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

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


class RubricJudge:
    """Root cause (0.5): names the function, the line (number or code), and the kind of bug /
    the wrong token. Maintainability (0.5): minimal patch, no debug debris, no swallowed errors,
    no hard-coded test values."""

    name = "rubric-v1"

    def judge(self, bundle, explanation: str, diff: str, *, blast_score: float | None = None) -> JudgeResult:
        meta = bundle.metadata or {}
        rc = meta.get("root_cause", {})
        text = explanation or ""
        low = text.lower()
        c = {}
        c["function"] = bool(rc.get("function")) and rc["function"].lower() in low
        line_text = (rc.get("line_text") or "").strip()
        c["location"] = bool(rc.get("line")) and (
            _mentions_line(text, rc["line"]) or (len(line_text) > 3 and line_text in text))
        tokens = [t.strip() for t in (rc.get("original"), rc.get("mutated")) if t and t.strip()]
        words = FAMILY_WORDS.get(rc.get("family", ""), ())
        c["cause"] = any(f"`{t}`" in text or f"'{t}'" in text or f'"{t}"' in text for t in tokens) or \
            any(w in low for w in words if len(w) > 2)
        added = "\n".join(l for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++"))
        c["minimal"] = blast_score if blast_score is not None else (1.0 if diff.strip() else 0.0)
        c["no_debris"] = DEBRIS.search(diff) is None
        c["no_swallow"] = SWALLOW.search(diff) is None
        c["no_hardcode"] = not _hardcodes_tests(added, bundle)
        root = (c["function"] + c["location"] + c["cause"]) / 3
        maint = 0.4 * c["minimal"] + 0.2 * c["no_debris"] + 0.2 * c["no_swallow"] + 0.2 * c["no_hardcode"]
        if not diff.strip():
            maint = 0.0
        score = round(0.5 * root + 0.5 * maint, 4)
        missed = [k for k, v in c.items() if v is False or (k == "minimal" and v < 1.0)]
        rationale = (f"root cause {root:.2f} (function={c['function']}, location={c['location']}, "
                     f"cause={c['cause']}); maintainability {maint:.2f}"
                     + (f"; missed: {', '.join(missed)}" if missed else ""))
        return JudgeResult(score, rationale, c)


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
