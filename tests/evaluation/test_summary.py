"""eval_summary: majority of seeds, explicit denominators, infra failures outside them, paired
difference to the baseline, per-slice rows."""
import pytest

from ratchet.evaluation import tables
from ratchet.evaluation.summary import DIMENSIONS, display, summary_rows

pytestmark = pytest.mark.evaluation


def _row(policy, task, seed, outcome, *, family="comparison", gates=0, human=None, latency=1.0, turns=4,
         digest="sha256:d"):
    return {"policy_id": policy, "checkpoint_version": "", "task_id": task, "seed": seed, "outcome": outcome,
            "passed": outcome == "pass", "hard_gate_violations": gates,
            "human_intervention": (outcome == "fail") if human is None else human, "latency_s": latency,
            "turns": turns, "tool_calls": turns, "cost_usd": 0.01, "environment_digest": digest,
            "holdout_sha256": "h", "family": family, "difficulty": "short", "category": "all",
            "tenant_id": None, "slice": family}


def _policy(policy, spec):
    """spec: task -> (family, [outcome per seed])"""
    return [_row(policy, t, s, o, family=f, latency=float(s + 1)) for t, (f, outs) in spec.items()
            for s, o in enumerate(outs)]


CAND = _policy("rl", {"a": ("comparison", ["pass", "pass", "fail"]),
                      "b": ("comparison", ["pass", "fail", "infra_failure"]),   # 1 of 2 scored: fail
                      "c": ("arithmetic", ["infra_failure"] * 3),              # no scored seed
                      "d": ("arithmetic", ["pass", "pass", "pass"])})
BASE = _policy("base", {"a": ("comparison", ["fail", "fail", "fail"]),
                        "b": ("comparison", ["pass", "pass", "fail"]),
                        "c": ("arithmetic", ["pass", "pass", "pass"]),
                        "d": ("arithmetic", ["pass", "fail", "pass"])})


def _get(rows, policy, dim="all", value="all"):
    (r,) = [r for r in rows if r["policy_id"] == policy and r["dimension"] == dim and r["slice_value"] == value]
    return r


def test_majority_denominators_and_infra_excluded():
    rows = summary_rows(CAND + BASE, baseline_policy_id="base", n_boot=500)
    r = _get(rows, "rl")
    assert (r["tasks"], r["tasks_scored"], r["tasks_passed"], r["tasks_infra"]) == (4, 3, 2, 1)
    assert r["pass_rate"] == pytest.approx(2 / 3)
    assert r["pass_rate_display"] == "2 / 3 tasks; 1 task infra-failed, excluded"
    assert (r["episodes"], r["episodes_scored"], r["episodes_infra"], r["episodes_passed"]) == (12, 8, 4, 6)
    assert r["human_intervention_rate"] == pytest.approx(2 / 8)        # the 2 failed scored episodes
    assert r["pass_rate_ci_lo"] <= r["pass_rate"] <= r["pass_rate_ci_hi"]
    assert r["seed_pass_rates"] == {"0": 1.0, "1": pytest.approx(2 / 3), "2": pytest.approx(1 / 2)}
    # latency over scored episodes only: seeds 0,0,0 (1 s), 1,1,1 (2 s), 2,2 (3 s) -> p50 = 2
    assert r["latency_p50_s"] == pytest.approx(2.0)
    b = _get(rows, "base")
    assert b["pass_rate_display"] == "3 / 4 tasks" and b["diff_vs_baseline"] is None


def test_paired_difference_over_tasks_both_scored():
    rows = summary_rows(CAND + BASE, baseline_policy_id="base", n_boot=2000)
    r = _get(rows, "rl")
    # common scored tasks a, b, d: candidate (1, 0, 1) - baseline (0, 1, 1) = (1, -1, 0) -> mean 0
    assert r["diff_tasks"] == 3 and r["diff_vs_baseline"] == pytest.approx(0.0)
    assert r["diff_ci_lo"] < 0 < r["diff_ci_hi"]
    cmp_ = _get(rows, "rl", "family", "comparison")       # a: +1, b: -1
    assert cmp_["diff_tasks"] == 2 and cmp_["diff_vs_baseline"] == pytest.approx(0.0)
    ari = _get(rows, "rl", "family", "arithmetic")        # only d is common: 1 - 1 = 0
    assert ari["diff_tasks"] == 1 and ari["pass_rate_display"] == "1 / 1 tasks; 1 task infra-failed, excluded"


def test_a_different_digest_is_not_paired():
    moved = [dict(r, environment_digest="sha256:other") if r["task_id"] == "a" else r for r in BASE]
    r = _get(summary_rows(CAND + moved, baseline_policy_id="base", n_boot=200), "rl")
    assert r["diff_tasks"] == 2                           # a left out: not comparable


def test_per_slice_rows_for_every_dimension_and_schema():
    rows = summary_rows(CAND + BASE, baseline_policy_id="base", n_boot=200)
    dims = {r["dimension"] for r in rows if r["policy_id"] == "rl"}
    assert dims == {"all", *DIMENSIONS} and len(DIMENSIONS) >= 4
    assert _get(rows, "rl", "tenant_id", "(none)")["tasks"] == 4
    tables.to_arrow("eval_summary", rows)


def test_display_plural():
    assert display(310, 400, 0) == "310 / 400 tasks"
    assert display(1310, 1400, 2) == "1,310 / 1,400 tasks; 2 tasks infra-failed, excluded"


def test_a_partial_run_says_so():
    rows = summary_rows(CAND + BASE, baseline_policy_id="base", n_boot=100, holdout_tasks=400)
    r = _get(rows, "base")
    assert r["holdout_tasks"] == 400
    assert r["pass_rate_display"] == "3 / 4 tasks (only 4 of 400 holdout tasks evaluated)"
    assert _get(summary_rows(BASE, holdout_tasks=4), "base")["pass_rate_display"] == "3 / 4 tasks"
