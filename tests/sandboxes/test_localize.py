"""Spectrum-based fault localisation (Ochiai / Tarantula / DStar)."""
from __future__ import annotations

import math

import pytest

from sandboxes.localize import Suspicious, localize

pytestmark = pytest.mark.evaluation

# line 3 is the bug: covered by both failing tests and by no passing test
COV = {
    "t1": {"s.py": {1, 2, 3}},
    "t2": {"s.py": {1, 2, 3, 4}},
    "t3": {"s.py": {1, 2, 4}},
    "t4": {"s.py": {1, 2}, "test_s.py": {10}},
}
OUT = {"t1": "failed", "t2": "failed", "t3": "passed", "t4": True}


@pytest.mark.parametrize("formula", ["ochiai", "tarantula", "dstar"])
def test_faulty_line_ranks_first(formula):
    ranked = localize(COV, OUT, formula=formula)
    assert (ranked[0].file, ranked[0].line) == ("s.py", 3)
    scores = [s.score for s in ranked]
    assert scores == sorted(scores, reverse=True)


def test_ochiai_values():
    r = {(s.file, s.line): s.score for s in localize(COV, OUT)}
    assert r[("s.py", 3)] == pytest.approx(1.0)
    assert r[("s.py", 1)] == pytest.approx(2 / math.sqrt(2 * 4))
    assert r[("test_s.py", 10)] == 0.0


def test_exclude_top_and_ties():
    ranked = localize(COV, OUT, exclude=("test_*.py",), top=2)
    assert len(ranked) == 2 and all(s.file == "s.py" for s in ranked)
    tie = localize({"a": {"f": {5, 2}}}, {"a": "failed"})
    assert [s.line for s in tie] == [2, 5]       # equal scores: file, line order


def test_no_failures_and_skips():
    ranked = localize(COV, {k: "passed" for k in OUT})
    assert ranked and all(s.score == 0.0 for s in ranked)
    # a skipped test's coverage must not count as a pass
    with_skip = localize({**COV, "t5": {"s.py": {3}}}, {**OUT, "t5": "skipped"})
    assert with_skip == localize(COV, OUT)
    assert localize({}, {}) == []


def test_dstar_infinite_when_only_failures_cover_all_failing():
    r = localize({"a": {"f": {1}}, "b": {"f": {2}}}, {"a": "failed", "b": "passed"}, formula="dstar")
    assert r[0] == Suspicious("f", 1, math.inf)


def test_unknown_formula():
    with pytest.raises(ValueError):
        localize(COV, OUT, formula="nope")
