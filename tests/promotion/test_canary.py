"""The canary decision (pure) and its hand-off to the state machine."""
import duckdb
import pytest

from ratchet.promotion import state as S
from ratchet.promotion.canary import decide_canary, route
from ratchet.promotion.config import CanaryPolicy, GatePolicy
from ratchet.promotion.tables import ensure

from .helpers import report
from .synthetic import episodes, tasks

pytestmark = pytest.mark.promotion


def _window(n=400, share=0.2, cand_shift=0.0, **cand_kw):
    fresh = [dict(t, task_id=f"fresh/{i}") for i, t in enumerate(tasks(n, seed=7))]
    arm = route([t["task_id"] for t in fresh], share, seed=3)
    cand = episodes([t for t in fresh if arm[t["task_id"]] == "candidate"], "embedded:rl", checkpoint_version="2",
                    seeds=1, p_shift=cand_shift, **cand_kw)
    champ = episodes([t for t in fresh if arm[t["task_id"]] == "champion"], "embedded:rl", checkpoint_version="1",
                     seeds=1, violation_rate=0.0)
    return cand, champ


def test_route_is_deterministic_and_near_the_share():
    ids = [f"t{i}" for i in range(5000)]
    a, b = route(ids, 0.1, seed=1), route(ids, 0.1, seed=1)
    assert a == b
    assert 400 <= sum(v == "candidate" for v in a.values()) <= 600
    assert route(ids, 0.1, seed=2) != a
    with pytest.raises(ValueError, match="share"):
        route(ids, 1.0)


def test_waits_until_the_window_is_full():
    cand, champ = _window(n=60, share=0.2)
    d = decide_canary(cand, champ, CanaryPolicy(share=0.2, min_tasks=20))
    assert d.action == "wait" and "window not full" in d.reasons[0]


def test_promotes_a_better_candidate_and_rolls_back_a_worse_one():
    cand, champ = _window(cand_shift=0.3, violation_rate=0.0, latency=25)
    d = decide_canary(cand, champ, CanaryPolicy(share=0.2))
    assert d.action == "promote", d.reasons
    cand, champ = _window(cand_shift=-0.3, violation_rate=0.0, latency=25)
    d = decide_canary(cand, champ, CanaryPolicy(share=0.2))
    assert d.action == "rollback" and "pass rate" in d.reasons[0]
    assert d.numbers["candidate"]["pass_rate"] < d.numbers["champion"]["pass_rate"]


@pytest.mark.parametrize("kw, why", [({"violation_rate": 0.3, "latency": 25}, "hard-gate"),
                                     ({"violation_rate": 0.0, "latency": 90}, "p95 latency")])
def test_rolls_back_on_safety_or_latency(kw, why):
    cand, champ = _window(cand_shift=0.3, **kw)
    d = decide_canary(cand, champ, CanaryPolicy(share=0.2))
    assert d.action == "rollback" and any(why in r for r in d.reasons)


def test_canary_tasks_must_be_fresh():
    cand, champ = _window()
    with pytest.raises(ValueError, match="fresh tasks only"):
        decide_canary(cand, champ, CanaryPolicy(share=0.2), excluded_task_ids={cand[0]["task_id"]})


def test_decision_drives_the_state_machine(tmp_path):
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    ensure(con)
    for shift, final in ((0.3, S.State.PROMOTED), (-0.3, S.State.ROLLED_BACK)):
        pid = S.record_evaluation(con, report(0.3, version=str(shift)), promotion_id=f"p{shift}",
                                  champion_promotion_id=(S.current_champion(con) or {}).get("promotion_id")).row["promotion_id"]
        S.decide(con, pid, policy=GatePolicy())
        S.start_canary(con, pid, actor="canary")
        cand, champ = _window(cand_shift=shift, violation_rate=0.0, latency=25)
        d = decide_canary(cand, champ, CanaryPolicy(share=0.2))
        if d.action == "promote":
            S.promote(con, pid, actor="canary", reason=d.reasons[0], evidence=d.numbers)
        else:
            S.abort_canary(con, pid, actor="canary", reason="; ".join(d.reasons), evidence=d.numbers)
        assert S.current_state(con, pid) == final
    assert S.current_champion(con)["promotion_id"] == "p0.3"
