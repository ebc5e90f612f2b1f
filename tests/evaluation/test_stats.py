"""Statistics against hand-computed cases, exact bootstrap enumeration and scikit-learn / scipy."""
import random

import numpy as np
import pytest

from ratchet.evaluation import stats

pytestmark = pytest.mark.evaluation


def test_bootstrap_constant_and_empty():
    iv = stats.bootstrap_ci([1, 1, 1])
    assert (iv.estimate, iv.lo, iv.hi, iv.n) == (1.0, 1.0, 1.0, 3)
    assert stats.bootstrap_ci([]) == stats.Interval(None, None, None, 0)


def test_bootstrap_matches_the_exact_resampling_distribution():
    # x = [0,1,1,1,1]: a resample's mean is k/5 with k ~ Binomial(5, 0.8).
    # P(k<=1) = 0.0067 < 0.025 <= P(k<=2) = 0.0579 -> lower 2.5% point 0.4;
    # P(k<=4) = 0.672 < 0.975 -> upper point 1.0.
    iv = stats.bootstrap_ci([0, 1, 1, 1, 1], n_boot=20000, seed=3)
    assert iv.estimate == pytest.approx(0.8)
    assert (iv.lo, iv.hi) == (pytest.approx(0.4), pytest.approx(1.0))


def test_bootstrap_is_seeded_and_agrees_with_scipy():
    from scipy.stats import bootstrap

    rng = random.Random(1)
    x = [rng.random() for _ in range(200)]     # continuous: different seeds differ
    a = stats.bootstrap_ci(x, seed=7)
    assert a == stats.bootstrap_ci(x, seed=7)          # same seed, same interval
    assert a != stats.bootstrap_ci(x, seed=8)
    ref = bootstrap((np.array(x),), np.mean, method="percentile", n_resamples=20000,
                    random_state=np.random.default_rng(0)).confidence_interval
    assert a.lo == pytest.approx(ref.low, abs=0.01) and a.hi == pytest.approx(ref.high, abs=0.01)
    assert a.lo < a.estimate < a.hi


@pytest.mark.parametrize("votes,expected", [
    ([True, True, False], True), ([False, False, True], False), ([True, False, None], False),
    ([True, None, None], True), ([None, None, None], None), ([True, True, True], True), ([], None)])
def test_majority_of_scored_seeds(votes, expected):
    assert stats.majority_pass(votes) is expected


def _row(task, seed, outcome):
    return {"task_id": task, "seed": seed, "outcome": outcome, "passed": outcome == "pass"}


def test_task_outcomes_and_seed_spread_by_hand():
    rows = [_row("a", 0, "pass"), _row("a", 1, "pass"), _row("a", 2, "fail"),
            _row("b", 0, "fail"), _row("b", 1, "pass"), _row("b", 2, "infra_failure"),
            _row("c", 0, "infra_failure"), _row("c", 1, "infra_failure"), _row("c", 2, "infra_failure"),
            _row("d", 0, "pass"), _row("d", 1, "fail"), _row("d", 2, "fail")]
    assert stats.task_outcomes(rows) == {"a": True, "b": False, "c": None, "d": False}
    sp = stats.seed_spread(rows)
    # seed 0: a pass, b fail, d pass -> 2/3; seed 1: a, b pass, d fail -> 2/3; seed 2: a fail, d fail -> 0
    assert sp.per_seed == {0: pytest.approx(2 / 3), 1: pytest.approx(2 / 3), 2: 0.0}
    assert sp.range == pytest.approx(2 / 3)
    assert sp.std == pytest.approx(float(np.std([2 / 3, 2 / 3, 0.0], ddof=1)))


def test_paired_difference_uses_only_tasks_both_scored():
    cand = {"a": True, "b": True, "c": False, "d": None}
    base = {"a": False, "b": True, "c": False, "d": True, "e": True}
    iv = stats.paired_difference(cand, base, n_boot=5000, seed=0)
    assert iv.n == 3 and iv.estimate == pytest.approx(1 / 3)
    assert iv.lo == pytest.approx(0.0) and iv.hi == pytest.approx(1.0)


def test_kappa_by_hand_and_degenerate():
    # po = 3/4; pe = 0.5*0.25 + 0.5*0.75 = 0.5 -> kappa = 0.5
    assert stats.cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert stats.cohen_kappa([1, 1, 1], [1, 1, 1]) == 1.0
    assert stats.cohen_kappa([0, 1], [1, 0]) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        stats.cohen_kappa([1], [1, 0])


def test_kappa_matches_sklearn():
    from sklearn.metrics import cohen_kappa_score

    rng = random.Random(5)
    for cats in (2, 3, 4):
        a = [rng.randrange(cats) for _ in range(150)]
        b = [x if rng.random() < 0.7 else rng.randrange(cats) for x in a]
        assert stats.cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b), abs=1e-12)


def test_kappa_ci_is_seeded_and_brackets_the_estimate():
    rng = random.Random(2)
    a = [rng.random() < 0.5 for _ in range(120)]
    b = [x if rng.random() < 0.9 else not x for x in a]
    iv = stats.kappa_ci(a, b, seed=1)
    assert iv == stats.kappa_ci(a, b, seed=1)
    assert iv.lo < iv.estimate < iv.hi and iv.n == 120
    assert 0.5 < iv.lo and iv.hi <= 1.0


def test_quantile():
    assert stats.quantile([1, 2, 3, 4], 0.5) == 2.5
    assert stats.quantile([], 0.5) is None
