"""Spectrum-based fault localisation (SBFL) from per-test line coverage and outcomes.

Pure function over plain data, so it works with any runtime that reports
`{test_id: {file: set(lines)}}` coverage. Formulas (ef/ep: failing/passing tests covering the
line, nf: failing tests not covering it, F/P: total failing/passing):

    ochiai    ef / sqrt(F * (ef + ep))
    tarantula (ef/F) / (ef/F + ep/P)
    dstar     ef**2 / (ep + nf)          (D* with * = 2; infinite when ep + nf == 0)
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from fnmatch import fnmatchcase

PASSED = {"passed", "pass", "xpassed", "ok", "success"}


@dataclass(frozen=True)
class Suspicious:
    file: str
    line: int
    score: float


def is_pass(outcome) -> bool:
    """True for a passing outcome (bool True or a pytest-style 'passed'); skips count as not run."""
    if isinstance(outcome, bool):
        return outcome
    return str(outcome).lower() in PASSED


def _score(formula: str, ef: int, ep: int, F: int, P: int) -> float:
    nf = F - ef
    if formula == "ochiai":
        return ef / math.sqrt(F * (ef + ep)) if ef else 0.0
    if formula == "tarantula":
        if not ef:
            return 0.0
        fr, pr = ef / F, (ep / P if P else 0.0)
        return fr / (fr + pr)
    if formula == "dstar":
        if not ef:
            return 0.0
        return math.inf if ep + nf == 0 else ef ** 2 / (ep + nf)
    raise ValueError(f"unknown formula {formula!r} (ochiai, tarantula, dstar)")


def localize(coverage: dict[str, dict[str, set[int]]], outcomes: dict, *, formula: str = "ochiai",
             exclude: tuple[str, ...] = (), top: int | None = None) -> list[Suspicious]:
    """Rank covered lines by suspiciousness (highest first; ties by file, line).

    Tests without an outcome are ignored; skipped tests count neither way. `exclude` drops files
    matching fnmatch globs (e.g. the test files themselves). With no failing test every score is
    0 and the ranking carries no information; the list is still returned in file/line order.
    """
    skipped = {t for t, o in outcomes.items() if str(o).lower() in {"skipped", "deselected"}}
    tests = [t for t in outcomes if t not in skipped]
    fails = {t for t in tests if not is_pass(outcomes[t])}
    F, P = len(fails), len(tests) - len(fails)
    ef: dict[tuple[str, int], int] = defaultdict(int)
    ep: dict[tuple[str, int], int] = defaultdict(int)
    for t in tests:
        for file, lines in (coverage.get(t) or {}).items():
            if any(fnmatchcase(file, g) for g in exclude):
                continue
            counter = ef if t in fails else ep
            for ln in set(lines):
                counter[(file, int(ln))] += 1
    keys = set(ef) | set(ep)
    ranked = [Suspicious(f, ln, _score(formula, ef[(f, ln)], ep[(f, ln)], F, P)) for f, ln in keys]
    ranked.sort(key=lambda s: (-s.score, s.file, s.line))
    return ranked[:top] if top is not None else ranked
