"""The promotion step the asset runs (ratchet.promotion.flow) on a DuckDB file: re-running it
continues where the promotion stands, and the canary decides from fresh-task rows."""
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

from ratchet.promotion import flow
from ratchet.promotion import state as S
from ratchet.promotion.config import CanaryPolicy, GatePolicy
from ratchet.promotion.gates import evaluate_gates
from ratchet.promotion.tables import ensure

from .synthetic import GOOD_EVIDENCE, episodes, tasks

pytestmark = pytest.mark.promotion


@pytest.fixture
def con(tmp_path):
    from ratchet.evaluation import tables as eval_tables

    c = duckdb.connect(str(tmp_path / "w.duckdb"))
    eval_tables.ensure(c)
    ensure(c)
    yield c
    c.close()


def _inputs(con, T):
    from ratchet.evaluation.tables import write_episodes

    champ = episodes(T, "harness:sbfl")
    cand = episodes(T, "embedded:rl", checkpoint_version="1", p_shift=0.3, violation_rate=0.0, latency=25)
    write_episodes(con, champ + cand)
    return flow.read_inputs(con, baseline=("harness:sbfl", ""), now=datetime.now(UTC), candidate=("embedded:rl", "1"),
                            min_seeds=3)


@pytest.mark.parametrize("shift, final", [(0.3, S.State.PROMOTED), (-0.3, S.State.ROLLED_BACK)])
def test_rerun_continues_and_the_canary_decides_on_fresh_tasks(con, shift, final):
    from ratchet.evaluation.tables import write_episodes

    inputs = _inputs(con, tasks(60))
    assert inputs.waiting is None and len(inputs.champion_rows) == 180
    report = evaluate_gates(inputs.candidate_rows, inputs.champion_rows, GOOD_EVIDENCE, GatePolicy())
    kw = {"gate_policy": GatePolicy(), "canary_policy": CanaryPolicy(share=0.3, min_tasks=10)}
    first = flow.advance(con, report, inputs, **kw)
    assert first.state == S.State.CANARY and first.canary.startswith("wait")
    # Fresh traffic after the canary started (task ids in no split), one seed each.
    later = datetime.now(UTC) + timedelta(seconds=1)
    fresh = [dict(t, task_id=f"fresh/{i}") for i, t in enumerate(tasks(120, seed=5))]
    for rows in (episodes(fresh, "harness:sbfl", seeds=1),
                 episodes(fresh, "embedded:rl", checkpoint_version="1", seeds=1, p_shift=shift, violation_rate=0.0,
                          latency=25)):
        write_episodes(con, [dict(r, started_at=later, finished_at=later) for r in rows])
    again = flow.advance(con, report, inputs, **kw)
    assert again.promotion_id == first.promotion_id and again.state == final, again.canary
    states = [r["state"] for r in again.history]
    assert states == ["evaluated", "approved", "canary", final.value]
    assert (again.champion or {}).get("promotion_id") == (first.promotion_id if final == S.State.PROMOTED else None)
    assert flow.advance(con, report, inputs, **kw).history == again.history     # a third tick changes nothing


def test_a_hard_failure_is_rejected_before_any_owner_approval(con):
    inputs = _inputs(con, tasks(40))
    report = evaluate_gates(inputs.candidate_rows, inputs.champion_rows, {**GOOD_EVIDENCE, "judge_kappa": 0.5})
    out = flow.advance(con, report, inputs, gate_policy=GatePolicy(), canary_policy=CanaryPolicy(), owner="alice")
    assert out.state == S.State.REJECTED and out.history[-1]["failing_gates"] == ["judge_kappa"]
    # The same evaluation against the same champion is the same promotion: asking again changes nothing.
    assert flow.advance(con, report, inputs, gate_policy=GatePolicy(), canary_policy=CanaryPolicy(),
                        owner="alice").history == out.history


def test_an_unlisted_owner_is_refused_and_reported(con):
    inputs = _inputs(con, tasks(40))
    soft = GatePolicy(soft_gates=("latency_p95",), owners=("bob",))
    slow = [dict(r, latency_s=r["latency_s"] * 3) for r in inputs.candidate_rows]
    report = evaluate_gates(slow, inputs.champion_rows, GOOD_EVIDENCE, soft)
    inputs.candidate_rows = slow
    out = flow.advance(con, report, inputs, gate_policy=soft, canary_policy=CanaryPolicy(), owner="alice",
                       canary_skip=True)
    assert out.state == S.State.EVALUATED and "not an approver" in out.refused
