"""The scorecard: the reference scorecard's table (policies side by side, CIs and denominators,
economics) as Markdown, and a PNG (pass rate with 95% CI bars per policy, and per slice of one
dimension).

    md = scorecard_markdown(summary_rows, economics_rows, order=[...])
    scorecard_png(summary_rows, path, slice_dimension="family")
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ratchet.markdown import md_table

NA = "n/a"


def _pct(x: float | None, digits: int = 1) -> str:
    return NA if x is None else f"{100 * x:.{digits}f}%"


def _success(r: Mapping) -> str:
    if r.get("pass_rate") is None:
        return f"not computable ({r['pass_rate_display']})"
    return (f"{_pct(r['pass_rate'])} [{_pct(r['pass_rate_ci_lo'])}, {_pct(r['pass_rate_ci_hi'])}] "
            f"{r['pass_rate_display']}")


def _diff(r: Mapping) -> str:
    if r.get("baseline_policy_id") is None:
        return "baseline"
    if r.get("diff_vs_baseline") is None:
        return NA
    d = r["diff_vs_baseline"]
    return (f"{'+' if d >= 0 else ''}{100 * d:.1f} pts [{100 * r['diff_ci_lo']:+.1f}, {100 * r['diff_ci_hi']:+.1f}] "
            f"over {r['diff_tasks']} paired tasks vs {r['baseline_policy_id']}")


def _rate(r: Mapping, key: str, n_key: str) -> str:
    return NA if r.get(key) is None else f"{_pct(r[key])} ({r[n_key]} / {r['episodes_scored']} runs)"


def _secs(x: float | None) -> str:
    return NA if x is None else f"{x:.2f} s" if x < 10 else f"{x:.0f} s"


def policy_label(r: Mapping) -> str:
    ver = r.get("checkpoint_version")
    return r["policy_id"] + (f" @{ver}" if ver and not r["policy_id"].endswith(f"@{ver}") else "")


def scorecard_markdown(summary: Sequence[Mapping], economics: Sequence[Mapping] = (), *,
                       order: Sequence[str] | None = None, production_n: int | None = None) -> str:
    """The scorecard table from eval_summary rows (dimension "all") and economics rows."""
    alls = [r for r in summary if r["dimension"] == "all"]
    if order:
        rank = {p: i for i, p in enumerate(order)}
        alls.sort(key=lambda r: (rank.get(r["policy_id"], len(rank)), policy_label(r)))
    eco = {(e["policy_id"], e.get("checkpoint_version") or ""): e for e in economics}
    n = production_n or next((e["production_n"] for e in economics), 10_000)
    rows = [
        ("task success (majority of seeds, 95% CI)", [_success(r) for r in alls]),
        ("vs baseline (paired, 95% CI)", [_diff(r) for r in alls]),
        ("infra failures (excluded above)", [f"{r['episodes_infra']} / {r['episodes']} runs" for r in alls]),
        ("seed spread (per-seed pass rate)", [NA if not r.get("seed_pass_rates") else
                                             " / ".join(_pct(v) for _, v in sorted(r["seed_pass_rates"].items()))
                                             + (f" (sd {_pct(r['seed_std'])})" if r.get("seed_std") is not None else "")
                                             for r in alls]),
        ("hard gate violations", [_rate(r, "hard_gate_rate", "hard_gate_episodes") for r in alls]),
        ("human edits needed", [_rate(r, "human_intervention_rate", "human_intervention_episodes") for r in alls]),
        ("latency p50 / p95", [f"{_secs(r['latency_p50_s'])} / {_secs(r['latency_p95_s'])}" for r in alls]),
        ("mean tool turns", [NA if r["mean_turns"] is None else f"{r['mean_turns']:.1f}" for r in alls]),
    ]
    if eco:
        get = lambda r, k: eco.get((r["policy_id"], r["checkpoint_version"] or ""), {}).get(k, NA)  # noqa: E731
        rows += [
            ("accepted runs", [f"{get(r, 'accepted_runs')} / {get(r, 'episodes')}" for r in alls]),
            ("variable cost / accepted", [get(r, "variable_per_accepted") for r in alls]),
            ("training investment", [get(r, "training_investment") for r in alls]),
            ("sample-amortised / accepted", [get(r, "sample_amortised") for r in alls]),
            (f"at {n:,} accepted runs", [get(r, "production_amortised") + (
                f" (break-even {get(r, 'break_even')})" if get(r, "break_even") not in ("", "baseline", NA) else "")
                for r in alls]),
        ]
    seeds = sorted({s for r in alls for s in (r.get("seeds") or [])})
    tasks = max((r["tasks"] for r in alls), default=0)
    head = (f"Locked holdout: {tasks} tasks x {len(seeds)} seeds ({', '.join(map(str, seeds))}); "
            f"holdout sha256 {', '.join(sorted({(r.get('holdout_sha256') or '')[:12] for r in alls}))}\n\n")
    return head + md_table(["", *(policy_label(r) for r in alls)], [(k, *v) for k, v in rows])


def slice_markdown(summary: Sequence[Mapping], dimension: str) -> str:
    """Pass rate per slice value (rows) and policy (columns) for one dimension."""
    rows = [r for r in summary if r["dimension"] == dimension]
    pols = sorted({policy_label(r) for r in rows})
    vals = sorted({r["slice_value"] for r in rows})
    cell = {(policy_label(r), r["slice_value"]): r for r in rows}
    out = []
    for v in vals:
        out.append((v, *(NA if (p, v) not in cell else
                         f"{_pct(cell[(p, v)]['pass_rate'])} ({cell[(p, v)]['pass_rate_display']})" for p in pols)))
    return md_table([dimension, *pols], out)


def scorecard_png(summary: Sequence[Mapping], path: str | Path, *, slice_dimension: str = "family") -> Path:
    """Two panels: pass rate with 95% CI per policy; per slice value of `slice_dimension`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alls = [r for r in summary if r["dimension"] == "all" and r["pass_rate"] is not None]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 2]})
    labels = [policy_label(r) for r in alls]
    est = [100 * r["pass_rate"] for r in alls]
    err = [[e - 100 * r["pass_rate_ci_lo"] for e, r in zip(est, alls)],
           [100 * r["pass_rate_ci_hi"] - e for e, r in zip(est, alls)]]
    a.bar(range(len(alls)), est, yerr=err, capsize=4, color="#2a9d8f")
    a.set_xticks(range(len(alls)), labels, rotation=20, ha="right", fontsize=8)
    a.set_ylabel("task pass rate, % (95% CI)")
    a.set_ylim(0, 100)
    a.set_title("locked holdout, majority of seeds", fontsize=9)
    rows = [r for r in summary if r["dimension"] == slice_dimension and r["pass_rate"] is not None]
    vals = sorted({r["slice_value"] for r in rows})
    width = 0.8 / max(1, len(labels))
    for k, lab in enumerate(labels):
        mine = {r["slice_value"]: r for r in rows if policy_label(r) == lab}
        xs = [i + k * width for i, v in enumerate(vals) if v in mine]
        ys = [100 * mine[v]["pass_rate"] for v in vals if v in mine]
        lo = [y - 100 * mine[v]["pass_rate_ci_lo"] for y, v in zip(ys, [v for v in vals if v in mine])]
        hi = [100 * mine[v]["pass_rate_ci_hi"] - y for y, v in zip(ys, [v for v in vals if v in mine])]
        b.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=lab)
    b.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(vals))], vals, fontsize=8)
    b.set_ylim(0, 100)
    b.set_title(f"per {slice_dimension}", fontsize=9)
    if labels:
        b.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
