"""One evaluation episode: a policy on one holdout task with one seed -> one `eval_episodes` row.

The seam for every policy is `run_policy_episode(policy_id, checkpoint_version, bundle, seed)`.
Policies are looked up in a registry by exact id, then by the id without "@version", then by the
engine prefix before ":" ("embedded:rl@3" -> "embedded:rl@3", "embedded:rl", "embedded"). A
runner is `runner(env, rng, *, policy_id, checkpoint_version, seed, **kw)`: it gets a reset-able
`sandboxes.env.RepairEnv` (the same sandbox, tools and verifiers for every policy) and returns an
object with `messages`, `steps`, `explanation` and optionally `tokens_in` / `tokens_out` (or the
same keys in `notes`). The learned-policy interface (ratchet/policy) plugs in with
`register_policy("embedded", runner)`.

Built in: harness:random, harness:sbfl (harness baselines, no weights) and scripted:expert,
scripted:noisy (the reference agents).

Outcome: "pass" when the pristine verification passed every required test and no hard gate was
violated (the reward's status is "scored" with R_tests = 1); "infra_failure" when the harness
failed (reward NULL, never scored, outside every denominator); otherwise "fail".

Human intervention (a run whose patch a human would have to edit before merging): a scored run
that failed the tests (or submitted nothing), violated a hygiene gate (a secret, a forbidden
path, test tampering) or scored R_hygiene below HYGIENE_THRESHOLD (a patch much larger than the
minimal fix), or whose judge score is below JUDGE_THRESHOLD. Infra failures are never counted.
"""
from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

JUDGE_THRESHOLD = 0.5
HYGIENE_THRESHOLD = 0.5
BUILTIN = {"harness:random": "random", "harness:sbfl": "sbfl",
           "scripted:expert": "expert", "scripted:noisy": "noisy"}
_POLICIES: dict = {}


class SelfJudging(ValueError):
    """The judge is the policy under evaluation: its grade would not be independent."""


def register_policy(key: str, runner) -> None:
    """Make policy ids matching `key` (exact id, id without @version, or engine prefix) run
    through `runner(env, rng, *, policy_id, checkpoint_version, seed, **kw)`."""
    if key in _POLICIES:
        raise ValueError(f"policy {key!r} is already registered")
    _POLICIES[key] = runner


def _agent_runner(agent: str):
    def run(env, rng, *, policy_id, checkpoint_version, seed, **kw):
        # the agents' own registry (run_agent builds its own env; here the env carries the judge)
        from sandboxes import agents

        return agents._REGISTRY[agent](env, rng, **kw)
    return run


for _pid, _agent in BUILTIN.items():
    register_policy(_pid, _agent_runner(_agent))


def resolve(policy_id: str):
    for key in (policy_id, policy_id.split("@", 1)[0], policy_id.split(":", 1)[0]):
        if key in _POLICIES:
            return _POLICIES[key]
    raise ValueError(f"unknown policy {policy_id!r}; registered: {sorted(_POLICIES)}")


def policies() -> tuple[str, ...]:
    return tuple(sorted(_POLICIES))


def eval_id(policy_id: str, checkpoint_version: str, task_id: str, seed: int, environment_digest: str) -> str:
    key = f"{policy_id}|{checkpoint_version}|{task_id}|{int(seed)}|{environment_digest}"
    return hashlib.sha256(key.encode()).hexdigest()


def slice_labels(bundle) -> dict:
    """Slice columns from a bundle's metadata: slice (the task's slice label, the operator family
    for the HumanEval suite), family (mutation family), difficulty (function length bucket),
    category (share of tests the bug breaks), tenant_id. Explicit metadata keys win."""
    meta = bundle.metadata or {}
    sl, rc = meta.get("slices") or {}, meta.get("root_cause") or {}
    family = meta.get("family") or rc.get("family") or sl.get("operator_family")
    return {"slice": meta.get("slice") or sl.get("operator_family") or family or "unlabelled",
            "family": family or "unlabelled",
            "difficulty": str(meta.get("difficulty") or sl.get("length_bucket") or "unlabelled"),
            "category": str(meta.get("category") or sl.get("fail_bucket") or "unlabelled"),
            "tenant_id": meta.get("tenant_id")}


@dataclass
class Timing:
    setup_s: float = 0.0          # env reset: sandbox episode + issue tracker
    loop_s: float = 0.0           # the policy's turn loop, its tool calls included
    tools_s: float = 0.0          # of which: tool calls in the sandbox
    score_s: float = 0.0          # final pristine verification + reward composition
    teardown_s: float = 0.0
    total_s: float = 0.0          # wall time of run_policy_episode


def _timed_env(bundle, runtime, judge, timing: Timing):
    from sandboxes.env import RepairEnv

    class TimedEnv(RepairEnv):
        def reset(self):
            t0 = time.monotonic()
            try:
                return super().reset()
            finally:
                timing.setup_s += time.monotonic() - t0

        def finish(self, explanation, failure=None):
            t0 = time.monotonic()
            try:
                return super().finish(explanation, failure)
            finally:
                timing.score_s += time.monotonic() - t0

        def close(self):
            t0 = time.monotonic()
            try:
                return super().close()
            finally:
                timing.teardown_s += time.monotonic() - t0

    return TimedEnv(bundle, runtime=runtime, judge=judge)


@dataclass
class EpisodeResult:
    row: dict
    timing: Timing = field(default_factory=Timing)


def _gates(reward) -> list[str]:
    d = reward.details or {}
    return ([f"secret:{s.get('type', '?')}" for s in d.get("secrets") or []]
            + [f"forbidden_path:{p}" for p in d.get("forbidden") or []]
            + [f"test_tampering:{t.get('pattern', '?')}" for t in d.get("tampering") or []])


def run_policy_episode(policy_id: str, checkpoint_version: str, bundle, seed: int, *, runtime=None,
                       judge=None, eval_run_id: str = "", holdout_sha256: str = "", rate_card=None,
                       policy_kwargs: dict | None = None) -> EpisodeResult:
    """Run one episode and return its eval_episodes row (see the module doc for definitions)."""
    from ratchet.evaluation.economics import RateCard, episode_cost

    if judge is not None and getattr(judge, "name", None) in (policy_id, policy_id.split("@", 1)[0]):
        raise SelfJudging(f"judge {judge.name!r} is the policy under evaluation: a policy never judges its own work")
    runner = resolve(policy_id)
    timing = Timing()
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    rng = random.Random(f"{policy_id}:{checkpoint_version}:{seed}:{bundle.task_id}")
    run, error, env = None, None, None
    try:
        env = _timed_env(bundle, runtime, judge, timing)
        with env:
            t_loop = time.monotonic()
            run = runner(env, rng, policy_id=policy_id, checkpoint_version=checkpoint_version, seed=seed,
                         **(policy_kwargs or {}))
            timing.loop_s = time.monotonic() - t_loop - timing.setup_s - timing.score_s
            reward = env.reward
    except Exception as e:  # noqa: BLE001 - a harness/runner crash voids the episode, never a 0
        error, reward = f"{type(e).__name__}: {e}"[:2000], None
    timing.total_s = time.monotonic() - t0
    finished = datetime.now(timezone.utc)
    steps = list(env.steps) if env is not None else []
    timing.tools_s = sum(s.duration_s for s in steps if s.tool != "submit")
    sandbox_s = env.sandbox_s if env is not None else 0.0
    infra = reward is None or reward.status == "infra_failure"
    if reward is not None and reward.status == "infra_failure":
        error = "; ".join(reward.reasons)[:2000]
    comps = {} if infra else reward.components
    passed = (not infra) and reward.status == "scored" and comps.get("tests") == 1.0
    gates = [] if infra else _gates(reward)
    human = (not infra) and (not passed or bool(gates) or comps.get("hygiene", 0.0) < HYGIENE_THRESHOLD
                             or comps.get("judge", 0.0) < JUDGE_THRESHOLD)
    notes = getattr(run, "notes", None) or {}
    tokens_in = int(getattr(run, "tokens_in", None) or notes.get("tokens_in") or 0)
    tokens_out = int(getattr(run, "tokens_out", None) or notes.get("tokens_out") or 0)
    messages = getattr(run, "messages", None) or []
    # policy_s: the policy's own compute (its turn loop without the tool calls it waited on)
    policy_s = max(timing.loop_s - timing.tools_s, 0.0)
    card = rate_card or RateCard()
    row = {
        "eval_id": eval_id(policy_id, checkpoint_version, bundle.task_id, seed, bundle.environment_digest),
        "eval_run_id": eval_run_id, "policy_id": policy_id, "checkpoint_version": checkpoint_version or "",
        "task_id": bundle.task_id, "seed": int(seed), **slice_labels(bundle),
        "outcome": "infra_failure" if infra else "pass" if passed else "fail", "passed": bool(passed),
        "reward": None if infra else reward.value,
        "reward_tests": comps.get("tests"), "reward_hygiene": comps.get("hygiene"),
        "reward_judge": comps.get("judge"),
        "hard_gate_violations": len(gates), "hard_gates": gates, "human_intervention": bool(human),
        "turns": sum(1 for m in messages if m.get("role") == "assistant") or len(steps),
        "tool_calls": len(steps), "tokens_in": tokens_in, "tokens_out": tokens_out,
        "latency_s": timing.total_s, "sandbox_s": sandbox_s, "policy_s": policy_s,
        "cost_usd": episode_cost(card, policy_id=policy_id, tokens_in=tokens_in, tokens_out=tokens_out,
                                 policy_s=policy_s, sandbox_s=sandbox_s),
        "environment_id": bundle.environment_id, "environment_digest": bundle.environment_digest,
        "holdout_sha256": holdout_sha256, "started_at": started, "finished_at": finished, "error": error,
    }
    return EpisodeResult(row, timing)
