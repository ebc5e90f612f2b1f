"""Shared helpers for promotion tests: a gate report from synthetic rows, and a candidate run
through the state machine."""
from __future__ import annotations

from ratchet.promotion import state as S
from ratchet.promotion.config import GatePolicy
from ratchet.promotion.gates import evaluate_gates

from .synthetic import GOOD_EVIDENCE, episodes, tasks


def report(p_shift=0.3, n=80, policy=None, evidence=None, version="1", champion=("harness:sbfl", ""), **kw):
    T = tasks(n)
    champ = episodes(T, champion[0], checkpoint_version=champion[1])
    kw.setdefault("violation_rate", 0.0)
    cand = episodes(T, "embedded:rl", checkpoint_version=version, p_shift=p_shift, latency=kw.pop("latency", 25), **kw)
    return evaluate_gates(cand, champ, evidence or GOOD_EVIDENCE, policy or GatePolicy())


def promote_through(con, rep, policy=None, actor="test", champion_promotion_id=None, model=None):
    """evaluated -> (decide) -> canary -> promoted; returns the promotion id and its final state."""
    policy = policy or GatePolicy()
    pid = S.record_evaluation(con, rep, champion_promotion_id=champion_promotion_id, model=model).row["promotion_id"]
    t = S.decide(con, pid, policy=policy)
    if t is not None and t.state == S.State.APPROVED:
        S.start_canary(con, pid, actor=actor)
        S.promote(con, pid, actor=actor)
    return pid, S.current_state(con, pid)


def seed_suite(con, train: int = 1, holdout: int = 1):
    """A real HumanEval repair suite in `tasks`, the first `train` tasks in the train split and the
    next `holdout` in the holdout (split_assignments and holdout_manifest): what the exploit
    library is replayed on. Returns the bundles."""
    from datetime import UTC, datetime

    from ratchet.governance.tasks import task_rows
    from ratchet.store import insert
    from ratchet.tables import ddl
    from sandboxes.humaneval import build_suite

    for t in ("tasks", "split_assignments", "holdout_manifest"):
        con.execute(ddl(t))
    bundles = build_suite(seed=0, limit=train + holdout, per_problem=1).tasks[:train + holdout]
    assert len(bundles) == train + holdout
    now = datetime(2026, 11, 30, tzinfo=UTC)
    insert(con, "tasks", task_rows(bundles, suite_key="test", loaded_at=now))
    insert(con, "split_assignments", [{"id": f"task:{b.task_id}", "kind": "task", "source_id": b.task_id,
                                       "cluster_id": b.task_id, "split": "train" if i < train else "holdout",
                                       "assigned_at": now} for i, b in enumerate(bundles)])
    insert(con, "holdout_manifest", [{"version": 1, "task_id": b.task_id, "manifest_sha256": "x", "created_at": now.isoformat(),
                                      "locked": True} for b in bundles[train:]])
    return bundles
