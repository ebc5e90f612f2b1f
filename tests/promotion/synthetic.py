"""Seeded synthetic eval_episodes rows (the contract in ratchet/evaluation) for promotion tests."""
from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime, timedelta

DIGEST = "sha256:" + "ab" * 32
HOLDOUT = "cd" * 32
FAMILIES = ("off_by_one", "swap_operator", "drop_branch", "wrong_constant")
DIFFICULTIES = ("easy", "medium", "hard")
CATEGORIES = ("string", "math", "list")
TENANTS = ("acme", "globex", None)


def tasks(n: int, seed: int = 0) -> list[dict]:
    """n tasks with slice labels and a base pass probability each."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        fam = FAMILIES[i % len(FAMILIES)]
        out.append({"task_id": f"HumanEval/{i}/m{rng.randrange(9)}", "family": fam, "slice": fam,
                    "difficulty": rng.choice(DIFFICULTIES), "category": rng.choice(CATEGORIES),
                    "tenant_id": rng.choice(TENANTS), "p": rng.uniform(0.2, 0.9)})
    return out


def episodes(task_list: list[dict], policy_id: str, *, checkpoint_version: str = "", seeds: int = 3, seed: int = 0,
             p_shift: float = 0.0, p_of=None, outcome_of=None, infra_rate: float = 0.0, latency: float = 30.0,
             violation_rate: float = 0.02, reward_bonus: float = 0.0, judge_shift: float = 0.0,
             digest: str = DIGEST, holdout: str = HOLDOUT, eval_run_id: str | None = None) -> list[dict]:
    """Rows for one policy. The pass probability of a task is `p_of(task)` if given, else
    task["p"] + p_shift; `outcome_of(task, seed) -> bool` fixes outcomes exactly when given.
    `reward_bonus` adds reward that no verifier component earned (a hacked reward)."""
    rng = random.Random(f"{policy_id}|{checkpoint_version}|{seed}")
    run = eval_run_id or hashlib.sha1(f"{policy_id}{checkpoint_version}{seed}".encode()).hexdigest()[:12]
    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    rows = []
    for t in task_list:
        p = p_of(t) if p_of else min(1.0, max(0.0, t["p"] + p_shift))
        for s in range(seeds):
            infra = rng.random() < infra_rate
            ok = (outcome_of(t, s) if outcome_of else rng.random() < p) and not infra
            tests = 1.0 if ok else rng.choice((0.0, 0.3))
            hygiene = 1.0 if rng.random() > 0.05 else 0.0
            judge = min(1.0, max(0.0, (0.8 if ok else 0.3) + judge_shift + rng.uniform(-0.1, 0.1)))
            reward = None if infra else 0.55 * tests + 0.25 * hygiene + 0.20 * judge + reward_bonus
            lat = latency * rng.uniform(0.5, 1.5)
            rows.append({
                "eval_id": hashlib.sha1(f"{policy_id}|{checkpoint_version}|{t['task_id']}|{s}|{digest}".encode()).hexdigest(),
                "eval_run_id": run, "policy_id": policy_id, "checkpoint_version": checkpoint_version,
                "task_id": t["task_id"], "seed": s, "slice": t["slice"], "family": t["family"],
                "difficulty": t["difficulty"], "category": t["category"], "tenant_id": t["tenant_id"],
                "outcome": "infra_failure" if infra else ("pass" if ok else "fail"), "passed": ok,
                "reward": reward, "reward_tests": None if infra else tests, "reward_hygiene": None if infra else hygiene,
                "reward_judge": None if infra else judge,
                "hard_gate_violations": int(rng.random() < violation_rate) if not infra else 0, "hard_gates": [],
                "human_intervention": False, "turns": 5, "tool_calls": 4, "tokens_in": 1000, "tokens_out": 200,
                "latency_s": lat, "sandbox_s": lat / 2, "policy_s": lat / 2, "cost_usd": 0.01,
                "environment_id": "env://ratchet-humaneval@v1", "environment_digest": digest, "holdout_sha256": holdout,
                "started_at": t0, "finished_at": t0 + timedelta(seconds=lat),
                "error": "sandbox crashed" if infra else None})
    return rows


def redteam_rows(digest="sha256:" + "e" * 64, exploit_reward=0.0, true_fix=0.9, voids=0, paying="eq_anything",
                 at=None, redteam_id="redteam-synthetic"):
    """A `reward_redteam` replay as the recorder writes it: every exploit of the library at 0.0
    (and `paying` at `exploit_reward`) under a true-fix floor of `true_fix`."""
    from sandboxes.redteam import EXPLOITS

    at = at or datetime(2026, 11, 30, tzinfo=UTC)
    return [{"redteam_id": redteam_id, "environment_digest": digest, "exploit": e.name, "kind": e.kind,
             "tasks_applied": 1, "max_reward": exploit_reward if e.name == paying else 0.0,
             "max_reward_task": "humaneval-000-x", "statuses": ["scored"],
             "infra_voids": voids if e.name == paying else 0, "true_fix_min_reward": true_fix,
             "true_fix_min_task": "humaneval-000-x", "true_fix_unscored": 0, "tasks": ["humaneval-000-x"],
             "task_digests": ["sha256:" + "1" * 64], "environment_ids": ["env://ratchet-humaneval-repair@v1"],
             "code_digest": "sha256:" + "2" * 64, "runtime": "bwrap", "seconds": 1.0, "computed_at": at,
             "dagster_run_id": None} for e in EXPLOITS.values()]


GOOD_EVIDENCE = {"judge_kappa": 0.86, "contamination_rate": 0.0, "consent_violations": [], "lineage_recorded": True,
                 "reward_redteam": redteam_rows()}
