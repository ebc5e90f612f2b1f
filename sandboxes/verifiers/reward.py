"""Reward composition: R_tests / R_hygiene / R_judge, monotone in real progress.

    value = (w_tests + w_hygiene * R_hygiene + w_judge * R_judge) / (w_tests + w_hygiene + w_judge)
            when every required test passes in the pristine verification,
    value = 0 otherwise (and for an empty submission, a hard-gate violation, or an episode the
            agent ended by breaking a limit: disk quota, patch size).

Hygiene and judge grade the quality of a working fix; they pay nothing on their own. So a
do-nothing or non-compiling submission scores 0, any patch that leaves a required test failing
scores 0, and any patch that makes them all pass scores at least w_tests / total (0.55 with the
reference weights): no failing patch can outscore a passing one, whatever the weights.

An infrastructure failure (a fault of the harness itself, decided outside the sandbox) yields
value None and status "infra_failure", never 0.0: scoring it as zero would teach the policy
that the harness's fault was its own.
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
    status: str                         # "scored" | "gate_violation" | "failed" | "infra_failure"
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
                   weights: RewardWeights | None = None, before: dict | None = None,
                   after: dict | None = None, failure: str | None = None,
                   notes: tuple[str, ...] = ()) -> Reward:
    """Score one episode. `outcomes` = {pytest node id: "passed"/"failed"/... or bool} from the
    pristine verification; pass `infra_error` (or outcomes=None) when the harness, not the
    policy, failed; `failure` when the agent ended its episode by breaking a limit (scored 0).
    `before` / `after`: the touched files at the pinned commit and in the submission."""
    weights = weights or RewardWeights()
    if infra_error is not None or (outcomes is None and failure is None):
        return Reward(None, "infra_failure", weights=weights,
                      reasons=(f"infra failure: {infra_error or 'no test outcomes'}",))
    if failure is not None:
        return Reward(0.0, "failed", {"tests": 0.0, "hygiene": 0.0, "judge": 0.0}, weights,
                      (failure, *notes), {"resolved": False, "failure": failure})
    tests = r_tests(outcomes, bundle.fail_to_pass, bundle.pass_to_pass)
    hyg = r_hygiene(diff, bundle, before=before, after=after)
    jres = (judge or RubricJudge()).judge(bundle, explanation, diff,
                                          blast_score=hyg.score if not hyg.gate_violation else None)
    comps = {"tests": tests.score, "hygiene": hyg.score, "judge": jres.score}
    total = weights.tests + weights.hygiene + weights.judge
    reasons = [*notes]
    if not diff.strip():
        value = 0.0
        reasons.append("empty submission: nothing changed")
    elif not tests.resolved:
        value = 0.0
        reasons.append("required tests do not all pass: hygiene and judge are not paid")
    else:
        value = (weights.tests + weights.hygiene * hyg.score + weights.judge * jres.score) / total
    status = "scored"
    if hyg.gate_violation:
        status = "gate_violation"
        if weights.hard_gates:
            value = 0.0
    reasons += [*hyg.reasons, f"judge: {jres.rationale}"]
    if tests.missing:
        reasons.append(f"{len(tests.missing)} required test(s) have no outcome")
    details = {"resolved": tests.resolved,
               "fail_to_pass": tests.fail_to_pass, "pass_to_pass": tests.pass_to_pass,
               "secrets": [s.__dict__ for s in hyg.secrets], "forbidden": list(hyg.forbidden),
               "tampering": [t.__dict__ for t in hyg.tampering],
               "blast_statements": hyg.blast.statements if hyg.blast else None,
               "judge": {"name": getattr(judge or RubricJudge(), "name", "judge"),
                         "criteria": jres.criteria}}
    return Reward(round(value, 6), status, comps, weights, tuple(reasons), details)
