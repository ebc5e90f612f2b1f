"""Statistics the gates need, over eval_episodes rows: seeds reduced per task first (a task
passes when the majority of its scored seeds pass), infrastructure failures counted apart,
then a paired bootstrap over tasks.

The majority rule and the bootstrap are the evaluation layer's (ratchet.evaluation.stats), so a
gate's interval is the same number the scorecard shows for the same rows and seed; this module
only adapts them to the gates (dicts per task, a confidence level instead of alpha).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

INFRA = "infra_failure"


def is_infra(row: Mapping) -> bool:
    return row.get("outcome") == INFRA


def scored(rows: Iterable[Mapping]) -> list[Mapping]:
    """Rows that count: infrastructure failures are never a zero, they are left out."""
    return [r for r in rows if not is_infra(r)]


def majority_by_task(rows: Iterable[Mapping]) -> dict[str, bool]:
    """task_id -> passed by a strict majority of its scored seeds. A task whose every seed was
    an infrastructure failure is absent (unscorable, not failed)."""
    from ratchet.evaluation.stats import task_outcomes

    return {str(t): v for t, v in task_outcomes(list(rows)).items() if v is not None}


def mean_by_task(rows: Iterable[Mapping], col: str) -> dict[str, float]:
    """task_id -> mean of `col` over its scored seeds where it is not null."""
    vals: dict[str, list[float]] = defaultdict(list)
    for r in scored(rows):
        if r.get(col) is not None:
            vals[str(r["task_id"])].append(float(r[col]))
    return {t: sum(v) / len(v) for t, v in vals.items()}


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


@dataclass(frozen=True)
class PairedCI:
    n: int              # paired units (tasks)
    diff: float         # observed mean difference (candidate - champion)
    low: float
    high: float
    level: float
    n_boot: int
    seed: int


def paired_bootstrap(cand: Sequence[float], champ: Sequence[float], *, n_boot: int = 2000,
                     level: float = 0.95, seed: int = 0) -> PairedCI:
    """Percentile CI of mean(cand - champ), resampling the paired units with replacement.
    Deterministic for a seed. Raises on no pairs (there is nothing to estimate)."""
    from ratchet.evaluation.stats import bootstrap_ci

    if len(cand) != len(champ):
        raise ValueError(f"paired bootstrap needs equal lengths, got {len(cand)} and {len(champ)}")
    if not cand:
        raise ValueError("paired bootstrap over zero units")
    iv = bootstrap_ci([float(a) - float(b) for a, b in zip(cand, champ)], n_boot=n_boot, seed=seed, alpha=1.0 - level)
    return PairedCI(n=iv.n, diff=iv.estimate, low=iv.lo, high=iv.hi, level=level, n_boot=n_boot, seed=seed)
