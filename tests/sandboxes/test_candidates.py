"""propose_edits / apply_candidate: the quick-fix list contains the inverse of every mutation."""
from __future__ import annotations

import ast

import pytest

from sandboxes.candidates import apply_candidate, propose_edits
from sandboxes.humaneval import build_suite
from sandboxes.humaneval.operators import Edit

SRC = '''def f(xs, k):
    total = 0
    for i, x in enumerate(xs):
        if x < k and not i % 2 == 0:
            total += x * 2
    return max(total, k - 1)
'''


def _lines(line):
    return [c.new_line.strip() for c in propose_edits(SRC, line)]


def test_operator_constant_negation_and_variable_candidates():
    got = _lines(4)
    for expect in ("if x <= k and not i % 2 == 0:", "if x > k and not i % 2 == 0:",
                   "if x < k or not i % 2 == 0:", "if x < k and i % 2 == 0:",
                   "if x < k and not i % 2 != 0:", "if x < k and not i // 2 == 0:",
                   "if x < k and not i % 3 == 0:", "if x < k and not i % 2 == 1:",
                   "if not x < k and not i % 2 == 0:", "if total < k and not i % 2 == 0:"):
        assert expect in got, expect
    assert "return max(k - 1, total)" in _lines(6)          # argument swap
    assert "return max(total, k + 1)" in _lines(6)          # arithmetic swap
    assert "return max(total, k - 0)" in _lines(6)          # constant -1
    assert "total -= x * 2" in _lines(5)                    # augmented assignment swap


def test_candidates_are_indexed_deterministic_and_parse():
    cands = propose_edits(SRC, 4)
    assert [c.index for c in cands] == list(range(len(cands)))
    assert cands == propose_edits(SRC, 4)
    assert len({c.new_line for c in cands}) == len(cands)    # no duplicate results
    for c in cands:
        new = apply_candidate(SRC, 4, c.index)
        ast.parse(new)
        assert new.splitlines()[3] == c.new_line and new != SRC
        assert c.description
    # variable swaps come after the operator edits on a line
    fams = [c.family for c in cands]
    assert "variable" in fams and fams == sorted(fams, key=lambda f: f == "variable")


def test_out_of_range_and_unparsable():
    assert propose_edits(SRC, 99) == [] and propose_edits("def f(:\n", 1) == []
    assert propose_edits(SRC, 1) == []          # a `def` line has no operator to change
    on_last = propose_edits(SRC, 6)            # `return max(total, k - 1)`: the constant and the sign
    assert on_last and all(c.line == 6 for c in on_last)
    with pytest.raises(IndexError):
        apply_candidate(SRC, 4, 10_000)


def test_only_names_bound_so_far_are_swapped_in():
    src = "def g(a):\n    b = a + 1\n    c = b * 2\n    return c\n"
    swaps = {c.new for c in propose_edits(src, 2) if c.family == "variable"}
    assert swaps == {"b"}                       # `c` is only bound on line 3


def test_true_fix_among_candidates_on_a_suite_subset(tmp_path):
    suite = build_suite(seed=0, limit=12, per_problem=6, cache_dir=tmp_path)
    counts = []
    for t in suite.tasks:
        rc, sol = t.metadata["root_cause"], t.files["solution.py"]
        fixed = Edit.from_dict(t.metadata["fix"]).apply(sol)
        cands = propose_edits(sol, rc["line"])
        counts.append(len(cands))
        assert any(c.apply(sol) == fixed for c in cands), t.task_id
    assert 1 <= sum(counts) / len(counts) < 40


def test_the_host_parses_python_under_one_lock():
    """CPython 3.11's AST constructor shares its recursion depth between threads
    (python/cpython#106905: "SystemError: AST constructor recursion depth mismatch", seen once in
    7,200 demo --full episodes). Episodes step in threads, so the host's parsing goes through
    sandboxes.pyast, which holds one lock: a parse waits while another thread holds it."""
    import threading

    from sandboxes import candidates, pyast

    done = threading.Event()
    with pyast._LOCK:
        t = threading.Thread(target=lambda: (candidates.propose_edits("def f(a):\n    return a < 1\n", 2),
                                             done.set()))
        t.start()
        assert not done.wait(0.3)                   # blocked on the lock
    assert done.wait(10)
    t.join()
