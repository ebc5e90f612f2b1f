"""Statistics the gates need, over eval_episodes rows: seeds reduced per task first (a task
passes when the majority of its scored seeds pass), infrastructure failures counted apart,
then a paired bootstrap over tasks.

ratchet/evaluation/stats.py (the evaluation layer) did not exist when this was written; this
module keeps its own small seeded bootstrap so the gates are testable on their own.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

INFRA = "infra_failure"


def is_infra(row: Mapping) -> bool:
    return row.get("outcome") == INFRA


def scored(rows: Iterable[Mapping]) -> list[Mapping]:
    """Rows that count: infrastructure failures are never a zero, they are left out."""
    return [r for r in rows if not is_infra(r)]


def majority_by_task(rows: Iterable[Mapping]) -> dict[str, bool]:
    """task_id -> passed by a strict majority of its scored seeds. A task whose every seed was
    an infrastructure failure is absent (unscorable, not failed)."""
    seeds: dict[str, list[bool]] = defaultdict(list)
    for r in scored(rows):
        seeds[str(r["task_id"])].append(bool(r["passed"]))
    return {t: 2 * sum(v) > len(v) for t, v in seeds.items()}


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
    import numpy as np

    if len(cand) != len(champ):
        raise ValueError(f"paired bootstrap needs equal lengths, got {len(cand)} and {len(champ)}")
    if not cand:
        raise ValueError("paired bootstrap over zero units")
    d = np.asarray(cand, dtype=float) - np.asarray(champ, dtype=float)
    rng = np.random.default_rng(seed)
    # Resampling in chunks bounds memory at ~8 MB whatever n_boot x n is.
    chunk = max(1, 1_000_000 // len(d))
    means = np.concatenate([d[rng.integers(0, len(d), size=(min(chunk, n_boot - i), len(d)))].mean(axis=1)
                            for i in range(0, n_boot, chunk)])
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return PairedCI(n=len(d), diff=float(d.mean()), low=float(low), high=float(high), level=level,
                    n_boot=n_boot, seed=seed)
