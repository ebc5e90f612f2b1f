"""Stage 3: consent / training rights. Execution access is not training permission.

    consent_grants ------------------------------\\
    split_assignments --[contamination]--> holdout_manifest --> training_views --[training_views_clean]--> (training)
    consent_grants --> checkpoint_flags

Per policy tenant, `training_set` holds only that tenant's train-split trajectories under an
unrevoked, unexpired train-scope grant (another tenant's only when its grant names this tenant);
`consent_audit` holds every exclusion with its reason. Logic: ratchet.governance.consent / store.
"""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from typing import Optional

from dagster import (AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetExecutionContext,
                     Config, MaterializeResult, MetadataValue, asset, asset_check)

from ratchet.markdown import md_table
from resources import WarehouseResource


class ConsentGrantsConfig(Config):
    registry_path: Optional[str] = None   # YAML or CSV; default RATCHET_HOME/consent_registry.yaml
    allow_missing: bool = False           # a missing registry = no grants: every trajectory is excluded


@asset(group_name="consent", kinds={"duckdb"}, pool="warehouse",
       description="The consent grant registry (consent_id, tenant, scopes, retention, revocation) as loaded now.")
def consent_grants(context: AssetExecutionContext, config: ConsentGrantsConfig, warehouse: WarehouseResource) -> MaterializeResult:
    from collections import Counter
    from datetime import datetime, timezone
    from pathlib import Path

    from ratchet.governance import store
    from ratchet.governance.consent import grant_rows, load_grants
    from ratchet.home import get_home

    path = Path(config.registry_path) if config.registry_path else get_home(warehouse.home).root / "consent_registry.yaml"
    if path.exists():
        try:
            grants = load_grants(path)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"consent registry {path} is malformed: {type(e).__name__}: {e}") from e
    elif config.allow_missing:
        context.log.warning(f"no consent registry at {path}: every trajectory will be excluded from training")
        grants = {}
    else:
        raise FileNotFoundError(
            f"consent registry not found at {path}. Create it (YAML list of grants with consent_id, tenant_id, "
            f"scopes, retention_days, granted_at, revoked_at) or set allow_missing: true to run with no grants.")
    now = datetime.now(timezone.utc)
    rows = [{**r, "source_path": str(path), "loaded_at": now} for r in grant_rows(grants)]
    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        store.replace(con, "consent_grants", rows)
    revoked = sorted(g.consent_id for g in grants.values() if g.revoked_at is not None)
    return MaterializeResult(metadata={
        "grants": len(rows), "registry": MetadataValue.path(str(path)), "registry_missing": not path.exists(),
        "by_tenant": MetadataValue.json(dict(Counter(g.tenant_id for g in grants.values()))),
        "revoked": MetadataValue.json(revoked),
        "without_train_scope": sum("train" not in g.scopes for g in grants.values())})


class TrainingViewsConfig(Config):
    now: Optional[str] = None        # ISO-8601 evaluation time (replays, tests); default: now
    tenants: list[str] = []          # policy tenants to build; empty = every tenant seen


@asset(group_name="consent", deps=["consent_grants", "split_assignments", "holdout_manifest", "trajectories"],
       kinds={"duckdb"}, pool="warehouse",
       description="Per policy tenant, the trajectories it may train on (`training_set`, views v_training_set) "
                   "and every exclusion with its reason (`consent_audit`, v_consent_audit_summary).")
def training_views(context: AssetExecutionContext, config: TrainingViewsConfig, warehouse: WarehouseResource) -> MaterializeResult:
    from collections import Counter

    from ratchet.governance import store
    from ratchet.governance.consent import grants_from_rows

    now = store.parse_now(config.now)
    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        grants = grants_from_rows(store.fetch(con, "SELECT * FROM consent_grants"))
        trajs = store.fetch(con, """SELECT record_id, trajectory_id, tenant_id, consent_id, task_id, started_at,
                                           ended_at, accepted, tests_passed FROM trajectories ORDER BY record_id""")
        split_of = {r["source_id"]: r for r in store.fetch(
            con, "SELECT source_id, split, cluster_id FROM split_assignments WHERE kind = 'trajectory'")}
    train, audit = store.training_rows(trajs, grants, split_of, now, tenants=config.tenants or None)
    if not grants:
        for a in audit:
            a["detail"] += " (the consent registry is empty or missing)"
    for r in (*train, *audit):
        r["dagster_run_id"] = context.run_id
    with wh.connect() as con, store.transaction(con):
        con.execute("DELETE FROM training_set")
        con.execute("DELETE FROM consent_audit")
        store.insert(con, "training_set", train)
        store.insert(con, "consent_audit", audit)
    per = Counter(r["tenant_id"] for r in train)
    reasons = Counter(a["reason"] for a in audit)
    tenants = sorted(set(per) | {a["target_tenant"] for a in audit})
    md = md_table(["policy tenant", "training rows", "excluded"],
                  [(t, per[t], sum(1 for a in audit if a["target_tenant"] == t)) for t in tenants])
    context.log.info(f"training views at {now.isoformat()}: {dict(per)}; excluded {dict(reasons)}")
    return MaterializeResult(metadata={
        "evaluated_at": now.isoformat(), "trajectories": len(trajs), "training_rows": len(train),
        "by_tenant": MetadataValue.md(md), "excluded_by_reason": MetadataValue.json(dict(reasons))})


@asset_check(asset="training_views", blocking=True,
             description="Re-verifies training_set in SQL, independently of the gate that built it: no row of another "
                         "tenant without a sharing grant, none under a missing / revoked / expired / non-train grant, "
                         "none outside the train split.")
def training_views_clean(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> AssetCheckResult:
    from ratchet.governance import store

    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        bad = store.fetch(con, store.TRAINING_VIOLATIONS_SQL)
        rows, = con.execute("SELECT count(*) FROM training_set").fetchall()[0]
    return AssetCheckResult(passed=not bad, severity=AssetCheckSeverity.ERROR, metadata={
        "training_rows": rows, "violations": sum(b["n"] for b in bad),
        "by_violation": MetadataValue.json({b["violation"]: b["n"] for b in bad}),
        "examples": MetadataValue.json([{k: b[k] for k in ("violation", "example_tenant", "example_record")} for b in bad])})


class CheckpointFlagsConfig(Config):
    now: Optional[str] = None        # ISO-8601; default: now


@asset(group_name="consent", deps=["consent_grants", "trajectories"], kinds={"duckdb"}, pool="warehouse",
       description="Flags every registered checkpoint (`checkpoints` table) trained on data under a revoked grant.")
def checkpoint_flags(context: AssetExecutionContext, config: CheckpointFlagsConfig, warehouse: WarehouseResource) -> MaterializeResult:
    from ratchet.governance import store

    now = store.parse_now(config.now)
    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        flags, new = store.flag_checkpoints(con, now, context.run_id)
        total, flagged = con.execute("SELECT count(*), count(*) FILTER (WHERE flagged) FROM checkpoints").fetchall()[0]
    if new:
        context.log.warning(f"flagged checkpoints trained on revoked grants: {new}")
    return MaterializeResult(metadata={
        "checkpoints": total, "flagged": flagged, "newly_flagged": MetadataValue.json(new),
        "flags": MetadataValue.json([{k: f[k] for k in ("checkpoint_id", "consent_id", "n_records")} for f in flags][:50])})
