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
        _POLICIES[key] = make_policy(policy_id, **with_memo(policy_id, policy_kwargs))
    return _POLICIES[key]


def with_memo(policy_id: str, policy_kwargs: dict) -> dict:
    """A checkpoint's greedy completions are kept in RATCHET_HOME/cache/completions/<weights>.sqlite
    (ratchet.policy.engines.completion_memo): each seed of an evaluation is its own Dagster run, and
    a greedy policy's seeds of a deterministic episode ask the same turns. `memo_path=None` in the
    policy kwargs turns it off."""
    kw = dict(policy_kwargs)
    if policy_id.partition(":")[0] in BATCHED_ENGINES and kw.get("path") and "memo_path" not in kw:
        from ratchet.home import get_home
        from ratchet.policy.engines.completion_memo import memo_file

        kw["memo_path"] = str(memo_file(get_home().root, kw["path"]))
    return kw


def eval_id(policy_id: str, checkpoint_version: str, task_id: str, seed: int, environment_digest: str,
            judge: str = "") -> str:
    """The episode's identity: policy x checkpoint x task x seed x environment, and the judge that
    grades R_judge (another judge is another reward: its rows are not resumed from the old ones)."""
    key = f"{policy_id}|{checkpoint_version}|{task_id}|{int(seed)}|{environment_digest}" + (f"|{judge}" if judge else "")
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


def judge_id(judge) -> str:
    """Who grades R_judge: the judge's name; without one, the reward's default (RubricJudge)."""
    from sandboxes.verifiers.judge import RubricJudge

    return getattr(judge if judge is not None else RubricJudge, "name", None) or type(judge).__name__


def episode_row(policy_id: str, checkpoint_version: str, bundle, seed: int, rec, *, eval_run_id: str = "",
                holdout_sha256: str = "", rate_card=None, error: str | None = None,
                policy_s: float | None = None, judge=None) -> dict:
    """The eval_episodes row of one episode record (`ratchet.policy.EpisodeRecord`), or of an
    episode that never ran (`rec` None: an infra failure with `error`). `policy_s`: the episode's
    share of generation time when it was generated in batches with others (see
    `run_policy_chunk`); default the record's own. `judge`: the judge the episode ran under
    (`judge_id`)."""
    from datetime import datetime, timezone

    from ratchet.evaluation.economics import RateCard, episode_cost

    now = datetime.now(timezone.utc)
    if rec is not None:
        outcome, passed, comps, gates = rec.outcome, bool(rec.passed), dict(rec.components), list(rec.hard_gates)
        err = rec.error[:2000] if rec.error else None
    else:
        outcome, passed, comps, gates = "infra_failure", False, {}, []
        err = (error or "the episode did not run")[:2000]
    infra = outcome == "infra_failure"
    tokens_in, tokens_out = (rec.tokens_in, rec.tokens_out) if rec else (0, 0)
    sandbox_s = rec.sandbox_s if rec else 0.0
    if policy_s is None:
        policy_s = rec.policy_s if rec else 0.0
    # an engine that reports its own price (an API) wins; otherwise the rate card prices it
    cost = rec.cost_usd if rec is not None and rec.cost_usd is not None else episode_cost(
        rate_card or RateCard(), policy_id=policy_id, tokens_in=tokens_in, tokens_out=tokens_out,
        policy_s=policy_s, sandbox_s=sandbox_s)
    return {
        "eval_id": eval_id(policy_id, checkpoint_version, bundle.task_id, seed, bundle.environment_digest,
                           judge_id(judge)),
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
        "error": err, "judge_id": judge_id(judge),
    }


def run_policy_episode(policy_id: str, checkpoint_version: str, bundle, seed: int, *, runtime=None,
                       judge=None, eval_run_id: str = "", holdout_sha256: str = "", rate_card=None,
                       policy_kwargs: dict | None = None, policy=None) -> dict:
    """Run one episode and return its eval_episodes row (definitions in the module doc).
    `policy`: an already made policy object (otherwise made from the id and `policy_kwargs`)."""
    from ratchet.policy import run_policy_episode as run

    check_judge(judge, policy_id)
    rec, err = None, None
    try:
        pol = policy or get_policy(policy_id, checkpoint_version, **(policy_kwargs or {}))
        rec = run(pol, bundle, seed, runtime=runtime, judge=judge)
    except Exception as e:  # noqa: BLE001 - an engine that cannot even start voids the episode
        err = f"{type(e).__name__}: {e}"
    return episode_row(policy_id, checkpoint_version, bundle, seed, rec, eval_run_id=eval_run_id,
                       holdout_sha256=holdout_sha256, rate_card=rate_card, error=err, judge=judge)


# ------------------------------------------------------------------------- batched episodes
# Engines whose `generate` runs a list of requests through the model as one batch: their episodes
# are evaluated in chunks through `ratchet.policy.run_episodes` (one generate call for every
# episode waiting on the policy). Harness / scripted agents answer one request at a time and HTTP
# engines are priced per call, so they keep one episode per job.
BATCHED_ENGINES = ("embedded", "hf")


def batches_generation(policy_id: str) -> bool:
    return policy_id.partition(":")[0] in BATCHED_ENGINES


class _Timed:
    """A policy that times its generate calls: the total (the worker's generation time) and each
    episode's share of every batch it was in (the call's wall time split evenly over its requests),
    so the shares sum to the generation time and a batch of 16 is not billed 16 times."""

    def __init__(self, policy):
        self._policy, self.generate_s, self.calls, self.requests = policy, 0.0, 0, 0
        self.share: dict = {}

    def __getattr__(self, name):                  # policy_id, spec, sampling, ...: the policy's own
        if name.startswith("__") or name == "_policy":
            raise AttributeError(name)
        return getattr(self._policy, name)

    def generate(self, requests):
        import time

        t0 = time.monotonic()
        try:
            return self._policy.generate(requests)
        finally:
            dt = time.monotonic() - t0
            self.generate_s += dt
            self.calls += 1
            self.requests += len(requests)
            for r in requests:
                key = (r.metadata.get("task_id"), r.metadata.get("episode_seed"))
                self.share[key] = self.share.get(key, 0.0) + dt / len(requests)


def run_policy_chunk(policy_id: str, checkpoint_version: str, jobs, *, runtime=None, judge=None,
                     eval_run_id: str = "", holdout_sha256: str = "", rate_card=None,
                     policy_kwargs: dict | None = None, concurrency: int = 16, policy=None) -> tuple[list[dict], dict]:
    """Episodes `jobs` [(bundle, seed), ...] (distinct pairs) run together by
    `ratchet.policy.run_episodes`: up to `concurrency` open at once, one batched generate call for
    every episode waiting on the policy, sandbox steps in threads meanwhile. Returns (one
    eval_episodes row per job, in job order; timing). Rows are built as `run_policy_episode`
    builds them, except `policy_s`: the episode's share of generation time (see `_Timed`).
    timing: `chunk_s` (this call), `runner_s` (inside run_episodes), `generate_s` (inside the
    policy's generate calls), `calls`, `requests`, `episodes`."""
    import time

    from ratchet.policy import run_episodes

    check_judge(judge, policy_id)
    jobs = list(jobs)
    t0 = time.monotonic()
    timing = {"episodes": len(jobs), "chunk_s": 0.0, "runner_s": 0.0, "generate_s": 0.0, "calls": 0, "requests": 0}
    recs, err, timed = [None] * len(jobs), None, None
    try:
        timed = _Timed(policy or get_policy(policy_id, checkpoint_version, **(policy_kwargs or {})))
        t1 = time.monotonic()
        recs = run_episodes(timed, jobs, concurrency=max(1, min(concurrency, len(jobs))), runtime=runtime,
                            judge=judge)
        timing["runner_s"] = time.monotonic() - t1
    except Exception as e:  # noqa: BLE001 - an engine that cannot start (or a runner crash) voids the chunk
        err = f"{type(e).__name__}: {e}"
    rows = [episode_row(policy_id, checkpoint_version, b, s, rec, eval_run_id=eval_run_id,
                        holdout_sha256=holdout_sha256, rate_card=rate_card, error=err, judge=judge,
                        policy_s=timed.share.get((b.task_id, int(s)), 0.0) if timed and rec else None)
            for (b, s), rec in zip(jobs, recs)]
    if timed is not None:
        timing.update(generate_s=timed.generate_s, calls=timed.calls, requests=timed.requests)
    timing["chunk_s"] = time.monotonic() - t0
    return rows, timing
