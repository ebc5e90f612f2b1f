"""Statistics over evaluation episodes: seeds are reduced per task first, then bootstrapped over
tasks (inspect_ai's `Epochs` then `stderr`).

* `majority_pass`: a task passes when a strict majority of its *scored* seeds pass; seeds that
  were infra failures do not vote, and a task with no scored seed is `None` (left out of every
  denominator and counted apart).
* `bootstrap_ci`: seeded percentile bootstrap over tasks (95% by default). It measures how much
  the rate depends on which tasks were drawn, not run-to-run variance: that is `seed_spread`.
* `paired_difference`: candidate minus baseline on the tasks both scored, resampling tasks
  jointly (the pairing removes the between-task variance that an unpaired CI would carry).
* `cohen_kappa` / `kappa_ci`: judge-vs-gold agreement with a bootstrap CI over items.

Pure numpy; every resample is drawn from `numpy.random.default_rng(seed)`, so the same inputs
and seed give the same interval.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

N_BOOT = 2000
ALPHA = 0.05


@dataclass(frozen=True)
class Interval:
    estimate: float | None       # None: nothing to estimate from (no scored items)
    lo: float | None
    hi: float | None
    n: int                       # items the estimate is over (the denominator)

    def as_dict(self, prefix: str) -> dict:
        return {prefix: self.estimate, f"{prefix}_ci_lo": self.lo, f"{prefix}_ci_hi": self.hi,
                f"{prefix}_n": self.n}


def _percentiles(samples: np.ndarray, alpha: float) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [alpha / 2, 1 - alpha / 2], method="linear")
    return float(lo), float(hi)


def bootstrap_ci(values: Sequence[float], *, n_boot: int = N_BOOT, seed: int = 0,
                 alpha: float = ALPHA) -> Interval:
    """Mean of `values` with a percentile bootstrap CI (resampling the values, i.e. tasks)."""
    x = np.asarray([float(v) for v in values], dtype=float)
    if x.size == 0:
        return Interval(None, None, None, 0)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    lo, hi = _percentiles(x[idx].mean(axis=1), alpha)
    return Interval(float(x.mean()), lo, hi, int(x.size))


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], *, n_boot: int = N_BOOT, seed: int = 0,
                      alpha: float = ALPHA) -> Interval:
    """mean(a) - mean(b) of two independent samples, with a percentile bootstrap CI (each sample
    resampled on its own; `n` is len(a)). For paired values use `paired_difference`."""
    x = np.asarray([float(v) for v in a], dtype=float)
    y = np.asarray([float(v) for v in b], dtype=float)
    if x.size == 0 or y.size == 0:
        return Interval(None, None, None, 0)
    rng = np.random.default_rng(seed)
    diffs = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1) - \
        y[rng.integers(0, y.size, size=(n_boot, y.size))].mean(axis=1)
    lo, hi = _percentiles(diffs, alpha)
    return Interval(float(x.mean() - y.mean()), lo, hi, int(x.size))


def majority_pass(votes: Iterable[bool | None]) -> bool | None:
    """Strict majority of the scored seeds (None = infra failure, no vote). 1 of 2 is a fail."""
    scored = [bool(v) for v in votes if v is not None]
    if not scored:
        return None
    return sum(scored) * 2 > len(scored)


def per_task(rows: Iterable[Mapping], key: str = "task_id") -> dict[str, list[bool | None]]:
    """Seed votes per task from eval_episodes rows (infra_failure -> None), in seed order."""
    out: dict[str, list[tuple[int, bool | None]]] = defaultdict(list)
    for r in rows:
        vote = None if r["outcome"] == "infra_failure" else bool(r["passed"])
        out[r[key]].append((int(r["seed"]), vote))
    return {t: [v for _, v in sorted(vs, key=lambda sv: sv[0])] for t, vs in out.items()}


def task_outcomes(rows: Iterable[Mapping]) -> dict[str, bool | None]:
    """task_id -> majority-of-seeds pass (None: every seed was an infra failure)."""
    return {t: majority_pass(v) for t, v in per_task(rows).items()}


@dataclass(frozen=True)
class SeedSpread:
    per_seed: dict                # seed -> pass rate over the tasks scored under that seed
    std: float | None             # sample standard deviation across seeds (ddof=1)
    range: float | None           # max - min

    def as_dict(self) -> dict:
        return {"seed_pass_rates": {str(k): v for k, v in self.per_seed.items()},
                "seed_std": self.std, "seed_range": self.range}


def seed_spread(rows: Iterable[Mapping]) -> SeedSpread:
    """Run-to-run variation: the per-seed episode pass rate (scored episodes only)."""
    by_seed: dict[int, list[bool]] = defaultdict(list)
    for r in rows:
        if r["outcome"] != "infra_failure":
            by_seed[int(r["seed"])].append(bool(r["passed"]))
    rates = {s: float(np.mean(v)) for s, v in sorted(by_seed.items()) if v}
    vals = np.array(list(rates.values()), dtype=float)
    std = float(vals.std(ddof=1)) if vals.size > 1 else None
    rng = float(vals.max() - vals.min()) if vals.size else None
    return SeedSpread(rates, std, rng)


def paired_difference(candidate: Mapping[str, bool | None], baseline: Mapping[str, bool | None], *,
                      n_boot: int = N_BOOT, seed: int = 0, alpha: float = ALPHA) -> Interval:
    """Mean (candidate - baseline) task pass over tasks both scored, with a paired bootstrap CI."""
    common = sorted(t for t in candidate.keys() & baseline.keys()
                    if candidate[t] is not None and baseline[t] is not None)
    d = [float(candidate[t]) - float(baseline[t]) for t in common]
    return bootstrap_ci(d, n_boot=n_boot, seed=seed, alpha=alpha)


# ------------------------------------------------------------------------------------ kappa
def _encode(a: Sequence, b: Sequence) -> tuple[np.ndarray, np.ndarray, int]:
    if len(a) != len(b) or len(a) == 0:
        raise ValueError("kappa needs two non-empty label lists of equal length")
    cats = {c: i for i, c in enumerate(sorted(set(a) | set(b), key=repr))}
    return (np.array([cats[x] for x in a]), np.array([cats[x] for x in b]), len(cats))


def _kappa_rows(ia: np.ndarray, ib: np.ndarray, k: int) -> np.ndarray:
    """Kappa of each row of two (m, n) label-index arrays (vectorised for the bootstrap).
    When expected agreement is 1 (both raters used one identical category) kappa is 1 if they
    agree everywhere, else 0 (scikit-learn returns nan there)."""
    n = ia.shape[1]
    po = (ia == ib).mean(axis=1)
    pe = np.zeros(ia.shape[0])
    for c in range(k):
        pe += (ia == c).sum(axis=1) / n * ((ib == c).sum(axis=1) / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = (po - pe) / (1.0 - pe)
    degenerate = np.isclose(pe, 1.0)
    kappa[degenerate] = np.where(np.isclose(po[degenerate], 1.0), 1.0, 0.0)
    return kappa


def cohen_kappa(a: Sequence, b: Sequence) -> float:
    ia, ib, k = _encode(a, b)
    return float(_kappa_rows(ia[None, :], ib[None, :], k)[0])


def kappa_ci(a: Sequence, b: Sequence, *, n_boot: int = N_BOOT, seed: int = 0,
             alpha: float = ALPHA) -> Interval:
    """Cohen's kappa with a percentile bootstrap CI over items (pairs resampled together)."""
    ia, ib, k = _encode(a, b)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ia.size, size=(n_boot, ia.size))
    lo, hi = _percentiles(_kappa_rows(ia[idx], ib[idx], k), alpha)
    return Interval(cohen_kappa(a, b), lo, hi, int(ia.size))


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default), None for no values."""
    x = [float(v) for v in values if v is not None]
    return float(np.quantile(x, q)) if x else None
