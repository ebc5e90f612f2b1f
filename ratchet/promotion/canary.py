"""The canary: the approved candidate serves a share of fresh tasks (in no split) beside the
champion; after the window, promote if it did not regress, else roll back automatically.

`route` assigns tasks to an arm deterministically (a salted hash: the same task always goes to
the same arm, and a retry does not reshuffle traffic). `decide_canary` is a pure function of
the window's eval rows: "wait" until both arms have `min_tasks` scored tasks, then "promote"
or "rollback" with the reasons. Infrastructure failures are excluded, as in the gates."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import CanaryPolicy
from .stats import majority_by_task, percentile, scored


def route(task_ids: Iterable[str], share: float, seed: int = 0) -> dict[str, str]:
    """task_id -> "candidate" for about `share` of tasks, "champion" for the rest."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"canary share {share} must be in (0, 1)")
    out = {}
    for t in task_ids:
        u = int.from_bytes(hashlib.sha256(f"{seed}|{t}".encode()).digest()[:8], "big") / 2.0 ** 64
        out[t] = "candidate" if u < share else "champion"
    return out


@dataclass(frozen=True)
class CanaryDecision:
    action: str                      # "promote" | "rollback" | "wait"
    reasons: tuple[str, ...]
    numbers: Mapping[str, Any] = field(default_factory=dict)


def _arm(rows: list[Mapping]) -> dict:
    s = scored(rows)
    maj = majority_by_task(rows)
    viol = [int(r.get("hard_gate_violations") or 0) > 0 for r in s]
    return {"episodes": len(rows), "infra_failures": len(rows) - len(s), "tasks": len(maj),
            "pass_rate": sum(maj.values()) / len(maj) if maj else None,
            "violation_rate": sum(viol) / len(viol) if viol else None,
            "p95_latency_s": percentile([float(r["latency_s"]) for r in s if r.get("latency_s") is not None], 95)}


def decide_canary(candidate_rows: Iterable[Mapping], champion_rows: Iterable[Mapping],
                  policy: CanaryPolicy | Mapping | None = None,
                  excluded_task_ids: Iterable[str] = ()) -> CanaryDecision:
    """Promote, roll back or wait, from the canary window's rows of each arm.
    `excluded_task_ids` (train / val / holdout) must not appear: canary tasks are fresh."""
    pol = policy if isinstance(policy, CanaryPolicy) else CanaryPolicy.from_dict(policy)
    cand, champ = list(candidate_rows), list(champion_rows)
    leaked = {str(r["task_id"]) for r in cand + champ} & set(map(str, excluded_task_ids))
    if leaked:
        raise ValueError(f"{len(leaked)} canary task(s) belong to a split (e.g. {sorted(leaked)[:3]}): "
                         f"a canary runs on fresh tasks only")
    c, k = _arm(cand), _arm(champ)
    nums = {"candidate": c, "champion": k, "policy": {"share": pol.share, "min_tasks": pol.min_tasks,
                                                      "max_pass_drop": pol.max_pass_drop,
                                                      "hard_gate_tolerance": pol.hard_gate_tolerance,
                                                      "latency_tolerance": pol.latency_tolerance}}
    if c["tasks"] < pol.min_tasks or k["tasks"] < pol.min_tasks:
        return CanaryDecision("wait", (f"window not full: {c['tasks']} candidate / {k['tasks']} champion scored "
                                       f"tasks, need {pol.min_tasks} each",), nums)
    reasons = []
    if c["pass_rate"] < k["pass_rate"] - pol.max_pass_drop - 1e-12:
        reasons.append(f"pass rate {c['pass_rate']:.3f} < champion {k['pass_rate']:.3f} - {pol.max_pass_drop}")
    if c["violation_rate"] > k["violation_rate"] + pol.hard_gate_tolerance + 1e-12:
        reasons.append(f"hard-gate violations {c['violation_rate']:.2%} > champion {k['violation_rate']:.2%}")
    if c["p95_latency_s"] is not None and k["p95_latency_s"] is not None and \
            c["p95_latency_s"] > k["p95_latency_s"] * (1 + pol.latency_tolerance) + 1e-9:
        reasons.append(f"p95 latency {c['p95_latency_s']:.2f} s > champion {k['p95_latency_s']:.2f} s "
                       f"x {1 + pol.latency_tolerance:.2f}")
    if reasons:
        return CanaryDecision("rollback", tuple(reasons), nums)
    return CanaryDecision("promote", (f"no regression over {c['tasks']} candidate / {k['tasks']} champion tasks: "
                                      f"pass {c['pass_rate']:.3f} vs {k['pass_rate']:.3f}",), nums)
