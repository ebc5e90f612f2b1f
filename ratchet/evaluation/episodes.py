"""One evaluation episode: a policy on one holdout task with one seed -> one `eval_episodes` row.

The one seam is `run_policy_episode(policy_id, checkpoint_version, bundle, seed)`. Every policy,
harness baseline or learned checkpoint, is made by the policy layer (`ratchet.policy.make_policy`,
"<engine>:<name>": harness:random|sbfl|prior, scripted:expert|noisy, embedded:..., hf:...,
openai:...) and run by its one turn loop (`ratchet.policy.run_policy_episode`) in the same
sandbox, tools and verifiers; this module turns the record into a row. `policy_kwargs` reach the
engine (e.g. `path=` of a checkpoint, `base_url=` of an endpoint, `k=` of a harness baseline);
a policy object is made once per process and reused.

Outcome: "pass" when the pristine verification passed every required test and no hard gate was
violated; "infra_failure" when the harness, the sandbox or the engine failed (reward NULL, never
scored, outside every denominator); otherwise "fail".

Human intervention (a run whose patch a human would have to edit before merging): a scored run
that failed the tests (or submitted nothing), violated a hard gate (a secret, a forbidden path,
test tampering), scored R_hygiene below HYGIENE_THRESHOLD (a patch far larger than the minimal
fix) or R_judge below JUDGE_THRESHOLD. Infra failures are never counted (they are not scored).
"""
from __future__ import annotations

import hashlib
import json

JUDGE_THRESHOLD = 0.5
HYGIENE_THRESHOLD = 0.5
_POLICIES: dict = {}


class SelfJudging(ValueError):
    """The judge is the policy under evaluation: its grade would not be independent."""


def check_judge(judge, policy_id: str) -> None:
    name = getattr(judge, "name", None)
    if judge is not None and name in (policy_id, policy_id.split("@", 1)[0]):
        raise SelfJudging(f"judge {name!r} is the policy under evaluation: a policy never judges its own work")


def get_policy(policy_id: str, checkpoint_version: str = "", **policy_kwargs):
    """The policy object for an id (cached per process: a learned engine loads its weights once)."""
    key = (policy_id, checkpoint_version, json.dumps(policy_kwargs, sort_keys=True, default=str))
    if key not in _POLICIES:
        from ratchet.evaluation.variants import register_variants
        from ratchet.policy import make_policy

        register_variants()          # harness variants ("harness:sbfl-top3") resolve in every process
        _POLICIES[key] = make_policy(policy_id, **policy_kwargs)
    return _POLICIES[key]


def eval_id(policy_id: str, checkpoint_version: str, task_id: str, seed: int, environment_digest: str) -> str:
    key = f"{policy_id}|{checkpoint_version}|{task_id}|{int(seed)}|{environment_digest}"
    return hashlib.sha256(key.encode()).hexdigest()


def slice_labels(bundle) -> dict:
    """Slice columns from a bundle's metadata: slice (the task's slice label, the operator family
    for the HumanEval suite), family (mutation family), difficulty (function length bucket),
    category (share of the tests the bug breaks), tenant_id. Explicit metadata keys win."""
    meta = bundle.metadata or {}
    sl, rc = meta.get("slices") or {}, meta.get("root_cause") or {}
    family = meta.get("family") or rc.get("family") or sl.get("operator_family")
    return {"slice": meta.get("slice") or sl.get("operator_family") or family or "unlabelled",
            "family": family or "unlabelled",
            "difficulty": str(meta.get("difficulty") or sl.get("length_bucket") or "unlabelled"),
            "category": str(meta.get("category") or sl.get("fail_bucket") or "unlabelled"),
            "tenant_id": meta.get("tenant_id")}


def human_intervention(outcome: str, passed: bool, gates: list, components: dict) -> bool:
    if outcome == "infra_failure":
        return False
    return (not passed or bool(gates) or components.get("hygiene", 0.0) < HYGIENE_THRESHOLD
            or components.get("judge", 0.0) < JUDGE_THRESHOLD)


def run_policy_episode(policy_id: str, checkpoint_version: str, bundle, seed: int, *, runtime=None,
                       judge=None, eval_run_id: str = "", holdout_sha256: str = "", rate_card=None,
                       policy_kwargs: dict | None = None, policy=None) -> dict:
    """Run one episode and return its eval_episodes row (definitions in the module doc).
    `policy`: an already made policy object (otherwise made from the id and `policy_kwargs`)."""
    from datetime import datetime, timezone

    from ratchet.evaluation.economics import RateCard, episode_cost
    from ratchet.policy import run_policy_episode as run

    check_judge(judge, policy_id)
    try:
        pol = policy or get_policy(policy_id, checkpoint_version, **(policy_kwargs or {}))
        rec = run(pol, bundle, seed, runtime=runtime, judge=judge)
    except Exception as e:  # noqa: BLE001 - an engine that cannot even start voids the episode
        now = datetime.now(timezone.utc)
        rec = None
        err = f"{type(e).__name__}: {e}"[:2000]
    if rec is not None:
        outcome, passed, comps, gates = rec.outcome, bool(rec.passed), dict(rec.components), list(rec.hard_gates)
        err = rec.error[:2000] if rec.error else None
    else:
        outcome, passed, comps, gates = "infra_failure", False, {}, []
    infra = outcome == "infra_failure"
    tokens_in, tokens_out = (rec.tokens_in, rec.tokens_out) if rec else (0, 0)
    policy_s, sandbox_s = (rec.policy_s, rec.sandbox_s) if rec else (0.0, 0.0)
    # an engine that reports its own price (an API) wins; otherwise the rate card prices it
    cost = rec.cost_usd if rec is not None and rec.cost_usd is not None else episode_cost(
        rate_card or RateCard(), policy_id=policy_id, tokens_in=tokens_in, tokens_out=tokens_out,
        policy_s=policy_s, sandbox_s=sandbox_s)
    return {
        "eval_id": eval_id(policy_id, checkpoint_version, bundle.task_id, seed, bundle.environment_digest),
        "eval_run_id": eval_run_id, "policy_id": policy_id, "checkpoint_version": checkpoint_version or "",
        "task_id": bundle.task_id, "seed": int(seed), **slice_labels(bundle),
        "outcome": outcome, "passed": passed, "reward": None if infra else rec.reward,
        "reward_tests": comps.get("tests"), "reward_hygiene": comps.get("hygiene"),
        "reward_judge": comps.get("judge"),
        "hard_gate_violations": len(gates), "hard_gates": gates,
        "human_intervention": human_intervention(outcome, passed, gates, comps),
        "turns": rec.turns if rec else 0, "tool_calls": rec.tool_calls if rec else 0,
        "tokens_in": int(tokens_in), "tokens_out": int(tokens_out),
        "latency_s": rec.latency_s if rec else 0.0, "sandbox_s": sandbox_s, "policy_s": policy_s,
        "cost_usd": cost, "environment_id": bundle.environment_id,
        "environment_digest": bundle.environment_digest, "holdout_sha256": holdout_sha256,
        "started_at": rec.started_at if rec else now, "finished_at": rec.finished_at if rec else now,
        "error": err,
    }
