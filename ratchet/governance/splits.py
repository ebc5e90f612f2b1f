"""Group-aware, slice-stratified train / val / holdout splits with a locked holdout.

Rules:
  * A cluster (clusters.build_clusters) goes whole to one split.
  * Targets (reference 600 / 160 / 400): with fewer items than their sum, every split is scaled
    proportionally; with more, holdout and val keep their size and train takes the surplus.
  * Greedy assignment, biggest clusters first (seeded hash order among equal sizes), to the
    split with the largest relative deficit, summed over the cluster's slices (so each slice is
    spread across splits like the whole) plus the split's own deficit.
  * With a locked manifest: manifest tasks stay in holdout, nothing new enters holdout. An item
    that is not in the manifest but shares a cluster with a holdout task may not go to train or
    val either (it is a near-copy of a holdout task) and cannot join the frozen holdout: it is
    `excluded_contaminated`, with the reason naming the holdout task.
  * `previous` assignments (id -> split) keep train/val stable across re-splits.

Rows (split_assignments): id, cluster_id, slice, split, reason.
"""
from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

from .clusters import rows_of
from .manifest import HoldoutManifest, verify_manifest
from .tables import TASK_PREFIX, TRAJ_PREFIX

SPLITS = ("train", "val", "holdout")
EXCLUDED = "excluded_contaminated"
DEFAULT_TARGETS = {"train": 600, "val": 160, "holdout": 400}


def split_targets(n: int, targets: Mapping[str, int] = DEFAULT_TARGETS) -> dict[str, int]:
    total = sum(targets.values())
    if n >= total:
        out = {s: int(targets.get(s, 0)) for s in SPLITS if s != "train"}
        out["train"] = n - sum(out.values())
        return {s: out[s] for s in SPLITS}
    raw = {s: n * targets.get(s, 0) / total for s in SPLITS}
    out = {s: int(raw[s]) for s in SPLITS}
    for s in sorted(SPLITS, key=lambda s: raw[s] - out[s], reverse=True)[: n - sum(out.values())]:
        out[s] += 1  # largest remainder
    return out


def _order(cid: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{cid}".encode()).hexdigest()


def _greedy(clusters: dict[str, list[dict]], targets: dict[str, int], slice_totals: Counter, seed: int,
            assigned: dict[str, int], per_slice: dict[str, Counter], slice_col: str) -> dict[str, str]:
    splits = [s for s in SPLITS if targets.get(s, 0) > 0] or ["train"]
    frac = {s: targets.get(s, 0) / max(sum(targets.values()), 1) for s in splits}
    out = {}
    for cid in sorted(clusters, key=lambda c: (-len(clusters[c]), _order(c, seed))):
        members = clusters[cid]
        size = len(members)
        sl = Counter(m.get(slice_col) for m in members)

        def score(s: str) -> float:
            deficit = (targets[s] - assigned[s]) / max(targets[s], 1)
            for key, c in sl.items():
                t = slice_totals[key] * frac[s]
                deficit += c / size * (t - per_slice[s][key]) / max(t, 1)
            return deficit

        fits = [s for s in splits if assigned[s] + size <= targets[s]]
        pool = fits or splits  # nothing fits: overflow the split that lacks most
        best = max(pool, key=lambda s: (score(s), -SPLITS.index(s)))
        out[cid] = best
        assigned[best] += size
        per_slice[best].update(sl)
    return out


def assign_splits(
    items: Any,
    id_col: str = "id",
    cluster_col: str = "cluster_id",
    slice_col: str = "slice",
    targets: Mapping[str, int] = DEFAULT_TARGETS,
    seed: int = 0,
    manifest: HoldoutManifest | None = None,
    previous: Mapping[str, str] | None = None,
):
    """Assign every item a split. Returns a pyarrow Table (id, cluster_id, slice, split, reason).
    A locked `manifest` is verified first (ManifestError if tampered)."""
    import pyarrow as pa

    rows = rows_of(items)
    clusters: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        clusters[str(r[cluster_col])].append(r)
    split_of: dict[str, tuple[str, str]] = {}  # id -> (split, reason)
    locked = manifest is not None and manifest.locked
    free = dict(clusters)
    n_free = len(rows)
    if locked:
        verify_manifest(manifest)
        hold = set(manifest.task_ids)
        for cid, members in clusters.items():
            in_hold = sorted(str(m[id_col]) for m in members if str(m[id_col]) in hold)
            if in_hold:
                for m in members:
                    i = str(m[id_col])
                    split_of[i] = ("holdout", "locked_holdout") if i in hold else (
                        EXCLUDED, f"shares cluster {cid} with locked holdout task {in_hold[0]}")
                del free[cid]
                n_free -= len(members)
        # holdout is frozen: the rest is shared by train and val in their reference ratio
        tv = targets.get("train", 0) + targets.get("val", 0)
        val = targets.get("val", 0) if n_free >= tv else round(n_free * targets.get("val", 0) / max(tv, 1))
        tgt = {"train": n_free - val, "val": val, "holdout": 0}
    else:
        tgt = split_targets(n_free, targets)
    assigned = {s: 0 for s in SPLITS}
    per_slice: dict[str, Counter] = {s: Counter() for s in SPLITS}
    if previous:
        for cid in list(free):
            prev = Counter(previous.get(str(m[id_col])) for m in free[cid])
            prev.pop(None, None)
            prev = Counter({s: c for s, c in prev.items() if s in ("train", "val") or (s == "holdout" and not locked)})
            if prev:
                s = max(prev, key=lambda s: (prev[s], -SPLITS.index(s)))
                for m in free[cid]:
                    split_of[str(m[id_col])] = (s, "previous")
                assigned[s] += len(free[cid])
                per_slice[s].update(m.get(slice_col) for m in free[cid])
                del free[cid]
    slice_totals = Counter(r.get(slice_col) for c in free.values() for r in c)
    for s in SPLITS:  # previous assignments count toward targets and slice targets
        slice_totals.update(per_slice[s])
    chosen = _greedy(free, tgt, slice_totals, seed, assigned, per_slice, slice_col)
    for cid, s in chosen.items():
        for m in free[cid]:
            split_of[str(m[id_col])] = (s, "new_cluster" if locked else "assigned")
    ids = [str(r[id_col]) for r in rows]
    return pa.table({
        "id": pa.array(ids, pa.string()),
        "cluster_id": pa.array([str(r[cluster_col]) for r in rows], pa.string()),
        "slice": pa.array([None if r.get(slice_col) is None else str(r.get(slice_col)) for r in rows], pa.string()),
        "split": pa.array([split_of[i][0] for i in ids], pa.string()),
        "reason": pa.array([split_of[i][1] for i in ids], pa.string()),
    })


def holdout_ids(assignments: Any) -> list[str]:
    return sorted(r["id"] for r in rows_of(assignments) if r["split"] == "holdout")


# ------------------------------------------------- tasks and trajectories together (split_assignments)
def _source(item_id: str) -> str:
    return item_id.split(":", 1)[1] if item_id.startswith((TASK_PREFIX, TRAJ_PREFIX)) else item_id


def governed_splits(items: Iterable[Mapping], targets: Mapping[str, int], seed: int = 0,
                    manifest: HoldoutManifest | None = None, previous: Mapping[str, str] | None = None) -> list[dict]:
    """Split tasks by cluster (`splits.assign_splits`, targets count tasks), then give every
    trajectory the split of its cluster's tasks (holdout wins when a cluster holds a locked
    holdout task and excluded near-copies). Trajectory-only clusters share train / val in the
    targets' train:val ratio, stratified by tenant, and never enter holdout.
    items: rows with id, kind ("task" | "trajectory"), cluster_id, slice, tenant_id.
    Returns split_assignments rows (without timestamps)."""
    items = list(items)
    previous = previous or {}
    tasks = [{"id": i["id"], "cluster_id": i["cluster_id"], "slice": i["slice"]} for i in items if i["kind"] == "task"]
    out: dict[str, tuple[str, str]] = {}
    if tasks:
        # the manifest lists bare task ids: split on those, report namespaced ids
        bare = {i["id"]: _source(i["id"]) for i in tasks}
        t = assign_splits([{**i, "id": bare[i["id"]]} for i in tasks], targets=targets, seed=seed, manifest=manifest,
                          previous={bare[i["id"]]: previous[i["id"]] for i in tasks if i["id"] in previous})
        full = {v: k for k, v in bare.items()}
        for r in t.to_pylist():
            out[full[r["id"]]] = (r["split"], r["reason"])
    task_clusters: dict[str, list[str]] = defaultdict(list)
    for i in tasks:
        task_clusters[i["cluster_id"]].append(i["id"])
    trajs = [i for i in items if i["kind"] != "task"]
    orphans = []
    for i in trajs:
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
        scale = len(orphans) // (tr + va) + 2  # keeps the sum above n: split_targets goes proportional
        prev = {i["id"]: previous[i["id"]] for i in orphans if previous.get(i["id"]) in ("train", "val")}
        rows = [{"id": i["id"], "cluster_id": i["cluster_id"], "slice": i.get("tenant_id")} for i in orphans]
        t = assign_splits(rows, targets={"train": tr * scale, "val": va * scale, "holdout": 0}, seed=seed, previous=prev)
        for r in t.to_pylist():
            out[r["id"]] = (r["split"], "trajectory_cluster" if r["reason"] == "assigned" else r["reason"])
    return [{"id": i["id"], "kind": i["kind"], "source_id": _source(i["id"]), "cluster_id": i["cluster_id"],
             "slice": i["slice"], "split": out[i["id"]][0], "reason": out[i["id"]][1], "tenant_id": i.get("tenant_id")}
            for i in items]


def split_summary_md(rows: Iterable[Mapping]) -> str:
    """Markdown table: items per slice x split (tasks), then trajectories per split."""
    cols = [*SPLITS, EXCLUDED]
    by = defaultdict(Counter)
    trajs = Counter()
    for r in rows:
        if r["kind"] == "task":
            by[r["slice"] or "(none)"][r["split"]] += 1
        else:
            trajs[r["split"]] += 1
    from ratchet.markdown import md_table

    total = Counter()
    for c in by.values():
        total.update(c)
    rows = [[s, *(by[s][c] for c in cols)] for s in sorted(by)]
    rows += [["**all tasks**", *(total[c] for c in cols)], ["*trajectories*", *(trajs[c] for c in cols)]]
    return md_table(["slice", *cols], rows)
