"""The promotion state machine over a real DuckDB file: legal and illegal moves, approval rules,
idempotency under threads and processes, stale champions, rollback."""
import multiprocessing as mp

import duckdb
import pytest

from ratchet.promotion import state as S
from ratchet.promotion.config import GatePolicy
from ratchet.promotion.tables import ensure
from ratchet.warehouse import Warehouse

from .helpers import promote_through, report
from .synthetic import GOOD_EVIDENCE

pytestmark = pytest.mark.promotion


@pytest.fixture
def con(tmp_path):
    c = duckdb.connect(str(tmp_path / "w.duckdb"))
    ensure(c)
    yield c
    c.close()


@pytest.fixture(scope="module")
def good():
    return report(0.3)


def test_happy_path_rows_chain_and_champion(con, good):
    pid, st = promote_through(con, good)
    assert st == S.State.PROMOTED
    rows = S.history(con, pid)
    assert [r["state"] for r in rows] == ["evaluated", "approved", "canary", "promoted"]
    assert [r["previous_state"] for r in rows] == [None, "evaluated", "approved", "canary"]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["actor"] == "policy:default"
    assert rows[0]["evidence"]["verdict"] == "pass" and rows[0]["verdict"] == "pass"
    champ = S.current_champion(con)
    assert (champ["policy_id"], champ["checkpoint_version"], champ["promotion_id"]) == ("embedded:rl", "1", pid)


@pytest.mark.parametrize("moves, bad", [
    ([], S.State.APPROVED),                                   # nothing evaluated yet
    ([], S.State.PROMOTED),
    (["evaluated"], S.State.PROMOTED),                        # skipping approval and canary
    (["evaluated"], S.State.CANARY),
    (["evaluated", "rejected"], S.State.APPROVED),            # rejected is final
    (["evaluated", "approved"], S.State.PROMOTED),            # no promotion without a canary
])
def test_illegal_transitions_raise(con, good, moves, bad):
    pid = "p1"
    cand = {"policy_id": "embedded:rl", "checkpoint_version": "1"}
    for m in moves:
        S.transition(con, pid, m, actor="t", candidate=cand, evidence=good.to_dict())
    with pytest.raises(S.IllegalTransition, match="is not allowed"):
        S.transition(con, pid, bad, actor="t", candidate=cand)
    assert len(S.history(con, pid)) == len(moves)


def test_repeated_request_is_applied_once(con, good):
    pid = S.record_evaluation(con, good).row["promotion_id"]
    first, again = S.decide(con, pid, policy=GatePolicy()), S.approve(con, pid, policy=GatePolicy())
    assert first.applied and not again.applied and again.row["seq"] == first.row["seq"]
    assert S.record_evaluation(con, good).applied is False
    assert con.execute("SELECT count(*) FROM promotions").fetchall()[0][0] == 2


def test_nobody_approves_past_a_failed_hard_gate(con):
    rep = report(0.3, evidence={**GOOD_EVIDENCE, "judge_kappa": 0.7})
    assert rep.failed == ["judge_kappa"] and rep.verdict == "reject"
    pid = S.record_evaluation(con, rep).row["promotion_id"]
    for owner in (None, "alice"):
        with pytest.raises(S.ApprovalRefused, match="judge_kappa"):
            S.approve(con, pid, policy=GatePolicy(), owner=owner)
    t = S.decide(con, pid, policy=GatePolicy())
    assert t.state == S.State.REJECTED and t.row["failing_gates"] == ["judge_kappa"]


def test_owner_may_waive_a_soft_gate_the_policy_may_not(con):
    soft = GatePolicy(soft_gates=("latency_p95",), owners=("alice",))
    rep = report(0.3, policy=soft, latency=60)     # slower than the champion's 30 s
    assert rep.failed == ["latency_p95"] and rep.verdict == "needs_owner"
    pid = S.record_evaluation(con, rep).row["promotion_id"]
    assert S.decide(con, pid, policy=soft) is None and S.current_state(con, pid) == S.State.EVALUATED
    with pytest.raises(S.ApprovalRefused, match="pre-authorised"):
        S.approve(con, pid, policy=soft)
    with pytest.raises(S.ApprovalRefused, match="not an approver"):
        S.approve(con, pid, policy=soft, owner="mallory")
    t = S.approve(con, pid, policy=soft, owner="alice", reason="latency budget raised for Q4")
    assert t.applied and t.row["actor"] == "owner:alice" and "Q4" in t.row["reason"]
    assert "waived soft gates ['latency_p95']" in t.row["reason"]


def test_soft_gates_cannot_include_always_hard_ones():
    with pytest.raises(ValueError, match="must stay hard"):
        GatePolicy(soft_gates=("consent",))
    with pytest.raises(ValueError, match="unknown setting"):
        GatePolicy.from_dict({"margn": 0.1})


def test_stale_champion_is_refused(con, good):
    a, _ = promote_through(con, good)
    b_rep, c_rep = report(0.3, version="2", champion=("embedded:rl", "1")), report(0.3, version="3", champion=("embedded:rl", "1"))
    b, st = promote_through(con, b_rep, champion_promotion_id=a)
    assert st == S.State.PROMOTED
    c = S.record_evaluation(con, c_rep, champion_promotion_id=a).row["promotion_id"]
    S.decide(con, c, policy=GatePolicy())
    S.start_canary(con, c, actor="t")
    with pytest.raises(S.StaleChampion, match="re-evaluate"):
        S.promote(con, c, actor="t")
    assert S.current_champion(con)["promotion_id"] == b


def test_rollback_restores_the_previous_champion_in_one_step(con, good):
    a, _ = promote_through(con, good)
    b, _ = promote_through(con, report(0.3, version="2", champion=("embedded:rl", "1")), champion_promotion_id=a)
    n = con.execute("SELECT count(*) FROM promotions").fetchall()[0][0]
    t, restored = S.rollback(con, actor="owner:alice", reason="p95 regression in prod", promotion_id=b)
    assert t.applied and restored["promotion_id"] == a and restored["checkpoint_version"] == "1"
    assert con.execute("SELECT count(*) FROM promotions").fetchall()[0][0] == n + 1
    again, still = S.rollback(con, actor="owner:alice", reason="second tick", promotion_id=b)
    assert not again.applied and still["promotion_id"] == a
    with pytest.raises(S.IllegalTransition, match="not the current champion"):
        S.rollback(con, actor="x", reason="y", promotion_id="nope")
    S.rollback(con, actor="x", reason="back to baseline")
    assert S.current_champion(con) is None
    with pytest.raises(S.IllegalTransition, match="nothing to roll back"):
        S.rollback(con, actor="x", reason="y")


def test_canary_abort_keeps_the_champion(con, good):
    a, _ = promote_through(con, good)
    rep = report(0.3, version="2", champion=("embedded:rl", "1"))
    b = S.record_evaluation(con, rep, champion_promotion_id=a).row["promotion_id"]
    S.decide(con, b, policy=GatePolicy())
    with pytest.raises(S.IllegalTransition, match="not in canary"):
        S.abort_canary(con, b, actor="t", reason="x")
    S.start_canary(con, b, actor="t")
    assert S.abort_canary(con, b, actor="canary", reason="pass rate fell").state == S.State.ROLLED_BACK
    assert S.current_champion(con)["promotion_id"] == a


def test_threads_promote_at_most_once(tmp_path, good):
    """Eight threads, each with its own DuckDB connection (cursor) to one file, request every
    move at once, for five candidates in turn: one row per state each."""
    import threading

    root = duckdb.connect(str(tmp_path / "t.duckdb"))
    ensure(root)
    for i in range(5):
        pid = S.record_evaluation(root, good, promotion_id=f"p{i}").row["promotion_id"]
        barrier, applied, errors = threading.Barrier(8), [], []

        def tick():
            c = root.cursor()
            try:
                barrier.wait()
                for step in (lambda: S.decide(c, pid, policy=GatePolicy()),
                             lambda: S.start_canary(c, pid, actor="sensor"), lambda: S.abort_canary(c, pid, actor="sensor", reason="t")):
                    applied.append(step().applied)
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=tick) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors, errors
        states = [r[0] for r in root.execute("SELECT state FROM promotions WHERE promotion_id = ? ORDER BY seq", [pid]).fetchall()]
        assert states == ["evaluated", "approved", "canary", "rolled_back"]
        assert sum(applied) == 3 and len(applied) == 24


def _process_tick(path: str, rep: dict, barrier) -> list[bool]:
    wh = Warehouse(path)
    barrier.wait()
    out = []
    for step in ("evaluate", "decide", "canary", "promote"):
        with wh.connect() as c:
            ensure(c)
            if step == "evaluate":
                t = S.record_evaluation(c, rep)
                pid = t.row["promotion_id"]
            elif step == "decide":
                t = S.decide(c, pid, policy=GatePolicy())
            elif step == "canary":
                t = S.start_canary(c, pid, actor="sensor")
            else:
                t = S.promote(c, pid, actor="sensor")
            out.append(t.applied)
    return out


def test_processes_promote_at_most_once(tmp_path, good):
    """Three processes (two sensor ticks and a retry) drive one candidate through the warehouse's
    locked connections: each state is recorded once, by whichever got there first."""
    path = str(tmp_path / "warehouse.duckdb")
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")
    # ProcessPoolExecutor and timeouts, not Pool.starmap: a full run hung once in Pool.__exit__
    # (a worker blocked on the task queue's lock); here a lost worker fails the test instead.
    with ctx.Manager() as m:
        barrier = m.Barrier(3, timeout=120)
        with ProcessPoolExecutor(3, mp_context=ctx) as pool:
            futures = [pool.submit(_process_tick, path, good.to_dict(), barrier) for _ in range(3)]
            results = [f.result(timeout=300) for f in futures]
    applied = [sum(col) for col in zip(*results)]
    assert applied == [1, 1, 1, 1]
    con = duckdb.connect(path, read_only=True)
    states = [r[0] for r in con.execute("SELECT state FROM promotions ORDER BY seq").fetchall()]
    assert states == ["evaluated", "approved", "canary", "promoted"]
