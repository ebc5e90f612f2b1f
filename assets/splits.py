"""Stage 2: dedup clusters, group-aware splits, the contamination gate and the locked holdout.

    tasks, trajectories -> dedup_clusters (+ dedup_edges) -> split_assignments --[contamination]--> holdout_manifest
                                                                               \\-> training_set (assets/consent.py)

The contamination check is blocking: when it fails, nothing downstream of split_assignments runs
(no holdout lock, no training view, no training). Logic lives in ratchet.governance.
"""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from contextlib import contextmanager
from typing import Optional

import dagster as dg

from assets import OWNERS, table_metadata
from ratchet.markdown import md_table
from resources import WarehouseResource


def _manifest_path(warehouse: WarehouseResource, configured: Optional[str]):
    from pathlib import Path

    from ratchet.home import get_home

    return Path(configured) if configured else get_home(warehouse.home).root / "holdout_manifest.json"


@contextmanager
def _items_parquet(store, sql: str):
    """The query's rows in a temporary Parquet file (under RATCHET_DEDUP_TMP if set), for
    build_clusters and the contamination check to stream back in batches: text is never in
    memory whole, and the warehouse lock is held only for the copy."""
    import os
    import tempfile

    base = os.environ.get("RATCHET_DEDUP_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ratchet-dedup-", dir=base) as tmp:
        path = os.path.join(tmp, "items.parquet")
        with store.connect() as con:
            con.execute(f"COPY ({sql}) TO '{path.replace(chr(39), chr(39) * 2)}' (FORMAT parquet, ROW_GROUP_SIZE 16384)")
        yield path


class DedupConfig(dg.Config):
    threshold: float = 0.8           # MinHash Jaccard of prompt / issue text that joins a cluster
    chart: bool = True               # PNG histogram of cluster sizes under RATCHET_HOME/artifacts


@dg.multi_asset(name="dedup_clusters", pool="warehouse", specs=[
    dg.AssetSpec(
        "dedup_clusters", group_name="governance", owners=OWNERS["governance"], metadata=table_metadata("dedup_clusters"),
        kinds={"duckdb"}, deps=["tasks", "trajectories"],
        description="Near-duplicate clusters over tasks and trajectories (MinHash text, AST code, same "
                    "repo / issue / task): one row per item with its cluster."),
    dg.AssetSpec(
        "dedup_edges", group_name="governance", owners=OWNERS["governance"], metadata=table_metadata("dedup_edges"),
        kinds={"duckdb"}, deps=["tasks", "trajectories"],
        description="Why each pair of items was joined (reason, score): the evidence behind dedup_clusters.")])
def dedup_clusters(context: dg.AssetExecutionContext, config: DedupConfig, warehouse: WarehouseResource):
    import time

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ratchet.clock import now_utc
    from ratchet.governance.clusters import build_clusters
    from ratchet.governance.items import (
        CLUSTER_KEYS,
        ITEMS_SQL,
        cluster_rows,
        edge_rows,
        size_histogram,
    )
    from ratchet.home import get_home
    from ratchet.plots import cluster_chart, markdown_image

    if not 0.0 < config.threshold <= 0.98:
        raise ValueError(f"dedup threshold {config.threshold} must be in (0, 0.98]: MinHash LSH over 128 "
                         f"permutations cannot form two bands above 0.98")
    store = warehouse.store()
    t0 = time.monotonic()
    with _items_parquet(store, ITEMS_SQL) as path:
        clusters, edges = build_clusters(path, id_col="id", text_col="text", code_cols=("code",),
                                         key_cols=CLUSTER_KEYS, threshold=config.threshold)
        items = pq.read_table(path, columns=["id", "kind"])
    seconds = time.monotonic() - t0
    now = now_utc()
    rows = cluster_rows(clusters, items, now, context.run_id)
    del clusters, items
    edges = edge_rows(edges, now)
    store.replace_all({"dedup_clusters": rows, "dedup_edges": edges})
    n_items = rows.num_rows
    kinds = {r["values"]: r["counts"] for r in pc.value_counts(rows.column("kind")).to_pylist()}
    # one row per cluster (its size, and whether it holds both tasks and trajectories)
    per = rows.group_by("cluster_id").aggregate([("cluster_size", "max"), ("cluster_tasks", "max"),
                                                 ("cluster_trajectories", "max")])
    sizes = per.column("cluster_size_max").to_numpy()
    hist = size_histogram(sizes.tolist())
    mixed = pc.sum(pc.and_(pc.greater(per.column("cluster_tasks_max"), 0),
                           pc.greater(per.column("cluster_trajectories_max"), 0))).as_py() or 0
    meta = {
        "items": n_items, "dagster/row_count": n_items, "tasks": kinds.get("task", 0),
        "trajectories": kinds.get("trajectory", 0), "clusters": per.num_rows,
        "largest_cluster": int(sizes.max()) if len(sizes) else 0, "clusters_with_tasks_and_trajectories": mixed,
        "size_histogram": dg.MetadataValue.md(md_table(["size", "clusters"], hist.items())),
        "threshold": config.threshold, "seconds": round(seconds, 2)}
    if config.chart and n_items:
        home = get_home(warehouse.home)
        path = cluster_chart(hist, f"{per.num_rows} clusters over {n_items} items",
                             home.artifacts / f"dedup-clusters-{context.run_id[:8]}.png")
        meta["chart"] = dg.MetadataValue.md(markdown_image(path, "cluster sizes"))
        meta["chart_file"] = home.relative(path)
    context.log.info(f"dedup: {n_items} items -> {per.num_rows} clusters in {seconds:.1f} s")
    yield dg.MaterializeResult(asset_key="dedup_clusters", metadata=meta)
    yield dg.MaterializeResult(asset_key="dedup_edges", metadata={
        "edges": edges.num_rows, "dagster/row_count": edges.num_rows,
        "edges_by_reason": dg.MetadataValue.json(
            {r["values"]: r["counts"] for r in pc.value_counts(edges.column("reason")).to_pylist()})})


class SplitConfig(dg.Config):
    train: int = 600                 # reference targets in tasks; scaled proportionally when fewer
    val: int = 160
    holdout: int = 400
    seed: int = 0
    manifest_path: Optional[str] = None   # default RATCHET_HOME/holdout_manifest.json


@dg.asset(group_name="governance", owners=OWNERS["governance"], metadata=table_metadata("split_assignments"),
          deps=["dedup_clusters"], kinds={"duckdb"}, pool="warehouse",
          description="train / val / holdout per task (whole clusters, stratified by slice) and per trajectory "
                      "(its cluster's split). A locked holdout never moves; a tampered manifest fails the run.")
def split_assignments(context: dg.AssetExecutionContext, config: SplitConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    import pyarrow as pa
    import pyarrow.compute as pc

    from ratchet.clock import now_utc
    from ratchet.governance.holdout import check_holdout_unmoved, holdout_state
    from ratchet.governance.items import PREVIOUS_SPLITS_SQL, SPLIT_ITEMS_SQL
    from ratchet.governance.splits import governed_split_table, split_summary_md
    from ratchet.tables import TS

    store = warehouse.store()
    with store.connect() as con:
        state = holdout_state(con, _manifest_path(warehouse, config.manifest_path))  # ManifestError: tampered
    # columns throughout: one row per trajectory (millions), never a Python dict each
    items = store.arrow(SPLIT_ITEMS_SQL)
    previous = store.arrow(PREVIOUS_SPLITS_SQL)
    targets = {"train": config.train, "val": config.val, "holdout": config.holdout}
    manifest = state.manifest if state.locked else None
    rows = governed_split_table(items, targets, seed=config.seed, manifest=manifest, previous=previous)
    del items, previous
    tasks = rows.filter(pc.equal(rows.column("kind"), "task"))
    held = set(tasks.filter(pc.equal(tasks.column("split"), "holdout")).column("source_id").to_pylist())
    missing = []
    if manifest is not None:
        missing = check_holdout_unmoved(manifest, held, set(tasks.column("source_id").to_pylist()), what="this split")
    n = rows.num_rows
    rows = rows.append_column(pa.field("assigned_at", TS), pa.repeat(pa.scalar(now_utc(), TS), n)) \
        .append_column("dagster_run_id", pa.repeat(pa.scalar(context.run_id, pa.string()), n))
    store.replace("split_assignments", rows)
    sizes = rows.group_by(["kind", "split"]).aggregate([([], "count_all")]).to_pylist()
    if missing:
        context.log.warning(f"{len(missing)} locked holdout tasks are not in the tasks table (e.g. {missing[:3]})")
    return dg.MaterializeResult(metadata={
        "dagster/row_count": n,
        "split_sizes": dg.MetadataValue.json({f"{r['kind']}/{r['split']}": r["count_all"]
                                              for r in sorted(sizes, key=lambda r: (r["kind"], r["split"]))}),
        "by_slice": dg.MetadataValue.md(split_summary_md(rows)),
        "holdout_tasks": len(held), "targets": dg.MetadataValue.json(targets),
        "manifest_sha256": manifest.sha256 if manifest else "not locked yet (locked by holdout_manifest)",
        "manifest_version": manifest.version if manifest else 0,
        "holdout_tasks_missing_from_tasks": len(missing),
        "excluded_contaminated": pc.sum(pc.equal(rows.column("split"), "excluded_contaminated")).as_py() or 0})


class ContaminationConfig(dg.Config):
    threshold: float = 0.8           # MinHash Jaccard counted as overlap across splits
    max_examples: int = 5


@dg.asset_check(asset="split_assignments", blocking=True, pool="warehouse",
             description="Recomputes every overlap between splits from the raw items (exact id / same task, repo, "
                         "issue, MinHash >= threshold, AST collision); passes only at 0.0%. Blocks training.")
def contamination(context: dg.AssetCheckExecutionContext, config: ContaminationConfig,
                  warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from ratchet.clock import now_utc
    from ratchet.governance.contamination import contamination_report, report_tables
    from ratchet.governance.items import (
        CONTAMINATION_KEYS,
        ITEMS_SQL,
        PREVIOUS_SPLITS_SQL,
    )

    store = warehouse.store()
    with _items_parquet(store, ITEMS_SQL) as path:
        rep = contamination_report(store.arrow(PREVIOUS_SPLITS_SQL), path, id_col="id", text_col="text",
                                   code_cols=("code",), key_cols=CONTAMINATION_KEYS, threshold=config.threshold,
                                   max_examples=config.max_examples)
    store.append(report_tables(rep, now_utc(), context.run.run_id))
    return dg.AssetCheckResult(passed=bool(rep["passed"]), severity=dg.AssetCheckSeverity.ERROR, metadata={
        "overlap_pct": round(100 * rep["overlap_fraction"], 4), "items_in_splits": rep["n_items"],
        "overlapping_items": rep["n_overlapping_items"], "threshold": rep["threshold"],
        "pairs_by_kind": dg.MetadataValue.json(rep["counts"]),
        "examples": dg.MetadataValue.json({k: v for k, v in rep["examples"].items() if v})})


class HoldoutConfig(dg.Config):
    manifest_path: Optional[str] = None   # default RATCHET_HOME/holdout_manifest.json


@dg.asset(group_name="governance", owners=OWNERS["governance"], metadata=table_metadata("holdout_manifest"),
          deps=["split_assignments"], kinds={"duckdb", "json"}, pool="warehouse",
          description="The locked holdout: manifest JSON (sorted task ids + sha256) at RATCHET_HOME, the "
                      "`holdout_manifest` table and an audit log. Locked on the first clean run, verified after.")
def holdout_manifest(context: dg.AssetExecutionContext, config: HoldoutConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    from ratchet.governance.holdout import HOLDOUT_TASKS_SQL, TASK_IDS_SQL, lock_or_verify
    from ratchet.home import get_home

    path = _manifest_path(warehouse, config.manifest_path)
    store = warehouse.store()
    held = [r["source_id"] for r in store.read(HOLDOUT_TASKS_SQL)]
    present = {r["task_id"] for r in store.read(TASK_IDS_SQL)}
    with store.connect() as con:
        event, m, notes = lock_or_verify(con, path, held, present, actor=f"dagster:{context.run_id}",
                                         run_id=context.run_id)
    for note in notes:
        context.log.warning(note)
    context.log.info(f"holdout {event}: version {m.version}, {len(m.task_ids)} tasks, sha256 {m.sha256}")
    return dg.MaterializeResult(metadata={
        "event": event, "manifest_sha256": m.sha256, "version": m.version, "tasks": len(m.task_ids),
        "dagster/row_count": len(m.task_ids), "locked_by": m.locked_by, "created_at": m.created_at,
        "path": get_home(warehouse.home).relative(path), "tasks_not_in_table": len(set(m.task_ids) - present)})


defs = dg.Definitions(assets=[dedup_clusters, split_assignments, holdout_manifest], asset_checks=[contamination])
