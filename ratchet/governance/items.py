"""Tasks and trajectories as one table of governance items: what dedup clusters, what the splits
assign and what the contamination gate re-checks. Item ids are namespaced ("task:<task_id>",
"traj:<record_id>") so a task and a trajectory never collide."""
from __future__ import annotations

from collections import Counter, defaultdict
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


def cluster_rows(clusters: pa.Table, items: pa.Table, computed_at: datetime, run_id: str | None) -> list[dict]:
    kind = dict(zip(items.column("id").to_pylist(), items.column("kind").to_pylist()))
    rows = clusters.to_pylist()
    per = defaultdict(Counter)
    for r in rows:
        per[r["cluster_id"]][kind[r["id"]]] += 1
    return [{**r, "kind": kind[r["id"]], "source_id": r["id"].split(":", 1)[1],
             "cluster_tasks": per[r["cluster_id"]]["task"], "cluster_trajectories": per[r["cluster_id"]]["trajectory"],
             "computed_at": computed_at, "dagster_run_id": run_id} for r in rows]


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
    return edges.append_column(pa.field("computed_at", TS), pa.array([computed_at] * edges.num_rows, TS))
