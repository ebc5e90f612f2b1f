"""`dedup_clusters` rows are built as columns; each row carries its item's kind and source id and
its cluster's task and trajectory counts, as the one-dict-per-row code gave them."""
from collections import Counter, defaultdict
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from ratchet.governance.items import cluster_rows

pytestmark = pytest.mark.governance


def _oracle(clusters, items, at, run_id):
    kind = dict(zip(items.column("id").to_pylist(), items.column("kind").to_pylist()))
    rows = clusters.to_pylist()
    per = defaultdict(Counter)
    for r in rows:
        per[r["cluster_id"]][kind[r["id"]]] += 1
    return [{**r, "kind": kind[r["id"]], "source_id": r["id"].split(":", 1)[1],
             "cluster_tasks": per[r["cluster_id"]]["task"], "cluster_trajectories": per[r["cluster_id"]]["trajectory"],
             "computed_at": at, "dagster_run_id": run_id} for r in rows]


def test_columns_match_the_row_by_row_rule():
    ids = ["task:t1", "traj:r1", "traj:r:2", "task:t2", "traj:r3", "task:t:3"]
    items = pa.table({"id": ids[::-1], "kind": ["task" if i.startswith("task:") else "trajectory" for i in ids[::-1]]})
    clusters = pa.table({"id": ids, "cluster_id": ["c1", "c1", "c1", "c2", "c3", "c3"],
                         "cluster_size": pa.array([3, 3, 3, 1, 2, 2], pa.int64())})
    at = datetime(2026, 1, 2, tzinfo=timezone.utc)
    got = cluster_rows(clusters, items, at, "run-1")
    assert got.to_pylist() == _oracle(clusters, items, at, "run-1")
    assert got.column("source_id").to_pylist() == ["t1", "r1", "r:2", "t2", "r3", "t:3"]


def test_no_items_and_an_unknown_id():
    empty = pa.table({"id": pa.array([], pa.string()), "cluster_id": pa.array([], pa.string()),
                      "cluster_size": pa.array([], pa.int64())})
    items = pa.table({"id": pa.array([], pa.string()), "kind": pa.array([], pa.string())})
    assert cluster_rows(empty, items, datetime.now(timezone.utc), None).num_rows == 0
    one = pa.table({"id": ["traj:x"], "cluster_id": ["c"], "cluster_size": pa.array([1], pa.int64())})
    with pytest.raises(ValueError, match="not among the items"):
        cluster_rows(one, items, datetime.now(timezone.utc), None)
