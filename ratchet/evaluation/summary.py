"""`eval_summary` rows from `eval_episodes` rows: per policy x checkpoint, over the whole holdout
(dimension "all") and per slice value of each key dimension.

Definitions (also in docs/evaluation.md):
* task pass = a strict majority of the task's scored seeds passed (`stats.majority_pass`);
* pass rate = passed tasks / scored tasks, with a seeded 95% bootstrap CI over tasks; a task
  whose every seed was an infra failure is outside the denominator and counted in `tasks_infra`;
  the display string names both ("310 / 400 tasks; 2 tasks infra-failed, excluded");
* episode rates (hard-gate violations, human intervention, latency, turns) are over scored
  episodes; infra-failed episodes are counted apart (`episodes_infra`);
* seed spread: per-seed episode pass rates, their sample std and range (run-to-run variance,
  which the bootstrap over tasks does not measure);
* paired difference to the baseline: majority-of-seeds pass, candidate minus baseline, over the
  tasks both scored under the same environment digest, with a paired bootstrap CI.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from datetime import datetime, timezone
from typing import Iterable, Mapping, Sequence

from ratchet.evaluation import stats

DIMENSIONS = ("family", "difficulty", "category", "tenant_id", "slice")
NO_VALUE = "(none)"


def suite_digest(rows: Iterable[Mapping]) -> str:
    """One digest for the environments of a set of episodes: sha256 over sorted (task, digest)."""
    pairs = sorted({(r["task_id"], r["environment_digest"]) for r in rows})
    return "sha256:" + hashlib.sha256("\n".join(f"{t} {d}" for t, d in pairs).encode()).hexdigest()


def _by_task_digest(rows: Iterable[Mapping]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in rows:
        if out.setdefault(r["task_id"], r["environment_digest"]) != r["environment_digest"]:
            raise ValueError(f"task {r['task_id']} was evaluated under two environment digests in one "
                             "summary: results are only comparable under the same digest; filter first")
    return out


def display(passed: int, scored: int, infra: int, unit: str = "tasks") -> str:
    s = f"{passed:,} / {scored:,} {unit}"
    if infra:
        s += f"; {infra:,} {unit if infra != 1 else unit.rstrip('s')} infra-failed, excluded"
    return s


def _rate(n: int, d: int) -> float | None:
    return n / d if d else None


def summarise_rows(rows: Sequence[Mapping], baseline: Sequence[Mapping] | None = None, *,
                   n_boot: int = stats.N_BOOT, ci_seed: int = 0) -> dict:
    """The figures of one group of episodes (one policy, one slice)."""
    outcomes = stats.task_outcomes(rows)
    scored = [v for v in outcomes.values() if v is not None]
    ci = stats.bootstrap_ci([float(v) for v in scored], n_boot=n_boot, seed=ci_seed)
    n_passed, n_infra_tasks = sum(scored), sum(v is None for v in outcomes.values())
    ok = [r for r in rows if r["outcome"] != "infra_failure"]
    spread = stats.seed_spread(rows)
    out = {
        "seeds": sorted({int(r["seed"]) for r in rows}),
        "tasks": len(outcomes), "tasks_scored": len(scored), "tasks_passed": int(n_passed),
        "tasks_infra": n_infra_tasks,
        "pass_rate": ci.estimate, "pass_rate_ci_lo": ci.lo, "pass_rate_ci_hi": ci.hi,
        "pass_rate_display": display(int(n_passed), len(scored), n_infra_tasks),
        "episodes": len(rows), "episodes_scored": len(ok), "episodes_infra": len(rows) - len(ok),
        "episodes_passed": sum(bool(r["passed"]) for r in ok),
        "seed_pass_rates": {str(k): v for k, v in spread.per_seed.items()},
        "seed_std": spread.std, "seed_range": spread.range,
        "hard_gate_episodes": sum(int(r["hard_gate_violations"] or 0) > 0 for r in ok),
        "human_intervention_episodes": sum(bool(r["human_intervention"]) for r in ok),
        "latency_p50_s": stats.quantile([r["latency_s"] for r in ok], 0.5),
        "latency_p95_s": stats.quantile([r["latency_s"] for r in ok], 0.95),
        "mean_turns": sum(r["turns"] for r in ok) / len(ok) if ok else None,
        "mean_tool_calls": sum(r["tool_calls"] for r in ok) / len(ok) if ok else None,
        "mean_cost_usd": (sum(r["cost_usd"] for r in rows if r["cost_usd"] is not None)
                          / max(1, sum(r["cost_usd"] is not None for r in rows))) if rows else None,
        "n_boot": n_boot, "ci_seed": ci_seed,
    }
    out["hard_gate_rate"] = _rate(out["hard_gate_episodes"], len(ok))
    out["human_intervention_rate"] = _rate(out["human_intervention_episodes"], len(ok))
    out.update(diff_vs_baseline=None, diff_ci_lo=None, diff_ci_hi=None, diff_tasks=None)
    if baseline is not None:
        digest_c, digest_b = _by_task_digest(rows), _by_task_digest(baseline)
        same = {t for t in digest_c if digest_b.get(t) == digest_c[t]}
        base_out = {t: v for t, v in stats.task_outcomes(baseline).items() if t in same}
        d = stats.paired_difference({t: v for t, v in outcomes.items() if t in same}, base_out,
                                    n_boot=n_boot, seed=ci_seed)
        out.update(diff_vs_baseline=d.estimate, diff_ci_lo=d.lo, diff_ci_hi=d.hi, diff_tasks=d.n)
    return out


def _value(r: Mapping, dim: str) -> str:
    v = r.get(dim)
    return NO_VALUE if v is None or v == "" else str(v)


def summary_rows(rows: Sequence[Mapping], *, baseline_policy_id: str | None = None,
                 baseline_rows: Sequence[Mapping] | None = None, dimensions: Sequence[str] = DIMENSIONS,
                 n_boot: int = stats.N_BOOT, ci_seed: int = 0, run_id: str | None = None,
                 computed_at: datetime | None = None, holdout_tasks: int | None = None) -> list[dict]:
    """eval_summary rows for every (policy_id, checkpoint_version) in `rows`: one "all" row and
    one per slice value of each dimension. The baseline's rows come from `rows` (its policy id)
    or `baseline_rows`; the baseline itself gets no difference. `holdout_tasks`: the locked
    holdout's size; an "all" row covering fewer tasks says so in its display."""
    at = computed_at or datetime.now(timezone.utc)
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        groups[(r["policy_id"], r.get("checkpoint_version") or "")].append(r)
    base = list(baseline_rows) if baseline_rows is not None else \
        [r for r in rows if r["policy_id"] == baseline_policy_id]
    out = []
    for (pid, ver), grp in sorted(groups.items()):
        is_base = pid == baseline_policy_id
        b_all = None if is_base or not base else base
        head = {"computed_at": at, "dagster_run_id": run_id, "policy_id": pid, "checkpoint_version": ver,
                "holdout_sha256": ",".join(sorted({r["holdout_sha256"] or "" for r in grp})),
                "baseline_policy_id": None if is_base else baseline_policy_id}
        parts = [("all", "all", grp, b_all)]
        for dim in dimensions:
            vals: dict[str, list] = defaultdict(list)
            for r in grp:
                vals[_value(r, dim)].append(r)
            for v, sub in sorted(vals.items()):
                b_sub = None if b_all is None else [r for r in b_all if _value(r, dim) == v]
                parts.append((dim, v, sub, b_sub))
        for dim, v, sub, b_sub in parts:
            row = {**head, "dimension": dim, "slice_value": v, "environment_digest": suite_digest(sub),
                   **summarise_rows(sub, b_sub, n_boot=n_boot, ci_seed=ci_seed), "holdout_tasks": None}
            if dim == "all" and holdout_tasks:
                row["holdout_tasks"] = holdout_tasks
                if row["tasks"] < holdout_tasks:    # a partial run must not read as the holdout's result
                    row["pass_rate_display"] += f" (only {row['tasks']:,} of {holdout_tasks:,} holdout tasks evaluated)"
            out.append(row)
    return out
