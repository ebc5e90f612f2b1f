"""The columnar `governed_split_table` (what the split_assignments asset runs: a trajectory is never a
Python row) against the row-by-row `governed_splits` it replaced, kept here as an oracle: same rows,
order, splits and reasons, with manifests, `previous` as a mapping or a table, orphan trajectory
clusters and near-copies of holdout tasks."""
from __future__ import annotations

import random
from collections import defaultdict

import pyarrow as pa
import pytest

from ratchet.governance.manifest import create_manifest
from ratchet.governance.splits import (
    EXCLUDED,
    _source,
    assign_splits,
    governed_split_table,
    governed_splits,
    split_summary_md,
)

pytestmark = pytest.mark.governance


def _reference(items, targets, seed=0, manifest=None, previous=None):
    items = list(items)
    previous = previous or {}
    tasks = [{"id": i["id"], "cluster_id": i["cluster_id"], "slice": i["slice"]} for i in items if i["kind"] == "task"]
    out: dict[str, tuple[str, str]] = {}
    if tasks:
        bare = {i["id"]: _source(i["id"]) for i in tasks}
        t = assign_splits([{**i, "id": bare[i["id"]]} for i in tasks], targets=targets, seed=seed, manifest=manifest,
                          previous={bare[i["id"]]: previous[i["id"]] for i in tasks if i["id"] in previous})
        full = {v: k for k, v in bare.items()}
        for r in t.to_pylist():
            out[full[r["id"]]] = (r["split"], r["reason"])
    task_clusters: dict[str, list[str]] = defaultdict(list)
    for i in tasks:
        task_clusters[i["cluster_id"]].append(i["id"])
    orphans = []
    for i in (i for i in items if i["kind"] != "task"):
        members = task_clusters.get(i["cluster_id"])
        if not members:
            orphans.append(i)
            continue
        splits = {out[m][0] for m in members}
        split = "holdout" if "holdout" in splits else (splits - {EXCLUDED} or {EXCLUDED}).pop()
        first = min(m for m in members if out[m][0] == split)
        out[i["id"]] = (split, f"cluster_of_task {_source(first)}")
    if orphans:
        tr, va = int(targets.get("train", 0)), int(targets.get("val", 0))
        if tr + va == 0:
            tr = 1
        scale = len(orphans) // (tr + va) + 2
        prev = {i["id"]: previous[i["id"]] for i in orphans if previous.get(i["id"]) in ("train", "val")}
        rows = [{"id": i["id"], "cluster_id": i["cluster_id"], "slice": i.get("tenant_id")} for i in orphans]
        t = assign_splits(rows, targets={"train": tr * scale, "val": va * scale, "holdout": 0}, seed=seed, previous=prev)
        for r in t.to_pylist():
            out[r["id"]] = (r["split"], "trajectory_cluster" if r["reason"] == "assigned" else r["reason"])
    return [{"id": i["id"], "kind": i["kind"], "source_id": _source(i["id"]), "cluster_id": i["cluster_id"],
             "slice": i["slice"], "split": out[i["id"]][0], "reason": out[i["id"]][1], "tenant_id": i.get("tenant_id")}
            for i in items]


def _case(rng: random.Random):
    n_tasks, n_traj = rng.randint(0, 60), rng.randint(0, 200)
    n_clusters = rng.randint(1, 40)
    tenants = [None, "acme", "globex", "initech"][: rng.randint(1, 4)]
    items = [{"id": f"task:t{i:03d}", "kind": "task", "cluster_id": f"c{rng.randrange(n_clusters)}",
              "slice": rng.choice(["flip", "const", None]), "tenant_id": None} for i in range(n_tasks)]
    for j in range(n_traj):
        tenant = rng.choice(tenants)
        items.append({"id": f"traj:r{j:04d}", "kind": "trajectory",
                      "cluster_id": f"c{rng.randrange(n_clusters + 30)}",  # some clusters have no task
                      "slice": tenant, "tenant_id": tenant})
    rng.shuffle(items)
    kw: dict = {"seed": rng.randint(0, 4),
                "targets": rng.choice([{"train": 600, "val": 160, "holdout": 400}, {"train": 3, "val": 1, "holdout": 2},
                                       {"train": 0, "val": 0, "holdout": 2}, {"train": 5, "val": 2, "holdout": 0}])}
    task_ids = [i["id"] for i in items if i["kind"] == "task"]
    if task_ids and rng.random() < 0.5:
        kw["manifest"] = create_manifest([_source(t) for t in rng.sample(task_ids, rng.randint(1, min(6, len(task_ids))))],
                                         locked_by="lead")
    if items and rng.random() < 0.6:
        ids = [i["id"] for i in items]
        kw["previous"] = {i: rng.choice(["train", "val", "holdout", EXCLUDED]) for i in rng.sample(ids, rng.randint(0, len(ids)))}
    return items, kw


def _table(items):
    return pa.table({c: pa.array([i[c] for i in items], pa.string())
                     for c in ("id", "kind", "cluster_id", "slice", "tenant_id")})


def test_random_cases_match_the_row_by_row_version():
    rng = random.Random(20261205)
    for _ in range(300):
        items, kw = _case(rng)
        want = _reference(items, **kw)
        assert governed_splits(items, **kw) == want
        table = governed_split_table(_table(items), **kw)
        assert table.to_pylist() == want
        assert split_summary_md(table) == split_summary_md(want)  # the asset's summary, counted by group
        if "previous" in kw:  # the asset passes earlier splits as a table
            prev = kw["previous"]
            table_kw = {**kw, "previous": pa.table({"id": pa.array(list(prev), pa.string()),
                                                    "split": pa.array(list(prev.values()), pa.string())})}
            assert governed_split_table(_table(items), **table_kw).to_pylist() == want


def test_mixed_slice_types_stratify_as_the_row_version():
    """Slices Arrow cannot hold in one column (1, "1", 1.0, True, None) group as Python values."""
    rng = random.Random(5)
    for seed in range(20):
        items = [{"id": f"task:t{i}", "kind": "task", "cluster_id": f"c{i // 2}",
                  "slice": rng.choice([1, "1", 1.0, True, None, "a", 2]), "tenant_id": None} for i in range(40)]
        items += [{"id": f"traj:r{i}", "kind": "trajectory", "cluster_id": f"c{i}", "slice": "acme", "tenant_id": "acme"}
                  for i in range(30)]
        kw = {"seed": seed, "targets": {"train": 7, "val": 3, "holdout": 3}}
        assert governed_splits(items, **kw) == _reference(items, **kw)


def test_no_items():
    t = governed_split_table(_table([]), {"train": 1, "val": 1, "holdout": 1})
    assert t.num_rows == 0 and t.column_names == ["id", "kind", "source_id", "cluster_id", "slice", "split", "reason",
                                                  "tenant_id"]


def test_a_table_without_its_optional_columns_splits_as_if_they_were_empty():
    """`slice` and `tenant_id` are optional: a table without them splits as one whose columns are
    all null (the rows' version reads a missing key as None)."""
    rng = random.Random(11)
    for _ in range(20):
        items, kw = _case(rng)
        bare = [{**i, "slice": None, "tenant_id": None} for i in items]
        want = _reference(bare, **kw)
        table = _table(bare).drop_columns(["slice", "tenant_id"])
        assert governed_split_table(table, **kw).to_pylist() == want


def test_columns_of_other_arrow_types_split_as_plain_strings():
    """A table read back from Parquet, Polars or DuckDB may hold its id, kind, cluster and tenant
    columns as large strings or dictionaries: the splits, reasons and output schema are those of
    the plain-string table."""
    rng = random.Random(23)
    for _ in range(10):
        items, kw = _case(rng)
        plain = governed_split_table(_table(items), **kw)
        for cast in (lambda c: c.cast(pa.large_string()), lambda c: c.dictionary_encode()):
            t = _table(items)
            for name in ("id", "kind", "cluster_id", "tenant_id"):
                t = t.set_column(t.column_names.index(name), name, cast(t.column(name)))
            got = governed_split_table(t, **kw)
            assert got.schema == plain.schema, (got.schema, plain.schema)
            assert got.to_pylist() == plain.to_pylist()


def test_a_row_without_a_kind_is_split_as_a_trajectory():
    """Only `kind == "task"` makes a task: a null kind is a trajectory (it follows its cluster's
    tasks and never enters holdout on its own), as in the row-by-row version."""
    rng = random.Random(29)
    for _ in range(20):
        items, kw = _case(rng)
        items = [{**i, "kind": None} if i["kind"] == "trajectory" and rng.random() < 0.5 else i for i in items]
        assert governed_split_table(_table(items), **kw).to_pylist() == _reference(items, **kw)


def test_targets_that_leave_out_train_or_val_give_orphan_trajectories_none_of_it():
    """A split missing from the targets has a target of zero: trajectories of clusters with no
    task go only to the splits the targets name (all to train where they name neither)."""
    rng = random.Random(31)
    for targets in ({"val": 3, "holdout": 2}, {"train": 4, "holdout": 1}, {"holdout": 2}):
        for _ in range(10):
            items, kw = _case(rng)
            kw["targets"] = targets
            got = governed_split_table(_table(items), **kw).to_pylist()
            assert got == _reference(items, **kw)
            orphan = {r["split"] for r in got if r["reason"] == "trajectory_cluster"}
            assert orphan <= ({s for s in ("train", "val") if s in targets} or {"train"}), (targets, orphan)


def test_only_the_namespace_prefix_is_taken_off_a_source_id():
    """`source_id` drops the `task:` / `traj:` namespace once: a user's id that itself starts
    with `task:` keeps it."""
    items = [{"id": "task:task:7", "kind": "task", "cluster_id": "c1", "slice": None, "tenant_id": None},
             {"id": "traj:traj:r", "kind": "trajectory", "cluster_id": "c1", "slice": None, "tenant_id": None},
             {"id": "traj:task:q", "kind": "trajectory", "cluster_id": "c2", "slice": None, "tenant_id": None}]
    got = governed_split_table(_table(items), {"train": 1, "val": 0, "holdout": 0})
    assert got.column("source_id").to_pylist() == ["task:7", "traj:r", "task:q"]
