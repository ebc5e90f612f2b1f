"""The documented analyst views compute what they say, on a real warehouse file."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)


@pytest.fixture
def store(tmp_path):
    from ratchet.warehouse import Warehouse

    wh = Warehouse(tmp_path / "warehouse.duckdb")
    wh.ensure_schema()
    return wh.store()


def _summary(policy, dimension, value, rate, passed, scored, baseline="harness:random", at=NOW):
    return {"computed_at": at, "policy_id": policy, "checkpoint_version": "", "dimension": dimension,
            "slice_value": value, "pass_rate": rate, "tasks_passed": passed, "tasks_scored": scored,
            "pass_rate_display": f"{rate:.1%} ({passed} / {scored} tasks)", "baseline_policy_id": baseline}


def test_scorecard_and_slice_deltas(store):
    old = datetime(2026, 11, 1, tzinfo=timezone.utc)
    store.insert("eval_summary", [
        _summary("harness:random", "all", "all", 0.25, 10, 40),
        _summary("harness:sbfl", "all", "all", 0.10, 4, 40, at=old),            # superseded by the next row
        _summary("harness:sbfl", "all", "all", 0.50, 20, 40),
        _summary("harness:random", "family", "comparison", 0.30, 3, 10),
        _summary("harness:sbfl", "family", "comparison", 0.20, 2, 10),
        _summary("harness:random", "family", "arith", 0.10, 1, 10),
        _summary("harness:sbfl", "family", "arith", 0.60, 6, 10)])
    store.insert("economics", [{"policy_id": "harness:sbfl", "checkpoint_version": "", "accepted_runs": 20,
                                "variable_per_accepted": "$0.01", "break_even": "not computable", "computable": True}])
    card = store.read("SELECT policy_id, pass_rate, variable_per_accepted FROM v_policy_scorecard")
    assert card == [{"policy_id": "harness:sbfl", "pass_rate": 0.5, "variable_per_accepted": "$0.01"},
                    {"policy_id": "harness:random", "pass_rate": 0.25, "variable_per_accepted": None}]
    deltas = store.read("SELECT slice_value, policy_id, delta FROM v_slice_deltas")
    assert [(d["slice_value"], d["policy_id"], round(d["delta"], 6)) for d in deltas] == [
        ("comparison", "harness:sbfl", -0.1), ("arith", "harness:sbfl", 0.5)]   # worst slice first


def test_promotion_history_consent_exclusions_and_lineage(store, tmp_path):
    from ratchet import samples
    from ratchet.governance.checkpoints import register_checkpoint
    from ratchet.ingest import ingest

    samples.write_samples(tmp_path / "in", n_synthetic=5)
    ingest([str(tmp_path / "in")], store.warehouse)
    recs = store.read("SELECT record_id, consent_id FROM trajectories WHERE consent_id IS NOT NULL ORDER BY 1 LIMIT 2")
    store.insert("consent_grants", [{"consent_id": recs[0]["consent_id"], "tenant_id": "acme", "scopes": ["train"],
                                     "retention_days": 90, "granted_at": NOW, "revoked_at": NOW}])
    with store.connect() as con:
        register_checkpoint(con, "ck-1", "acme", [r["record_id"] for r in recs])
    lineage = store.read("SELECT checkpoint_id, record_id, consent_id, revoked_at FROM v_lineage")
    assert [r["record_id"] for r in lineage] == sorted(r["record_id"] for r in recs)
    assert lineage[0]["consent_id"] == recs[0]["consent_id"] and lineage[0]["revoked_at"] == NOW
    store.insert("consent_audit", [{"record_id": recs[0]["record_id"], "target_tenant": "acme", "reason": "revoked",
                                    "consent_id": recs[0]["consent_id"], "evaluated_at": NOW}])
    ex = store.read("SELECT target_tenant, reason, grant_tenant, revoked_at FROM v_consent_exclusions")
    assert ex == [{"target_tenant": "acme", "reason": "revoked", "grant_tenant": "acme", "revoked_at": NOW}]
    store.insert("promotions", [
        {"seq": 2, "promotion_id": "p1", "policy_id": "rl", "state": "approved", "previous_state": "evaluated",
         "actor": "policy:auto", "at": NOW},
        {"seq": 1, "promotion_id": "p1", "policy_id": "rl", "state": "evaluated", "actor": "sensor", "at": NOW}])
    hist = store.read("SELECT seq, state, previous_state FROM v_promotion_history")
    assert hist == [{"seq": 1, "state": "evaluated", "previous_state": None},
                    {"seq": 2, "state": "approved", "previous_state": "evaluated"}]


def test_every_documented_view_exists(store):
    from ratchet import analyst_views

    names = {r["view_name"] for r in store.read("SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    assert set(analyst_views.VIEWS) <= names
