"""Hand cases for the split rules below the split_assignments asset: `governed_splits` (tasks and
trajectories together), the locked holdout's exclusion rule and the targets arithmetic. The
asset tests reach these only through a whole Dagster graph over a HumanEval suite, where a rule
that quietly changed (a trajectory drifting into holdout, a near-copy of a holdout task going to
train) would not show."""
from collections import Counter

import pytest

from ratchet.governance.manifest import create_manifest
from ratchet.governance.splits import EXCLUDED, assign_splits, governed_splits, split_summary_md, split_targets

pytestmark = pytest.mark.governance

TARGETS = {"train": 600, "val": 160, "holdout": 400}


def _task(tid, cluster, slice_="s1"):
    return {"id": f"task:{tid}", "kind": "task", "cluster_id": cluster, "slice": slice_, "tenant_id": None}


def _traj(rid, cluster, tenant="acme"):
    return {"id": f"traj:{rid}", "kind": "trajectory", "cluster_id": cluster, "slice": tenant, "tenant_id": tenant}


def _by_id(rows):
    return {r["id"]: r for r in rows}


def test_split_targets_largest_remainder_and_absent_splits():
    # 10 of 1160: raw 5.17 / 1.38 / 3.45 -> 5 / 1 / 3, and the one left over goes to the largest
    # remainder (holdout's .45), not to the largest split
    assert split_targets(10) == {"train": 5, "val": 1, "holdout": 4}
    # a split the targets do not name gets nothing, whether the items are few or many
    assert split_targets(10, {"train": 3, "val": 1}) == {"train": 9, "val": 1, "holdout": 0}
    assert split_targets(3, {"train": 3, "val": 1}) == {"train": 2, "val": 1, "holdout": 0}


def test_singleton_clusters_meet_the_targets_exactly_in_every_slice():
    items = [{"id": f"t{i:02d}", "cluster_id": f"c{i:02d}", "slice": f"s{i % 2}"} for i in range(20)]
    rows = assign_splits(items, targets={"train": 10, "val": 4, "holdout": 6}).to_pylist()
    assert Counter(r["split"] for r in rows) == {"train": 10, "val": 4, "holdout": 6}
    per_slice = Counter((r["slice"], r["split"]) for r in rows)
    assert per_slice == {("s0", "train"): 5, ("s1", "train"): 5, ("s0", "val"): 2, ("s1", "val"): 2,
                         ("s0", "holdout"): 3, ("s1", "holdout"): 3}      # each slice spread like the whole
    assert [r["slice"] for r in rows] == [i["slice"] for i in items]      # the slice column is the input's
    assert {r["reason"] for r in rows} == {"assigned"}


def test_a_near_copy_of_a_locked_holdout_task_is_excluded_not_trained_on():
    m = create_manifest(["h1"], locked_by="lead")
    items = [{"id": "h1", "cluster_id": "ch", "slice": "s"}, {"id": "h1-copy", "cluster_id": "ch", "slice": "s"},
             *({"id": f"f{i}", "cluster_id": f"cf{i}", "slice": "s"} for i in range(19))]
    rows = {r["id"]: r for r in assign_splits(items, targets=TARGETS, manifest=m).to_pylist()}
    assert (rows["h1"]["split"], rows["h1"]["reason"]) == ("holdout", "locked_holdout")
    assert rows["h1-copy"]["split"] == EXCLUDED
    assert rows["h1-copy"]["reason"] == "shares cluster ch with locked holdout task h1"
    # the holdout is frozen: the 19 free tasks share train and val in the reference 600:160 ratio
    free = Counter(r["split"] for i, r in rows.items() if i.startswith("f"))
    assert free == {"train": 15, "val": 4} and {rows[f"f{i}"]["reason"] for i in range(19)} == {"new_cluster"}


def test_a_previous_holdout_assignment_is_kept_only_while_nothing_is_locked():
    items = [{"id": "a", "cluster_id": "ca", "slice": "s"}, *({"id": f"f{i}", "cluster_id": f"cf{i}", "slice": "s"}
                                                            for i in range(10))]
    previous = {"a": "holdout", "f0": "val"}
    rows = {r["id"]: r for r in assign_splits(items, targets=TARGETS, previous=previous).to_pylist()}
    assert (rows["a"]["split"], rows["a"]["reason"]) == ("holdout", "previous")
    assert (rows["f0"]["split"], rows["f0"]["reason"]) == ("val", "previous")
    # under a locked manifest that does not list it, "a" cannot re-enter the frozen holdout
    m = create_manifest(["f9"], locked_by="lead")
    rows = {r["id"]: r for r in assign_splits(items, targets=TARGETS, manifest=m, previous=previous).to_pylist()}
    assert rows["a"]["split"] in ("train", "val") and rows["a"]["reason"] == "new_cluster"
    assert (rows["f0"]["split"], rows["f0"]["reason"]) == ("val", "previous")
    assert [i for i, r in rows.items() if r["split"] == "holdout"] == ["f9"]


def test_a_cluster_whose_members_were_split_apart_follows_their_majority():
    # members of one cluster that earlier runs put in different splits (clusters merge as data
    # grows) go whole to the split most of them were in; on a tie, train before val
    items = [{"id": i, "cluster_id": "c", "slice": "s"} for i in ("m1", "m2", "m3")]
    rows = assign_splits(items, targets=TARGETS, previous={"m1": "train", "m2": "val", "m3": "val"}).to_pylist()
    assert {(r["split"], r["reason"]) for r in rows} == {("val", "previous")}
    rows = assign_splits(items, targets=TARGETS, previous={"m1": "val", "m2": "train"}).to_pylist()
    assert {(r["split"], r["reason"]) for r in rows} == {("train", "previous")}


def test_trajectories_follow_their_cluster_and_holdout_wins():
    m = create_manifest(["h1"], locked_by="lead")
    items = [_task("h1", "ch"), _task("h1-copy", "ch"), _traj("r-h", "ch"),       # holdout cluster
             _task("b1", "cb", "s2"), _traj("r-b", "cb"),                         # a free task cluster
             *(_task(f"f{i}", f"cf{i}") for i in range(8))]
    rows = _by_id(governed_splits(items, TARGETS, manifest=m))
    assert [r["id"] for r in governed_splits(items, TARGETS, manifest=m)] == [i["id"] for i in items]
    # the trajectory of a cluster holding a locked holdout task is held out with it (not excluded)
    assert (rows["traj:r-h"]["split"], rows["traj:r-h"]["reason"]) == ("holdout", "cluster_of_task h1")
    assert rows["task:h1-copy"]["split"] == EXCLUDED and rows["task:h1"]["split"] == "holdout"
    assert rows["traj:r-b"]["split"] == rows["task:b1"]["split"] in ("train", "val")
    assert rows["traj:r-b"]["reason"] == "cluster_of_task b1"
    # namespaced ids in, bare source ids out; kind, slice and tenant carried through
    assert rows["task:b1"]["source_id"] == "b1" and rows["traj:r-b"]["source_id"] == "r-b"
    assert (rows["traj:r-b"]["kind"], rows["traj:r-b"]["slice"], rows["traj:r-b"]["tenant_id"]) == (
        "trajectory", "acme", "acme")
    assert (rows["task:b1"]["kind"], rows["task:b1"]["slice"], rows["task:b1"]["cluster_id"]) == ("task", "s2", "cb")


def test_a_task_id_with_a_colon_keeps_all_of_it():
    # only the "task:" namespace is stripped: the manifest and the tasks table hold the rest whole
    m = create_manifest(["org:h1"], locked_by="lead")
    items = [_task("org:h1", "ch"), _traj("run:1", "ch"), *(_task(f"f{i}", f"cf{i}") for i in range(4))]
    rows = _by_id(governed_splits(items, TARGETS, manifest=m))
    assert (rows["task:org:h1"]["source_id"], rows["task:org:h1"]["split"]) == ("org:h1", "holdout")
    assert (rows["traj:run:1"]["source_id"], rows["traj:run:1"]["reason"]) == ("run:1", "cluster_of_task org:h1")


def test_trajectory_only_clusters_never_enter_holdout():
    """A trajectory with no task in its cluster shares train and val in the targets' train:val
    ratio (stratified by tenant); a holdout is a set of tasks, so it never gets one, not even
    one that a previous run put there."""
    items = [_task(f"t{i}", f"c{i}") for i in range(4)]
    items += [_traj(f"o{i:02d}", f"oc{i:02d}", tenant="acme" if i % 2 else "globex") for i in range(20)]
    previous = {"traj:o00": "holdout", "traj:o01": "val", "traj:o02": "train"}
    rows = _by_id(governed_splits(items, {"train": 3, "val": 1, "holdout": 2}, previous=previous))
    orphans = {i: r for i, r in rows.items() if i.startswith("traj:")}
    assert Counter(r["split"] for r in orphans.values()) == {"train": 15, "val": 5}
    assert (orphans["traj:o01"]["split"], orphans["traj:o01"]["reason"]) == ("val", "previous")
    assert (orphans["traj:o02"]["split"], orphans["traj:o02"]["reason"]) == ("train", "previous")
    assert orphans["traj:o00"]["reason"] == "trajectory_cluster"
    assert {r["reason"] for i, r in orphans.items() if i not in previous} == {"trajectory_cluster"}
    per_tenant = Counter((r["tenant_id"], r["split"]) for r in orphans.values())
    assert per_tenant["acme", "val"] and per_tenant["globex", "val"]       # each tenant in both
    # with no train or val target at all the orphans still land in train, never holdout
    rows = _by_id(governed_splits(items, {"train": 0, "val": 0, "holdout": 2}))
    assert {r["split"] for i, r in rows.items() if i.startswith("traj:")} == {"train"}


def test_split_summary_counts_tasks_per_slice_and_trajectories_apart():
    rows = [*[{"kind": "task", "slice": "s1", "split": "train"}] * 2,
            {"kind": "task", "slice": "s1", "split": EXCLUDED},
            {"kind": "task", "slice": None, "split": "holdout"},
            *[{"kind": "trajectory", "slice": "acme", "split": "val"}] * 2]
    md = split_summary_md(rows)
    assert md.splitlines() == [
        "| slice | train | val | holdout | excluded_contaminated |", "|---|---|---|---|---|",
        "| (none) | 0 | 0 | 1 | 0 |", "| s1 | 2 | 0 | 0 | 1 |",
        "| **all tasks** | 2 | 0 | 1 | 1 |", "| *trajectories* | 0 | 2 | 0 | 0 |"]


def test_the_seed_defaults_to_zero_on_every_split_entry_point():
    """Equal-sized clusters are ordered by a seeded hash: without a seed, the rows, the table and
    the task splitter all use seed 0, so a split made through one of them is the split of another."""
    import pyarrow as pa

    from ratchet.governance.splits import governed_split_table

    items = [_task(f"t{i}", f"c{i}") for i in range(10)]
    targets = {"train": 6, "val": 2, "holdout": 2}
    splits = lambda rows: [r["split"] for r in rows]  # noqa: E731
    default = splits(governed_splits(items, targets))
    assert default == splits(governed_splits(items, targets, seed=0)) != splits(governed_splits(items, targets, seed=1))
    assert default == governed_split_table(pa.Table.from_pylist(items), targets).column("split").to_pylist()
    bare = [{"id": i["id"].split(":", 1)[1], "cluster_id": i["cluster_id"], "slice": i["slice"]} for i in items]
    assert default == assign_splits(bare, targets=targets).column("split").to_pylist()
