"""Tasks and trajectories as one table of governance items: what dedup clusters, what the splits
assign and what the contamination gate re-checks. Item ids are namespaced ("task:<task_id>",
"traj:<record_id>") so a task and a trajectory never collide."""
from __future__ import annotations

from datetime import datetime
from typing import Iterable

import pyarrow as pa

from ratchet.tables import TS

from .tables import TASK_PREFIX, TRAJ_PREFIX

ITEMS_SQL = f"""
    SELECT '{TASK_PREFIX}' || task_id AS id, 'task' AS kind, task_id AS source_id, issue_text AS text,
           solution AS code, repo, issue_id, task_id AS task_key, slice, NULL::VARCHAR AS tenant_id
    FROM tasks
    UNION ALL
    SELECT '{TRAJ_PREFIX}' || record_id, 'trajectory', record_id, prompt_text, patch, repo, issue_id,
           task_id, tenant_id, tenant_id
    FROM trajectories
    ORDER BY id"""
# Cluster edges: shared repo / issue, and a trajectory's task_id naming a task ("same_task").
CLUSTER_KEYS = {"repo": "same_repo", "issue_id": "same_issue", "task_key": "same_task"}
# The contamination gate's key kinds: a trajectory of task X in another split than X is the
# same task in two splits, reported as exact_id.
CONTAMINATION_KEYS = {"repo": "repo", "issue_id": "issue", "task_key": "exact_id"}


def governance_items(con) -> pa.Table:
    """Tasks and trajectories as one table of dedup items (id, kind, source_id, text, code, repo,
    issue_id, task_key, slice, tenant_id); trajectories are stratified by tenant."""
    return con.sql(ITEMS_SQL).to_arrow_table()


# The inputs of split_assignments: each clustered item with its stratification slice (a task's
# operator family, a trajectory's tenant).
SPLIT_ITEMS_SQL = """
    SELECT c.id, c.kind, c.cluster_id, CASE WHEN c.kind = 'task' THEN t.slice ELSE r.tenant_id END AS slice,
           r.tenant_id
    FROM dedup_clusters c
    LEFT JOIN tasks t ON c.kind = 'task' AND t.task_id = c.source_id
    LEFT JOIN trajectories r ON c.kind = 'trajectory' AND r.record_id = c.source_id
    ORDER BY c.id"""
PREVIOUS_SPLITS_SQL = "SELECT id, split FROM split_assignments"


def cluster_rows(clusters: pa.Table, items: pa.Table, computed_at: datetime, run_id: str | None) -> pa.Table:
    """`dedup_clusters` rows as columns: build_clusters' (id, cluster_id, cluster_size) with each
    item's kind and source id and its cluster's task and trajectory counts. Columnar because the
    table has one row per trajectory (a dict per row was ~1 KB each: ~10 GB at 10M)."""
    import pyarrow.compute as pc

    kind = pc.take(items.column("kind"), pc.index_in(clusters.column("id"), value_set=items.column("id")))
    if kind.null_count:
        raise ValueError("build_clusters returned an id that is not among the items")
    cid = clusters.column("cluster_id")
    per = pa.table({"cluster_id": cid, "task": pc.cast(pc.equal(kind, "task"), pa.int64()),
                    "trajectory": pc.cast(pc.equal(kind, "trajectory"), pa.int64())}) \
        .group_by("cluster_id").aggregate([("task", "sum"), ("trajectory", "sum")])
    at = pc.index_in(cid, value_set=per.column("cluster_id"))
    ids = clusters.column("id")
    n = clusters.num_rows
    return pa.table({
        "id": ids, "cluster_id": cid, "cluster_size": clusters.column("cluster_size"), "kind": kind,
        # ids are "<prefix>:<source id>": what follows the first colon
        "source_id": pc.replace_substring_regex(ids, pattern="^[^:]*:", replacement="", max_replacements=1),
        "cluster_tasks": pc.take(per.column("task_sum"), at), "cluster_trajectories": pc.take(per.column("trajectory_sum"), at),
        "computed_at": pa.repeat(pa.scalar(computed_at, TS), n),
        "dagster_run_id": pa.repeat(pa.scalar(run_id, pa.string()), n)})


def size_histogram(sizes: Iterable[int]) -> dict[str, int]:
    """Clusters per size bucket (1, 2, 3-5, 6-10, 11-50, 51-200, >200)."""
    edges = [(1, 1), (2, 2), (3, 5), (6, 10), (11, 50), (51, 200)]
    out = {(f"{a}" if a == b else f"{a}-{b}"): 0 for a, b in edges}
    out[">200"] = 0
    for s in sizes:
        for a, b in edges:
            if a <= s <= b:
                out[f"{a}" if a == b else f"{a}-{b}"] += 1
                break
        else:
            out[">200"] += 1
    return out


def edge_rows(edges: pa.Table, computed_at: datetime) -> pa.Table:
    """`dedup_edges` rows: build_clusters' edges stamped with the run's time."""
    return edges.append_column(pa.field("computed_at", TS), pa.repeat(pa.scalar(computed_at, TS), edges.num_rows))
