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
