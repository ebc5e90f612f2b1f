"""Stage 2: dedup clusters, group-aware splits, the contamination gate and the locked holdout.

    task_suite, trajectories -> dedup_clusters -> split_assignments --[contamination]--> holdout_manifest
                                                                   \\-> training_views (assets/consent.py)

The contamination check is blocking: when it fails, nothing downstream of split_assignments runs
(no holdout lock, no training view, no training). Logic lives in ratchet.governance.
"""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from typing import Optional

from dagster import (AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetExecutionContext,
                     Config, MaterializeResult, MetadataValue, asset, asset_check)

from ratchet.markdown import md_table
from resources import WarehouseResource


def _manifest_path(warehouse: WarehouseResource, configured: Optional[str]):
    from pathlib import Path

    from ratchet.home import get_home

    return Path(configured) if configured else get_home(warehouse.home).root / "holdout_manifest.json"


class DedupConfig(Config):
    threshold: float = 0.8           # MinHash Jaccard of prompt / issue text that joins a cluster
    chart: bool = True               # PNG histogram of cluster sizes under RATCHET_HOME/artifacts


@asset(group_name="governance", deps=["task_suite", "trajectories"], kinds={"duckdb"}, pool="warehouse",
       description="Near-duplicate clusters over tasks and trajectories (MinHash text, AST code, same "
                   "repo / issue / task): `dedup_clusters` + `dedup_edges` (why each pair was joined).")
def dedup_clusters(context: AssetExecutionContext, config: DedupConfig, warehouse: WarehouseResource) -> MaterializeResult:
    import time
    from collections import Counter
    from datetime import datetime, timezone

    import pyarrow as pa

    from ratchet.governance import store
    from ratchet.governance.clusters import build_clusters
    from ratchet.home import get_home

    if not 0.0 < config.threshold <= 0.98:
        raise ValueError(f"dedup threshold {config.threshold} must be in (0, 0.98]: MinHash LSH over 128 "
                         f"permutations cannot form two bands above 0.98")
    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        items = store.governance_items(con)
    t0 = time.monotonic()
    clusters, edges = build_clusters(items, id_col="id", text_col="text", code_cols=("code",),
                                     key_cols=store.CLUSTER_KEYS, threshold=config.threshold)
    seconds = time.monotonic() - t0
    now = datetime.now(timezone.utc)
    rows = store.cluster_rows(clusters, items, now, context.run_id)
    edges = edges.append_column(pa.field("computed_at", store.TS), pa.array([now] * edges.num_rows, store.TS))
    with wh.connect() as con:
        store.replace(con, "dedup_clusters", rows)
        store.replace(con, "dedup_edges", edges)
    sizes = Counter(r["cluster_id"] for r in rows)
    hist = store.size_histogram(sizes.values())
    mixed = len({r["cluster_id"] for r in rows if r["cluster_tasks"] and r["cluster_trajectories"]})
    meta = {
        "items": len(rows), "tasks": sum(r["kind"] == "task" for r in rows),
        "trajectories": sum(r["kind"] == "trajectory" for r in rows), "clusters": len(sizes),
        "largest_cluster": max(sizes.values(), default=0), "clusters_with_tasks_and_trajectories": mixed,
        "size_histogram": MetadataValue.md(md_table(["size", "clusters"], hist.items())),
        "edges_by_reason": MetadataValue.json(dict(Counter(edges.column("reason").to_pylist()))),
        "threshold": config.threshold, "seconds": round(seconds, 2)}
    if config.chart and rows:
        path = get_home(warehouse.home).artifacts / f"dedup-clusters-{context.run_id[:8]}.png"
        meta["chart"] = MetadataValue.path(str(store.cluster_chart(hist, f"{len(sizes)} clusters over {len(rows)} items", path)))
    context.log.info(f"dedup: {len(rows)} items -> {len(sizes)} clusters in {seconds:.1f} s")
    return MaterializeResult(metadata=meta)


class SplitConfig(Config):
    train: int = 600                 # reference targets in tasks; scaled proportionally when fewer
    val: int = 160
    holdout: int = 400
    seed: int = 0
    manifest_path: Optional[str] = None   # default RATCHET_HOME/holdout_manifest.json


@asset(group_name="governance", deps=["dedup_clusters"], kinds={"duckdb"}, pool="warehouse",
       description="train / val / holdout per task (whole clusters, stratified by slice) and per trajectory "
                   "(its cluster's split). A locked holdout never moves; a tampered manifest fails the run.")
def split_assignments(context: AssetExecutionContext, config: SplitConfig, warehouse: WarehouseResource) -> MaterializeResult:
    from collections import Counter
    from datetime import datetime, timezone

    from ratchet.governance import store
    from ratchet.governance.manifest import ManifestError

    path = _manifest_path(warehouse, config.manifest_path)
    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        state = store.holdout_state(con, path)      # ManifestError: tampered / missing / disagrees
        items = store.fetch(con, """
            SELECT c.id, c.kind, c.cluster_id, CASE WHEN c.kind = 'task' THEN t.slice ELSE r.tenant_id END AS slice,
                   r.tenant_id
            FROM dedup_clusters c
            LEFT JOIN tasks t ON c.kind = 'task' AND t.task_id = c.source_id
            LEFT JOIN trajectories r ON c.kind = 'trajectory' AND r.record_id = c.source_id
            ORDER BY c.id""")
        previous = dict(con.execute("SELECT id, split FROM split_assignments").fetchall())
    targets = {"train": config.train, "val": config.val, "holdout": config.holdout}
    manifest = state.manifest if state.locked else None
    rows = store.governed_splits(items, targets, seed=config.seed, manifest=manifest, previous=previous)
    held = {r["source_id"] for r in rows if r["kind"] == "task" and r["split"] == "holdout"}
    missing = []
    if manifest is not None:
        present = {r["source_id"] for r in rows if r["kind"] == "task"}
        locked = set(manifest.task_ids)
        moved = (locked & present) - held
        if moved or held - locked:
            raise ManifestError(f"split would move the locked holdout: {len(moved)} manifest tasks left it, "
                                f"{len(held - locked)} tasks entered it (e.g. {sorted(moved or held - locked)[:3]})")
        missing = sorted(locked - present)
    now = datetime.now(timezone.utc)
    for r in rows:
        r["assigned_at"], r["dagster_run_id"] = now, context.run_id
    with wh.connect() as con:
        store.replace(con, "split_assignments", rows)
    sizes = Counter((r["kind"], r["split"]) for r in rows)
    if missing:
        context.log.warning(f"{len(missing)} locked holdout tasks are not in the tasks table (e.g. {missing[:3]})")
    return MaterializeResult(metadata={
        "split_sizes": MetadataValue.json({f"{k}/{s}": n for (k, s), n in sorted(sizes.items())}),
        "by_slice": MetadataValue.md(store.split_summary_md(rows)),
        "holdout_tasks": len(held), "targets": MetadataValue.json(targets),
        "manifest_sha256": manifest.sha256 if manifest else "not locked yet (locked by holdout_manifest)",
        "manifest_version": manifest.version if manifest else 0,
        "holdout_tasks_missing_from_tasks": len(missing),
        "excluded_contaminated": sum(r["split"] == "excluded_contaminated" for r in rows)})


class ContaminationConfig(Config):
    threshold: float = 0.8           # MinHash Jaccard counted as overlap across splits
    max_examples: int = 5


@asset_check(asset="split_assignments", blocking=True, pool="warehouse",
             description="Recomputes every overlap between splits from the raw items (exact id / same task, repo, "
                         "issue, MinHash >= threshold, AST collision); passes only at 0.0%. Blocks training.")
def contamination(context: AssetCheckExecutionContext, config: ContaminationConfig,
                  warehouse: WarehouseResource) -> AssetCheckResult:
    from datetime import datetime, timezone

    from ratchet.governance import store
    from ratchet.governance.contamination import contamination_report, report_rows

    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        items = store.governance_items(con)
        assignments = store.fetch(con, "SELECT id, split FROM split_assignments")
    rep = contamination_report(assignments, items, id_col="id", text_col="text", code_cols=("code",),
                               key_cols=store.CONTAMINATION_KEYS, threshold=config.threshold,
                               max_examples=config.max_examples)
    now, run_id = datetime.now(timezone.utc), context.run.run_id
    with wh.connect() as con, store.transaction(con):
        store.insert(con, "contamination_report", [{
            "checked_at": now, "dagster_run_id": run_id, "passed": rep["passed"],
            "overlap_fraction": rep["overlap_fraction"], "n_items": rep["n_items"],
            "n_overlapping_items": rep["n_overlapping_items"], "threshold": rep["threshold"],
            "counts": rep["counts"], "examples": rep["examples"]}])
        store.insert(con, "contamination_pairs", [{**p, "checked_at": now, "dagster_run_id": run_id}
                                                  for p in report_rows(rep)])
    return AssetCheckResult(passed=bool(rep["passed"]), severity=AssetCheckSeverity.ERROR, metadata={
        "overlap_pct": round(100 * rep["overlap_fraction"], 4), "items_in_splits": rep["n_items"],
        "overlapping_items": rep["n_overlapping_items"], "threshold": rep["threshold"],
        "pairs_by_kind": MetadataValue.json(rep["counts"]),
        "examples": MetadataValue.json({k: v for k, v in rep["examples"].items() if v})})


class HoldoutConfig(Config):
    manifest_path: Optional[str] = None   # default RATCHET_HOME/holdout_manifest.json


@asset(group_name="governance", deps=["split_assignments"], kinds={"duckdb", "json"}, pool="warehouse",
       description="The locked holdout: manifest JSON (sorted task ids + sha256) at RATCHET_HOME, the "
                   "`holdout_manifest` table and an audit log. Locked on the first clean run, verified after.")
def holdout_manifest(context: AssetExecutionContext, config: HoldoutConfig, warehouse: WarehouseResource) -> MaterializeResult:
    from ratchet.governance import store
    from ratchet.governance.manifest import ManifestError

    path = _manifest_path(warehouse, config.manifest_path)
    actor = f"dagster:{context.run_id}"
    wh = warehouse.get()
    with wh.connect() as con:
        store.ensure_schema(con)
        state = store.holdout_state(con, path)
        held = sorted(r[0] for r in con.execute(
            "SELECT source_id FROM split_assignments WHERE kind = 'task' AND split = 'holdout'").fetchall())
        present = {r[0] for r in con.execute("SELECT task_id FROM tasks").fetchall()}
        if state.needs_adoption:
            context.log.warning(f"adopting holdout manifest {path}: the warehouse had no record of it")
            store.adopt_holdout(con, state, actor=actor, run_id=context.run_id)
        if state.locked:
            m = state.manifest
            locked = set(m.task_ids)
            if set(held) - locked or (locked & present) - set(held):
                raise ManifestError(f"split_assignments disagree with the locked holdout {m.sha256[:12]}...: "
                                    f"{len(set(held) - locked)} extra, {len((locked & present) - set(held))} missing")
            store.log_event(con, "verify", m, path, actor=actor, run_id=context.run_id)
            event = "verified"
        else:
            if not held:
                raise ManifestError("refusing to lock an empty holdout: split_assignments put no task in holdout "
                                    "(too few tasks or clusters for the targets?)")
            m = store.lock_holdout(con, path, held, locked_by=actor, previous=state.manifest, run_id=context.run_id)
            event = "locked"
    context.log.info(f"holdout {event}: version {m.version}, {len(m.task_ids)} tasks, sha256 {m.sha256}")
    return MaterializeResult(metadata={
        "event": event, "manifest_sha256": m.sha256, "version": m.version, "tasks": len(m.task_ids),
        "locked_by": m.locked_by, "created_at": m.created_at, "path": MetadataValue.path(str(path)),
        "tasks_not_in_table": len(set(m.task_ids) - present)})
