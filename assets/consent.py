"""Stage 3: consent / training rights. Execution access is not training permission.

    consent_grants ------------------------------\\
    split_assignments --[contamination]--> holdout_manifest --> training_set + consent_audit --[training_set_clean]--> (training)
    consent_grants --> checkpoint_flags

Per policy tenant, `training_set` holds only that tenant's train-split trajectories under an
unrevoked, unexpired train-scope grant (another tenant's only when its grant names this tenant);
`consent_audit` holds every exclusion with its reason. Logic: ratchet.governance.consent / store.
"""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from typing import Optional

import dagster as dg

from assets import OWNERS, table_metadata
from ratchet.markdown import md_table
from resources import WarehouseResource


class ConsentGrantsConfig(dg.Config):
    registry_path: Optional[str] = None   # YAML or CSV; default RATCHET_HOME/consent_registry.yaml
    allow_missing: bool = False           # a missing registry = no grants: every trajectory is excluded


@dg.asset(group_name="consent", owners=OWNERS["consent"], metadata=table_metadata("consent_grants"),
          kinds={"duckdb"}, pool="warehouse",
          description="The consent grant registry (consent_id, tenant, scopes, retention, revocation) as loaded now.")
def consent_grants(context: dg.AssetExecutionContext, config: ConsentGrantsConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    from collections import Counter
    from pathlib import Path

    from ratchet.clock import now_utc
    from ratchet.governance.consent import grant_rows, read_registry
    from ratchet.home import get_home

    path = Path(config.registry_path) if config.registry_path else get_home(warehouse.home).root / "consent_registry.yaml"
    grants = read_registry(path, allow_missing=config.allow_missing)
    if not path.exists():
        context.log.warning(f"no consent registry at {path}: every trajectory will be excluded from training")
    now = now_utc()
    rows = [{**r, "source_path": str(path), "loaded_at": now} for r in grant_rows(grants)]
    warehouse.store().replace("consent_grants", rows)
    revoked = sorted(g.consent_id for g in grants.values() if g.revoked_at is not None)
    return dg.MaterializeResult(metadata={
        "grants": len(rows), "dagster/row_count": len(rows), "registry": get_home(warehouse.home).relative(path),
        "registry_missing": not path.exists(),
        "by_tenant": dg.MetadataValue.json(dict(Counter(g.tenant_id for g in grants.values()))),
        "revoked": dg.MetadataValue.json(revoked),
        "without_train_scope": sum("train" not in g.scopes for g in grants.values())})


class TrainingViewsConfig(dg.Config):
    now: Optional[str] = None        # ISO-8601 evaluation time (replays, tests); default: now
    tenants: list[str] = []          # policy tenants to build; empty = every tenant seen


_VIEW_DEPS = ["consent_grants", "split_assignments", "holdout_manifest", "trajectories"]


@dg.multi_asset(name="training_views", pool="warehouse", specs=[
    dg.AssetSpec(
        "training_set", group_name="consent", owners=OWNERS["consent"], metadata=table_metadata("training_set"),
        kinds={"duckdb"}, deps=_VIEW_DEPS,
        description="Per policy tenant, the trajectories it may train on (view v_training_set joins the "
                    "trajectory): consented, unexpired, unrevoked, train split only."),
    dg.AssetSpec(
        "consent_audit", group_name="consent", owners=OWNERS["consent"], metadata=table_metadata("consent_audit"),
        kinds={"duckdb"}, deps=_VIEW_DEPS,
        description="Every (trajectory, policy tenant) excluded from training, with its reason "
                    "(v_consent_audit_summary).")])
def training_views(context: dg.AssetExecutionContext, config: TrainingViewsConfig, warehouse: WarehouseResource):
    from collections import Counter

    from ratchet.clock import parse_now
    from ratchet.governance.consent import grants_from_rows
    from ratchet.governance.training_views import (
        GRANTS_SQL,
        SPLIT_OF_SQL,
        TRAJECTORIES_SQL,
        training_rows,
    )

    now = parse_now(config.now)
    store = warehouse.store()
    grants = grants_from_rows(store.read(GRANTS_SQL))
    trajs = store.read(TRAJECTORIES_SQL)
    split_of = {r["source_id"]: r for r in store.read(SPLIT_OF_SQL)}
    train, audit = training_rows(trajs, grants, split_of, now, tenants=config.tenants or None)
    if not grants:
        for a in audit:
            a["detail"] += " (the consent registry is empty or missing)"
    for r in (*train, *audit):
        r["dagster_run_id"] = context.run_id
    store.replace_all({"training_set": train, "consent_audit": audit})
    per = Counter(r["tenant_id"] for r in train)
    reasons = Counter(a["reason"] for a in audit)
    tenants = sorted(set(per) | {a["target_tenant"] for a in audit})
    md = md_table(["policy tenant", "training rows", "excluded"],
                  [(t, per[t], sum(1 for a in audit if a["target_tenant"] == t)) for t in tenants])
    context.log.info(f"training views at {now.isoformat()}: {dict(per)}; excluded {dict(reasons)}")
    yield dg.MaterializeResult(asset_key="training_set", metadata={
        "evaluated_at": now.isoformat(), "trajectories": len(trajs), "training_rows": len(train),
        "dagster/row_count": len(train), "by_tenant": dg.MetadataValue.md(md)})
    yield dg.MaterializeResult(asset_key="consent_audit", metadata={
        "evaluated_at": now.isoformat(), "excluded": len(audit), "dagster/row_count": len(audit),
        "excluded_by_reason": dg.MetadataValue.json(dict(reasons))})


@dg.asset_check(asset="training_set", blocking=True,
             description="Re-verifies training_set in SQL, independently of the gate that built it: no row of another "
                         "tenant without a sharing grant, none under a missing / revoked / expired / non-train grant, "
                         "none outside the train split.")
def training_set_clean(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from ratchet.governance.training_views import TRAINING_VIOLATIONS_SQL

    store = warehouse.store()
    bad = store.read(TRAINING_VIOLATIONS_SQL)
    return dg.AssetCheckResult(passed=not bad, severity=dg.AssetCheckSeverity.ERROR, metadata={
        "training_rows": store.count("training_set"), "violations": sum(b["n"] for b in bad),
        "by_violation": dg.MetadataValue.json({b["violation"]: b["n"] for b in bad}),
        "examples": dg.MetadataValue.json([{k: b[k] for k in ("violation", "example_tenant", "example_record")} for b in bad])})


class CheckpointFlagsConfig(dg.Config):
    now: Optional[str] = None        # ISO-8601; default: now


@dg.asset(group_name="consent", owners=OWNERS["consent"], metadata=table_metadata("checkpoint_flags"),
          deps=["consent_grants", "trajectories"], kinds={"duckdb"}, pool="warehouse",
          description="Flags every registered checkpoint (`checkpoints` table) trained on data under a revoked grant.")
def checkpoint_flags(context: dg.AssetExecutionContext, config: CheckpointFlagsConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    from ratchet.clock import parse_now
    from ratchet.governance.checkpoints import CHECKPOINT_COUNTS_SQL, flag_checkpoints

    store = warehouse.store()
    with store.connect() as con:
        flags, new = flag_checkpoints(con, parse_now(config.now), context.run_id)
    counts = store.read(CHECKPOINT_COUNTS_SQL)[0]
    if new:
        context.log.warning(f"flagged checkpoints trained on revoked grants: {new}")
    return dg.MaterializeResult(metadata={
        "checkpoints": counts["total"], "flagged": counts["flagged"], "dagster/row_count": len(flags),
        "newly_flagged": dg.MetadataValue.json(new),
        "flags": dg.MetadataValue.json([{k: f[k] for k in ("checkpoint_id", "consent_id", "n_records")} for f in flags][:50])})


defs = dg.Definitions(assets=[consent_grants, training_views, checkpoint_flags], asset_checks=[training_set_clean])
