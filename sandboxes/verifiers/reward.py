"""Reward composition: weighted R_tests / R_hygiene / R_judge, with infra failures kept apart.

An infrastructure failure (sandbox crash, harness timeout) yields value None and status
"infra_failure", never 0.0: scoring it as zero would teach the policy that the harness's fault
was its own. A hard-gate violation (secret, forbidden file) zeroes the whole reward by default,
because otherwise editing the tests still buys the 0.55 test component.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sandboxes.verifiers.hygiene import r_hygiene
from sandboxes.verifiers.judge import Judge, RubricJudge
from sandboxes.verifiers.tests import r_tests


@dataclass(frozen=True)
class RewardWeights:
    tests: float = 0.55
    hygiene: float = 0.25
    judge: float = 0.20
    hard_gates: bool = True

    def __post_init__(self):
        if min(self.tests, self.hygiene, self.judge) < 0 or self.tests + self.hygiene + self.judge <= 0:
            raise ValueError("weights must be non-negative with a positive sum")


@dataclass(frozen=True)
class Reward:
    value: float | None                 # None only when status == "infra_failure"
    status: str                         # "scored" | "gate_violation" | "infra_failure"
    components: dict = field(default_factory=dict)   # tests / hygiene / judge in 0..1
    weights: RewardWeights = RewardWeights()
    reasons: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)

    @property
    def infra_failure(self) -> bool:
        return self.status == "infra_failure"

    def to_dict(self) -> dict:
        return {"value": self.value, "status": self.status, "components": dict(self.components),
                "weights": {"tests": self.weights.tests, "hygiene": self.weights.hygiene,
                            "judge": self.weights.judge, "hard_gates": self.weights.hard_gates},
                "reasons": list(self.reasons), "details": self.details}


def compose_reward(bundle, *, outcomes: dict | None, diff: str = "", explanation: str = "",
                   infra_error: str | None = None, judge: Judge | None = None,
                   weights: RewardWeights | None = None) -> Reward:
    """Score one episode. `outcomes` = {pytest node id: "passed"/"failed"/... or bool}; pass
    `infra_error` (or outcomes=None) when the harness, not the policy, failed."""
    weights = weights or RewardWeights()
    if infra_error is not None or outcomes is None:
        return Reward(None, "infra_failure", weights=weights,
                      reasons=(f"infra failure: {infra_error or 'no test outcomes'}",))
    tests = r_tests(outcomes, bundle.fail_to_pass, bundle.pass_to_pass)
    hyg = r_hygiene(diff, bundle)
    jres = (judge or RubricJudge()).judge(bundle, explanation, diff,
                                          blast_score=hyg.score if not hyg.gate_violation else None)
    comps = {"tests": tests.score, "hygiene": hyg.score, "judge": jres.score}
    total = weights.tests + weights.hygiene + weights.judge
    value = (weights.tests * tests.score + weights.hygiene * hyg.score + weights.judge * jres.score) / total
    status = "scored"
    if hyg.gate_violation:
        status = "gate_violation"
        if weights.hard_gates:
            value = 0.0
    reasons = [*hyg.reasons, f"judge: {jres.rationale}"]
    if tests.missing:
        reasons.append(f"{len(tests.missing)} required test(s) have no outcome")
    details = {"resolved": tests.resolved,
               "fail_to_pass": tests.fail_to_pass, "pass_to_pass": tests.pass_to_pass,
               "secrets": [s.__dict__ for s in hyg.secrets], "forbidden": list(hyg.forbidden),
               "blast_statements": hyg.blast.statements if hyg.blast else None,
               "judge": {"name": getattr(judge or RubricJudge(), "name", "judge"),
                         "criteria": jres.criteria}}
    return Reward(round(value, 6), status, comps, weights, tuple(reasons), details)
