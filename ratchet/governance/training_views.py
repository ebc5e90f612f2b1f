"""Per policy tenant, the trajectories it may train on: the consent gate (`consent.training_view`)
then the split gate, and an independent SQL re-check of the stored result."""
from __future__ import annotations

from datetime import datetime
from typing import Iterable, Mapping

from .consent import training_view
from .tables import TRAJ_PREFIX

# What the gate reads of each trajectory.
TRAJECTORIES_SQL = """SELECT record_id, trajectory_id, tenant_id, consent_id, task_id, started_at, ended_at,
                             accepted, tests_passed FROM trajectories ORDER BY record_id"""
GRANTS_SQL = "SELECT * FROM consent_grants"
SPLIT_OF_SQL = "SELECT source_id, split, cluster_id FROM split_assignments WHERE kind = 'trajectory'"


def training_rows(trajectories: Iterable[Mapping], grants: Mapping, split_of: Mapping[str, Mapping],
                  now: datetime, tenants: Iterable[str] | None = None) -> tuple[list[dict], list[dict]]:
    """Per policy tenant, the consent gate (`consent.training_view`) and then the split gate:
    only the train split trains (reason `not_train_split`, detail the split or "unassigned").
    trajectories: rows with record_id, trajectory_id, tenant_id, consent_id, task_id, started_at,
    ended_at, accepted, tests_passed. split_of: record_id -> {split, cluster_id}.
    Returns (training_set rows, consent_audit rows) without run ids."""
    trajectories = list(trajectories)
    if tenants is None:
        tenants = {t["tenant_id"] for t in trajectories if t.get("tenant_id")}
        tenants |= {g.tenant_id for g in grants.values()}
        tenants |= {x for g in grants.values() for x in g.cross_tenant_train_for}
    train, audit = [], []
    for tenant in sorted(tenants):
        view, excluded = training_view(trajectories, grants, now, tenant)
        for a in excluded:
            a["split"] = (split_of.get(a["record_id"]) or {}).get("split")
            a["evaluated_at"] = now
        audit.extend(excluded)
        for t in view:
            s = split_of.get(t["record_id"]) or {}
            if s.get("split") != "train":
                audit.append({
                    "record_id": t["record_id"], "trajectory_id": t.get("trajectory_id"), "tenant_id": t.get("tenant_id"),
                    "consent_id": t.get("consent_id"), "target_tenant": tenant, "reason": "not_train_split",
                    "detail": f"split {s['split']}" if s.get("split") else "no split assigned yet (run split_assignments)",
                    "split": s.get("split"), "evaluated_at": now})
                continue
            train.append({
                "tenant_id": tenant, "record_id": t["record_id"], "trajectory_id": t.get("trajectory_id"),
                "owner_tenant_id": t.get("tenant_id"), "consent_id": t.get("consent_id"), "task_id": t.get("task_id"),
                "cluster_id": s.get("cluster_id"), "split": "train", "accepted": t.get("accepted"),
                "tests_passed": t.get("tests_passed"), "ended_at": t.get("ended_at"), "evaluated_at": now})
    return train, audit


# Independent re-verification of training_set in SQL (not the Python gate that produced it).
TRAINING_VIOLATIONS_SQL = f"""
    WITH v AS (
      SELECT ts.tenant_id, ts.record_id, CASE
        WHEN t.record_id IS NULL THEN 'unknown_record'
        WHEN t.consent_id IS NULL THEN 'missing_consent'
        WHEN g.consent_id IS NULL THEN 'unknown_consent'
        WHEN g.tenant_id IS DISTINCT FROM t.tenant_id THEN 'tenant_mismatch'
        WHEN t.tenant_id IS DISTINCT FROM ts.tenant_id
             AND NOT list_contains(coalesce(g.cross_tenant_train_for, []::VARCHAR[]), ts.tenant_id) THEN 'cross_tenant'
        WHEN g.revoked_at IS NOT NULL AND g.revoked_at <= ts.evaluated_at THEN 'revoked'
        WHEN NOT list_contains(coalesce(g.scopes, []::VARCHAR[]), 'train') THEN 'no_train_scope'
        WHEN coalesce(t.ended_at, t.started_at) IS NULL
             OR ts.evaluated_at > coalesce(t.ended_at, t.started_at) + to_days(CAST(g.retention_days AS INTEGER))
             THEN 'expired'
        WHEN s.split IS DISTINCT FROM 'train' THEN 'not_train_split'
        WHEN count(*) OVER (PARTITION BY ts.tenant_id, ts.record_id) > 1 THEN 'duplicate_row'
      END AS violation
      FROM training_set ts
      LEFT JOIN trajectories t USING (record_id)
      LEFT JOIN consent_grants g ON g.consent_id = t.consent_id
      LEFT JOIN split_assignments s ON s.id = '{TRAJ_PREFIX}' || ts.record_id)
    SELECT violation, count(*) AS n, min(tenant_id) AS example_tenant, min(record_id) AS example_record
    FROM v WHERE violation IS NOT NULL GROUP BY 1 ORDER BY 2 DESC"""
