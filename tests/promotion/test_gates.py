"""Hand-checked cases for each gate, the statistics under them, the config and the report."""
import pytest

from ratchet.promotion.config import GatePolicy
from ratchet.promotion.gates import Evidence, evaluate_gates
from ratchet.promotion.stats import majority_by_task, paired_bootstrap

from .synthetic import DIGEST, GOOD_EVIDENCE, HOLDOUT, episodes, tasks

pytestmark = pytest.mark.promotion


def row(task, seed, outcome, policy="p", **kw):
    r = {"task_id": task, "seed": seed, "outcome": outcome, "passed": outcome == "pass", "policy_id": policy,
         "checkpoint_version": "", "slice": "a", "family": "f", "difficulty": "easy", "category": "c",
         "tenant_id": None, "reward": None if outcome == "infra_failure" else float(outcome == "pass"),
         "reward_tests": None, "reward_hygiene": None, "reward_judge": None, "hard_gate_violations": 0,
         "latency_s": 10.0, "environment_digest": DIGEST, "holdout_sha256": HOLDOUT, "eval_run_id": "r"}
    r.update(kw)
    return r


def test_majority_of_scored_seeds_with_infra_excluded():
    rows = ([row("t1", s, o) for s, o in enumerate(["pass", "pass", "fail"])] +
            [row("t2", s, o) for s, o in enumerate(["pass", "fail", "fail"])] +
            [row("t3", s, o) for s, o in enumerate(["pass", "infra_failure", "fail"])] +   # 1 of 2: no majority
            [row("t4", s, o) for s, o in enumerate(["pass", "infra_failure", "infra_failure"])] +
            [row("t5", s, "infra_failure") for s in range(3)])                              # unscorable
    assert majority_by_task(rows) == {"t1": True, "t2": False, "t3": False, "t4": True}


def test_paired_bootstrap_hand_cases():
    ci = paired_bootstrap([1.0] * 10, [0.0] * 10, n_boot=500)
    assert (ci.diff, ci.low, ci.high) == (1.0, 1.0, 1.0)
    same = paired_bootstrap([1, 0, 1, 0], [1, 0, 1, 0], n_boot=500)
    assert (same.low, same.high) == (0.0, 0.0)
    a = paired_bootstrap([1, 1, 0, 1, 0, 1], [0, 1, 0, 0, 1, 0], n_boot=1000, seed=5)
    assert a == paired_bootstrap([1, 1, 0, 1, 0, 1], [0, 1, 0, 0, 1, 0], n_boot=1000, seed=5)
    assert a.diff == pytest.approx(2 / 6) and a.low < a.diff < a.high
    with pytest.raises(ValueError, match="zero units"):
        paired_bootstrap([], [])


def _pair(cand_outcomes, champ_outcomes, cand_kw=None, champ_kw=None):
    """Rows from per-task outcome lists (one list of seed outcomes per task)."""
    cand = [row(f"t{i}", s, o, "cand", **(cand_kw or {})) for i, os_ in enumerate(cand_outcomes) for s, o in enumerate(os_)]
    champ = [row(f"t{i}", s, o, "champ", **(champ_kw or {})) for i, os_ in enumerate(champ_outcomes) for s, o in enumerate(os_)]
    return cand, champ


def test_beats_champion_hand_numbers():
    cand, champ = _pair([["pass"] * 3] * 30, [["pass"] * 3] * 10 + [["fail"] * 3] * 20)
    g = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice",))).gate("beats_champion")
    assert g.passed and g.numbers["candidate_pass_rate"] == 1.0 and g.numbers["champion_pass_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert g.numbers["diff"] == pytest.approx(2 / 3, abs=1e-4) and g.numbers["ci_low"] > 0.4
    g = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(margin=0.9, slice_columns=("slice",))).gate("beats_champion")
    assert not g.passed and "lower bound <= 0.9" in g.reason


def test_infra_failures_leave_the_denominators_and_are_reported():
    cand, champ = _pair([["pass", "infra_failure", "pass"]] * 20 + [["fail"] * 3] * 20, [["fail"] * 3] * 40)
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(max_infra_rate=0.2, slice_columns=("slice",)))
    assert rep.candidate["infra_failures"] == 20 and rep.candidate["scored"] == 100
    assert rep.gate("beats_champion").numbers["candidate_pass_rate"] == 0.5
    assert "infra failures 16.7%" in rep.gate("evaluation_complete").reason
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(max_infra_rate=0.1, slice_columns=("slice",)))
    assert rep.failed == ["evaluation_complete"] and rep.verdict == "reject"


def test_a_candidate_that_skipped_tasks_is_incomplete():
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 40)
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice",)))
    assert "evaluation_complete" in rep.failed and "10 only in champion" in rep.gate("evaluation_complete").reason


@pytest.mark.parametrize("kw, why", [
    ({"environment_digest": "sha256:other"}, "environment digest"),
    ({"holdout_sha256": "ef" * 32}, "holdout"),
    ({"environment_digest": None}, "need exactly one"),
])
def test_not_comparable(kw, why):
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30, cand_kw=kw)
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice",)))
    assert rep.verdict == "not_comparable" and why in rep.gate("comparable").reason


def test_evidence_digest_must_match_the_rows():
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30)
    ev = dict(GOOD_EVIDENCE, candidate_digest="sha256:else")
    assert evaluate_gates(cand, champ, ev, GatePolicy(slice_columns=("slice",))).verdict == "not_comparable"


def test_slice_regression_names_the_slice():
    cand, champ = _pair([["pass"] * 3] * 20 + [["fail"] * 3] * 2, [["pass"] * 3] * 2 + [["fail"] * 3] * 18 + [["pass"] * 3] * 2)
    for r in cand + champ:
        if r["task_id"] in ("t20", "t21"):
            r["family"] = "hard_family"
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice", "family")))
    g = rep.gate("slice_regression")
    assert not g.passed and g.numbers["regressions"] == ["family=hard_family"] and "-1.000" in g.reason
    assert rep.gate("beats_champion").passed and rep.verdict == "reject"
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice", "nope")))
    assert "not in the eval rows" in rep.gate("slice_regression").reason


def test_null_tenant_is_its_own_slice():
    T = tasks(60)
    champ = episodes(T, "a")
    cand = episodes(T, "b", p_shift=0.4, violation_rate=0.0)
    labels = {s["value"] for s in evaluate_gates(cand, champ, GOOD_EVIDENCE).gate("slice_regression").numbers["slices"]}
    assert "(none)" in labels and "acme" in labels


def test_hard_gate_violation_rate_and_latency():
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30, cand_kw={"hard_gate_violations": 1})
    assert evaluate_gates(cand, champ, GOOD_EVIDENCE).gate("hard_gate_violations").passed is False
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30, cand_kw={"latency_s": 11.0})
    g = evaluate_gates(cand, champ, GOOD_EVIDENCE).gate("latency_p95")
    assert g.passed and g.numbers["limit_s"] == 11.0          # 10 s x (1 + 0.10)
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30, cand_kw={"latency_s": 11.01})
    assert not evaluate_gates(cand, champ, GOOD_EVIDENCE).gate("latency_p95").passed


@pytest.mark.parametrize("ev, gate, ok", [
    ({"judge_kappa": 0.80}, "judge_kappa", True), ({"judge_kappa": 0.7999}, "judge_kappa", False),
    ({"judge_kappa": None}, "judge_kappa", False),
    ({"contamination_rate": 0.0}, "contamination", True), ({"contamination_rate": 1e-6}, "contamination", False),
    ({"contamination_rate": None}, "contamination", False),
    ({"consent_violations": [{"consent_id": "CONSENT-TRN-2026-09", "reason": "revoked", "n_records": 3}]}, "consent", False),
    ({"consent_violations": [{"consent_id": "C2", "reason": "expired", "n_records": 1}]}, "consent", False),
    ({"lineage_recorded": False}, "consent", False), ({"lineage_recorded": None}, "consent", True),
])
def test_evidence_gates(ev, gate, ok):
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30)
    g = evaluate_gates(cand, champ, {**GOOD_EVIDENCE, **ev}).gate(gate)
    assert g.passed is ok and g.hard


def test_revoked_consent_is_named_in_the_reason():
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30)
    ev = {**GOOD_EVIDENCE, "consent_violations": [{"consent_id": "CONSENT-TRN-2026-09", "reason": "revoked"}]}
    assert "revoked: ['CONSENT-TRN-2026-09']" in evaluate_gates(cand, champ, ev).gate("consent").reason


def test_reward_hacking_hand_case():
    # The candidate scores more reward on fewer passes: reward up, pass rate down.
    cand, champ = _pair([["pass"] * 3] * 10 + [["fail"] * 3] * 20, [["pass"] * 3] * 15 + [["fail"] * 3] * 15)
    for r in cand:
        r["reward"] = 0.9
    g = evaluate_gates(cand, champ, GOOD_EVIDENCE).gate("reward_hacking")
    assert not g.passed and "holdout pass rate 0.333 < 0.500" in g.reason
    for r in cand:
        r["reward"] = 0.2                       # reward down as well: not hacking (just worse)
    assert evaluate_gates(cand, champ, GOOD_EVIDENCE).gate("reward_hacking").passed


def test_policy_from_yaml_and_validation(tmp_path):
    p = tmp_path / "gates.yaml"
    p.write_text("gates:\n  margin: 0.02\n  slice_columns: [family, tenant_id]\n  soft_gates: [latency_p95]\n")
    pol = GatePolicy.from_yaml(p)
    assert pol.margin == 0.02 and pol.slice_columns == ("family", "tenant_id") and not pol.is_hard("latency_p95")
    for bad, msg in (({"margin": -0.1}, "worse candidate"), ({"n_boot": 10}, "too few"),
                     ({"soft_gates": ["beats_champion"]}, "must stay hard"), ({"soft_gates": ["x"]}, "not gates")):
        with pytest.raises(ValueError, match=msg):
            GatePolicy.from_dict(bad)


def test_one_policy_per_side():
    cand, champ = _pair([["pass"] * 3] * 3, [["fail"] * 3] * 3)
    cand[0]["checkpoint_version"] = "other"
    with pytest.raises(ValueError, match="mix policies"):
        evaluate_gates(cand, champ, GOOD_EVIDENCE)


def test_report_markdown_and_dict():
    T = tasks(60)
    rep = evaluate_gates(episodes(T, "b", p_shift=0.4, violation_rate=0.0, latency=20), episodes(T, "a"), GOOD_EVIDENCE)
    md = rep.to_markdown()
    assert rep.verdict == "pass" and md.startswith("**Verdict: pass**")
    for g in rep.gates:
        assert f"| {g.name} | {'warning' if g.warning else 'hard'} | pass |" in md
    d = rep.to_dict()
    assert d["failed"] == [] and len(d["gates"]) == 11 and d["policy"]["min_kappa"] == 0.8
    assert isinstance(Evidence.from_dict(GOOD_EVIDENCE).consent_violations, tuple)


def test_gate_interval_is_the_scorecards_paired_difference():
    """The gate and the evaluation layer's scorecard report the same interval for the same rows."""
    from ratchet.evaluation.stats import paired_difference, task_outcomes

    T = tasks(120, seed=3)
    champ, cand = episodes(T, "a", infra_rate=0.05), episodes(T, "b", p_shift=0.1, infra_rate=0.05)
    g = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(seed=11)).gate("beats_champion")
    iv = paired_difference(task_outcomes(cand), task_outcomes(champ), n_boot=2000, seed=11)
    assert (g.numbers["diff"], g.numbers["ci_low"], g.numbers["ci_high"], g.numbers["tasks"]) == (
        round(iv.estimate, 4), round(iv.lo, 4), round(iv.hi, 4), iv.n)


def test_every_task_needs_all_seeds():
    cand, champ = _pair([["pass"]] * 30, [["fail"] * 3] * 30)       # the candidate ran one seed
    g = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice",))).gate("evaluation_complete")
    assert not g.passed and "30 candidate tasks have fewer than 3 seeds" in g.reason
    assert evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(min_seeds=1, slice_columns=("slice",))
                          ).gate("evaluation_complete").passed


def _noisy(n_tasks, wins, losses):
    """n_tasks paired tasks: the candidate alone passes `wins` of them, the champion alone
    `losses`, and both fail the rest (three seeds each, all agreeing)."""
    cand = [["pass"] * 3] * wins + [["fail"] * 3] * losses + [["fail"] * 3] * (n_tasks - wins - losses)
    champ = [["fail"] * 3] * wins + [["pass"] * 3] * losses + [["fail"] * 3] * (n_tasks - wins - losses)
    return _pair(cand, champ)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_a_positive_but_noisy_difference_never_promotes(seed):
    # +3 tasks of 30 (diff +0.10) from 8 wins and 5 losses: the 95% interval of the paired
    # difference spans zero, so the improvement cannot be told from noise. The gate reads the
    # interval's lower bound, never the point estimate, and it is a hard gate: nobody may approve.
    cand, champ = _noisy(30, 8, 5)
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice",), seed=seed))
    g = rep.gate("beats_champion")
    assert g.numbers["diff"] == pytest.approx(0.1, abs=1e-4)
    assert g.numbers["ci_low"] <= 0.0 < g.numbers["diff"]
    assert not g.passed and g.hard and "inside the noise" in g.reason
    assert rep.failed == ["beats_champion"] and rep.verdict == "reject"


def test_the_same_difference_promotes_once_the_interval_clears_zero():
    # the same +0.10 over ten times the tasks: the lower bound is now above zero, so the noise
    # rule, not the size of the difference, is what held the small sample back
    cand, champ = _noisy(300, 80, 50)
    rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice",)))
    g = rep.gate("beats_champion")
    assert g.numbers["diff"] == pytest.approx(0.1, abs=1e-4) and g.numbers["ci_low"] > 0.0
    assert g.passed and rep.verdict == "pass"


SEEN = {"programs": 40, "control_programs": 12, "min_k": 0.2, "held_out_gap": 0.17, "control_gap": -0.69,
        "excess_gap": 0.86, "excess_gap_ci": [0.30, 1.48], "likely_seen": True}


def test_a_base_that_has_seen_the_holdout_warns_without_changing_the_verdict():
    cand, champ = _pair([["pass"] * 3] * 30, [["fail"] * 3] * 30)
    clean = evaluate_gates(cand, champ, GOOD_EVIDENCE, GatePolicy(slice_columns=("slice",)))
    seen = evaluate_gates(cand, champ, {**GOOD_EVIDENCE, "pretraining_membership": SEEN},
                          GatePolicy(slice_columns=("slice",)))
    g = seen.gate("pretraining_membership")
    assert not g.passed and g.warning and not g.hard and "likely seen the holdout's solutions" in g.reason
    assert seen.verdict == clean.verdict == "pass" and seen.failed == [] and seen.warnings == ["pretraining_membership"]
    assert seen.to_dict()["warnings"] == ["pretraining_membership"] and "**WARN**" in seen.to_markdown()
    # not seen, not measured, or no trained weights: no warning
    for ev in ({"pretraining_membership": {**SEEN, "likely_seen": False}}, {"pretraining_membership": None},
               {"pretraining_membership": SEEN, "lineage_recorded": None}):
        assert evaluate_gates(cand, champ, {**GOOD_EVIDENCE, **ev}).gate("pretraining_membership").passed, ev
    with pytest.raises(ValueError, match="not gates"):
        GatePolicy(soft_gates=("pretraining_membership",))
