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


def _greedy(names: list[str], sizes: list[int], cluster_slices: list[list[tuple[int, int]]], free: list[int],
            targets: dict[str, int], slice_totals: list[int], seed: int, assigned: dict[str, int],
            per_slice: dict[str, list[int]]) -> dict[int, str]:
    """Cluster index -> split for the `free` clusters. cluster_slices holds (slice code, count) in
    the order the slices first appear in the cluster: the score sums floats in that order, so
    near-ties break the same way whatever the input's container."""
    splits = [s for s in SPLITS if targets.get(s, 0) > 0] or ["train"]
    frac = {s: targets.get(s, 0) / max(sum(targets.values()), 1) for s in splits}
    out = {}
    for c in sorted(free, key=lambda c: (-sizes[c], _order(names[c], seed))):
        size = sizes[c]
        sl = cluster_slices[c]

        def score(s: str) -> float:
            deficit = (targets[s] - assigned[s]) / max(targets[s], 1)
            for key, n in sl:
                t = slice_totals[key] * frac[s]
                deficit += n / size * (t - per_slice[s][key]) / max(t, 1)
            return deficit

        fits = [s for s in splits if assigned[s] + size <= targets[s]]
        pool = fits or splits  # nothing fits: overflow the split that lacks most
        best = max(pool, key=lambda s: (score(s), -SPLITS.index(s)))
        out[c] = best
        assigned[best] += size
        for key, n in sl:
            per_slice[best][key] += n
    return out


def _factorize(values: list) -> tuple[list[int], int]:
    codes: dict = {}  # hash equality, as a Counter keyed by the values would group them
    return [codes.setdefault(v, len(codes)) for v in values], len(codes)


def _str_array(col):
    """[str(v) for v in col] as one pa.string array; string columns stay columnar (null -> "None")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type):
        col = col.cast(pa.string())
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return (pc.fill_null(col, "None") if col.null_count else col).cast(pa.string())
    return pa.array([str(v) for v in col.to_pylist()], pa.string())


def _columns(items: Any, id_col: str, cluster_col: str, slice_col: str):
    """(ids, cluster ids, slice codes, number of slice keys, slice output column) of the input.
    An Arrow table or record batch is read column by column, never as row objects."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(items, (pa.Table, pa.RecordBatch)):
        n = items.num_rows
        names = items.schema.names
        for c in (id_col, cluster_col):
            if c not in names and n:
                raise KeyError(c)
        if n == 0:
            empty = pa.array([], pa.string())
            return empty, empty, np.zeros(0, np.int64), 0, empty
        ids, cids = _str_array(items.column(id_col)), _str_array(items.column(cluster_col))
        if slice_col not in names:
            return ids, cids, np.zeros(n, np.int64), 1, pa.nulls(n, pa.string())
        sl = items.column(slice_col)
        if isinstance(sl, pa.ChunkedArray):
            sl = sl.combine_chunks() if sl.num_chunks != 1 else sl.chunk(0)
        if pa.types.is_dictionary(sl.type) and pa.types.is_string(sl.type.value_type):
            sl = sl.cast(pa.string())
        if pa.types.is_string(sl.type) or pa.types.is_large_string(sl.type):
            enc = pc.dictionary_encode(sl, null_encoding="encode")  # codes in first-appearance order
            codes = enc.indices.to_numpy(zero_copy_only=False)
            return ids, cids, codes, len(enc.dictionary), sl.cast(pa.string())
        values = sl.to_pylist()  # an unusual slice type: group the Python values as the row path does
    else:
        rows = rows_of(items)
        ids = pa.array([str(r[id_col]) for r in rows], pa.string())
        cids = pa.array([str(r[cluster_col]) for r in rows], pa.string())
        values = [r.get(slice_col) for r in rows]
    codes, k = _factorize(values)
    out = pa.array([None if v is None else str(v) for v in values], pa.string())
    return ids, cids, np.asarray(codes, np.int64), k, out


def _pair_counts(cc, sc, k: int, n_sk: int):
    """Distinct cluster * n_sk + slice codes (ascending), the row each first occurs at, and its count.
    With few slices the codes index flat arrays (no sort of n codes: that is the memory peak)."""
    import numpy as np

    n = len(cc)
    if k * n_sk > 2 * n + 4096:  # many slices: sparse pairs
        return np.unique(cc.astype(np.int64) * n_sk + sc, return_index=True, return_counts=True)
    dt = np.int32 if k * n_sk < 2**31 and n < 2**31 else np.int64
    pair = cc.astype(dt) * dt(n_sk) + sc.astype(dt)
    counts = np.bincount(pair, minlength=k * n_sk)
    first = np.full(k * n_sk, n, np.int64)
    np.minimum.at(first, pair, np.arange(n, dtype=dt))
    del pair
    present = np.flatnonzero(counts)
    return present, first[present], counts[present]


def _has_repeats(ids) -> bool:
    """Whether any id occurs twice: neighbours after a sort, compared a block at a time (a hash
    set of 10M strings would cost more memory than the rest of the split)."""
    import pyarrow.compute as pc

    order = pc.sort_indices(ids)
    step = 1 << 20
    for a in range(0, len(ids) - 1, step):
        block = ids.take(order.slice(a, step + 1))
        if pc.any(pc.equal(block.slice(1), block.slice(0, len(block) - 1))).as_py():
            return True
    return False


def assign_splits(
    items: Any,
    id_col: str = "id",
    cluster_col: str = "cluster_id",
    slice_col: str = "slice",
    targets: Mapping[str, int] = DEFAULT_TARGETS,
    seed: int = 0,
    manifest: HoldoutManifest | None = None,
    previous: Any = None,
):
    """Assign every item a split. Returns a pyarrow Table (id, cluster_id, slice, split, reason).
    `previous`: earlier splits, a mapping id -> split or a pyarrow Table (id, split).
    A locked `manifest` is verified first (ManifestError if tampered).
    items: rows (dicts), a DataFrame, or a pyarrow Table / RecordBatch, which is worked on as
    columns (cluster codes and counts in numpy; Python loops only over clusters), so memory stays
    a few small arrays per row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids, cids, sc, n_sk, slice_out = _columns(items, id_col, cluster_col, slice_col)
    n = len(ids)
    enc = pc.dictionary_encode(cids)  # cluster codes in first-appearance order
    cc = enc.indices.to_numpy(zero_copy_only=False)
    names = enc.dictionary.to_pylist()
    k = len(names)
    sizes = np.bincount(cc, minlength=k)
    # (cluster, slice) counts, each cluster's slices in the order they first appear in it
    pair, first, counts = _pair_counts(cc, sc, k, max(n_sk, 1))
    p_cluster, p_slice = pair // max(n_sk, 1), pair % max(n_sk, 1)
    o = np.lexsort((first, p_cluster))
    p_cluster, p_slice, counts = p_cluster[o], p_slice[o], counts[o]
    del pair, first, o
    bounds = np.searchsorted(p_cluster, np.arange(k + 1)).tolist()
    sl_l, cnt_l = p_slice.tolist(), counts.tolist()

    # per row: split code (index into split_names) and reason code (index into reasons)
    split_names = [*SPLITS, EXCLUDED]
    split_code = np.zeros(n, np.int8)
    reasons = ["locked_holdout", "previous", "assigned"]
    reason_code = np.zeros(n, np.int32)
    phase = np.full(k, 2, np.int8)  # 0 locked, 1 previous, 2 greedy: the order rows are decided in
    locked = manifest is not None and manifest.locked
    free = np.ones(k, bool)
    row_locked = np.zeros(n, bool)
    n_free = n
    if locked:
        verify_manifest(manifest)
        hold = pa.array(sorted({t for t in manifest.task_ids if isinstance(t, str)}), pa.string())
        in_hold = pc.is_in(ids, value_set=hold).to_numpy(zero_copy_only=False)
        hold_rows = np.flatnonzero(in_hold)
        first_hold: dict[int, str] = {}
        for c, i in zip(cc[hold_rows].tolist(), ids.take(pa.array(hold_rows)).to_pylist()):
            if c not in first_hold or i < first_hold[c]:
                first_hold[c] = i
        reasons[2] = "new_cluster"
        excl = np.zeros(k, np.int32)
        for c in sorted(first_hold):
            excl[c] = len(reasons)
            reasons.append(f"shares cluster {names[c]} with locked holdout task {first_hold[c]}")
        locked_c = np.zeros(k, bool)
        locked_c[list(first_hold)] = True
        free &= ~locked_c
        phase[locked_c] = 0
        row_locked = locked_c[cc]
        split_code[row_locked] = np.where(in_hold[row_locked], 2, 3)
        reason_code[row_locked] = np.where(in_hold[row_locked], 0, excl[cc[row_locked]])
        n_free = n - int(row_locked.sum())
        del in_hold
        # holdout is frozen: the rest is shared by train and val in their reference ratio
        tv = targets.get("train", 0) + targets.get("val", 0)
        val = targets.get("val", 0) if n_free >= tv else round(n_free * targets.get("val", 0) / max(tv, 1))
        tgt = {"train": n_free - val, "val": val, "holdout": 0}
    else:
        tgt = split_targets(n_free, targets)
    assigned = {s: 0 for s in SPLITS}
    per_slice = {s: [0] * n_sk for s in SPLITS}
    if isinstance(previous, pa.Table) and not previous.num_rows:
        previous = None
    if previous:
        allowed = ("train", "val") if locked else SPLITS
        votes = np.zeros((len(SPLITS), k), np.int64)
        for si, s in enumerate(SPLITS):
            if s not in allowed:
                continue
            if isinstance(previous, pa.Table):  # columns (id, split): no dict of every id
                keys = previous.filter(pc.equal(previous.column("split"), s)).column("id").combine_chunks()
            else:
                keys = pa.array([i for i, v in previous.items() if v == s and isinstance(i, str)], pa.string())
            if len(keys):
                m = pc.is_in(ids, value_set=keys).to_numpy(zero_copy_only=False)
                votes[si] = np.bincount(cc[m], minlength=k)  # votes in locked clusters go unused
        prev_c = free & (votes.sum(axis=0) > 0)
        choice = votes.argmax(axis=0)  # most votes; on a tie the first of train, val, holdout
        for c in np.flatnonzero(prev_c).tolist():
            s = SPLITS[int(choice[c])]
            assigned[s] += int(sizes[c])
            for j in range(bounds[c], bounds[c + 1]):
                per_slice[s][sl_l[j]] += cnt_l[j]
        rows_prev = prev_c[cc]
        split_code[rows_prev] = choice[cc[rows_prev]]
        reason_code[rows_prev] = 1
        free &= ~prev_c
        phase[prev_c] = 1
        del votes, rows_prev
    slice_totals = np.bincount(sc[~row_locked], minlength=n_sk).tolist()  # free and previous rows
    del row_locked
    cluster_slices = [list(zip(sl_l[bounds[c]:bounds[c + 1]], cnt_l[bounds[c]:bounds[c + 1]])) for c in range(k)]
    free_l = np.flatnonzero(free).tolist()
    chosen = _greedy(names, sizes.tolist(), cluster_slices, free_l, tgt, slice_totals, seed, assigned, per_slice)
    greedy_split = np.zeros(k, np.int8)
    rank = np.arange(k, dtype=np.int64)  # locked and previous clusters are decided in input order
    for pos, (c, s) in enumerate(chosen.items()):
        greedy_split[c] = SPLITS.index(s)
        rank[c] = pos
    rows_free = free[cc]
    split_code[rows_free] = greedy_split[cc[rows_free]]
    reason_code[rows_free] = 2
    del rows_free
    if _has_repeats(ids):
        # a repeated id: every copy takes the decision made last, as one id -> split mapping would
        idc = pc.dictionary_encode(ids).indices.to_numpy(zero_copy_only=False)
        key = phase.astype(np.int64)[cc] * (k + 1) + rank[cc]
        o = np.lexsort((np.arange(n), key, idc))
        last = o[np.r_[idc[o][1:] != idc[o][:-1], True]]
        winner = np.empty(int(idc.max()) + 1, np.int64)
        winner[idc[last]] = last
        w = winner[idc]
        split_code, reason_code = split_code[w], reason_code[w]
    return pa.table({
        "id": ids,
        "cluster_id": cids,
        "slice": slice_out,
        "split": pa.array(split_names, pa.string()).take(pa.array(split_code)),
        "reason": pa.array(reasons, pa.string()).take(pa.array(reason_code)),
    })


def holdout_ids(assignments: Any) -> list[str]:
    return sorted(r["id"] for r in rows_of(assignments) if r["split"] == "holdout")


# ------------------------------------------------- tasks and trajectories together (split_assignments)
def _source(item_id: str) -> str:
    return item_id.split(":", 1)[1] if item_id.startswith((TASK_PREFIX, TRAJ_PREFIX)) else item_id


def governed_splits(items: Iterable[Mapping], targets: Mapping[str, int], seed: int = 0,
                    manifest: HoldoutManifest | None = None, previous: Mapping[str, str] | None = None) -> list[dict]:
    """`governed_split_table` over rows: items are dicts with id, kind ("task" | "trajectory"),
    cluster_id, slice, tenant_id; returns split_assignments rows (without timestamps)."""
    import pyarrow as pa

    items = list(items)
    cols = {c: [i.get(c) for i in items] for c in ("id", "kind", "cluster_id", "slice", "tenant_id")}
    try:
        slice_col = pa.array(cols["slice"])
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # mixed slice types: their codes group and order them as the row path's Counter would
        # (the values themselves are put back below)
        slice_col = pa.array(_factorize(cols["slice"])[0], pa.int64())
    tbl = pa.table({"id": pa.array([str(x) for x in cols["id"]], pa.string()), "kind": pa.array(cols["kind"], pa.string()),
                    "cluster_id": pa.array([str(x) for x in cols["cluster_id"]], pa.string()), "slice": slice_col,
                    "tenant_id": pa.array(cols["tenant_id"], pa.string())})
    out = governed_split_table(tbl, targets, seed=seed, manifest=manifest, previous=previous).to_pylist()
    for r, i in zip(out, items):
        r["slice"] = i["slice"]
    return out


def governed_split_table(items: Any, targets: Mapping[str, int], seed: int = 0,
                         manifest: HoldoutManifest | None = None, previous: Any = None):
    """Split tasks by cluster (`splits.assign_splits`, targets count tasks), then give every
    trajectory the split of its cluster's tasks (holdout wins when a cluster holds a locked
    holdout task and excluded near-copies). Trajectory-only clusters share train / val in the
    targets' train:val ratio, stratified by tenant, and never enter holdout.
    items: a pyarrow Table (id, kind "task" | "trajectory", cluster_id, slice, tenant_id);
    previous: id -> split, a mapping or a Table (id, split). Returns the split_assignments
    columns (id, kind, source_id, cluster_id, slice, split, reason, tenant_id; no timestamps) in
    the items' order. Tasks are few and handled as rows; trajectories (millions) as columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = items.num_rows

    def col(name: str, cast: bool = True):
        if name not in items.column_names:
            return pa.chunked_array([pa.nulls(n, pa.string())])
        return items.column(name).cast(pa.string()) if cast else items.column(name)
    ids, kind, cids, tenant = col("id"), col("kind"), col("cluster_id"), col("tenant_id")
    slices = col("slice", cast=False)
    is_task = pc.fill_null(pc.equal(kind, "task"), False).to_numpy(zero_copy_only=False)
    t_rows = np.flatnonzero(is_task)
    t_ids = ids.take(pa.array(t_rows)).to_pylist()
    t_cids = cids.take(pa.array(t_rows)).to_pylist()
    t_slices = slices.take(pa.array(t_rows)).to_pylist()
    if isinstance(previous, pa.Table):
        want = pa.array(t_ids, pa.string())
        task_prev = previous.filter(pc.is_in(previous.column("id"), value_set=want))
        task_prev = dict(zip(task_prev.column("id").to_pylist(), task_prev.column("split").to_pylist()))
    else:
        previous = previous or {}
        task_prev = {i: previous[i] for i in t_ids if i in previous}
    voc: dict[str, int] = {}  # every split and reason string written, as codes into one vocabulary

    def code(v: str) -> int:
        return voc.setdefault(v, len(voc))
    split_c = np.full(n, -1, np.int32)
    reason_c = np.full(n, -1, np.int32)
    out: dict[str, tuple[str, str]] = {}
    if t_ids:
        # the manifest lists bare task ids: split on those, report namespaced ids
        bare = [_source(i) for i in t_ids]
        t = assign_splits([{"id": b, "cluster_id": c, "slice": sl} for b, c, sl in zip(bare, t_cids, t_slices)],
                          targets=targets, seed=seed, manifest=manifest,
                          previous={b: task_prev[i] for i, b in zip(t_ids, bare) if i in task_prev})
        full = dict(zip(bare, t_ids))
        for r in t.to_pylist():
            out[full[r["id"]]] = (r["split"], r["reason"])
        split_c[t_rows] = [code(out[i][0]) for i in t_ids]
        reason_c[t_rows] = [code(out[i][1]) for i in t_ids]
    task_clusters: dict[str, list[str]] = defaultdict(list)
    for i, c in zip(t_ids, t_cids):
        task_clusters[c].append(i)
    # each task cluster's split and reason for its trajectories
    c_names, c_split, c_reason = [], [], []
    for c, members in task_clusters.items():
        splits = {out[m][0] for m in members}
        split = "holdout" if "holdout" in splits else (splits - {EXCLUDED} or {EXCLUDED}).pop()
        first = min(m for m in members if out[m][0] == split)
        c_names.append(c)
        c_split.append(code(split))
        c_reason.append(code(f"cluster_of_task {_source(first)}"))
    traj = ~is_task
    pos = pc.fill_null(pc.index_in(cids, value_set=pa.array(c_names, pa.string())), -1).to_numpy(zero_copy_only=False)
    in_task = traj & (pos >= 0)
    split_c[in_task] = np.asarray(c_split, np.int32)[pos[in_task]]
    reason_c[in_task] = np.asarray(c_reason, np.int32)[pos[in_task]]
    orphans = np.flatnonzero(traj & ~in_task)
    if len(orphans):
        tr, va = int(targets.get("train", 0)), int(targets.get("val", 0))
        if tr + va == 0:
            tr = 1
        scale = len(orphans) // (tr + va) + 2  # keeps the sum above n: split_targets goes proportional
        o_idx = pa.array(orphans)
        o_tbl = pa.table({"id": ids.take(o_idx), "cluster_id": cids.take(o_idx), "slice": tenant.take(o_idx)})
        if isinstance(previous, pa.Table):
            prev = previous.filter(pc.and_(pc.is_in(previous.column("id"), value_set=o_tbl.column("id").combine_chunks()),
                                           pc.is_in(previous.column("split"), value_set=pa.array(["train", "val"]))))
        else:
            prev = {i: previous[i] for i in o_tbl.column("id").to_pylist() if previous.get(i) in ("train", "val")}
        t = assign_splits(o_tbl, targets={"train": tr * scale, "val": va * scale, "holdout": 0}, seed=seed, previous=prev)
        for col, target, rename in (("split", split_c, {}), ("reason", reason_c, {"assigned": "trajectory_cluster"})):
            enc = pc.dictionary_encode(t.column(col)).combine_chunks()
            local = np.array([code(rename.get(v, v)) for v in enc.dictionary.to_pylist()], np.int32)
            target[orphans] = local[enc.indices.to_numpy(zero_copy_only=False)]
    words = pa.array(list(voc), pa.string())
    return pa.table({
        "id": ids, "kind": kind,
        "source_id": pc.replace_substring_regex(ids, pattern=f"^({TASK_PREFIX}|{TRAJ_PREFIX})", replacement="",
                                                max_replacements=1),
        "cluster_id": cids, "slice": slices.cast(pa.string()) if n else pa.array([], pa.string()),
        "split": words.take(pa.array(split_c)), "reason": words.take(pa.array(reason_c)), "tenant_id": tenant})


def split_summary_md(rows: Any) -> str:
    """Markdown table: items per slice x split (tasks), then trajectories per split. `rows`: dicts
    or a pyarrow Table (counted by group, not row by row)."""
    import pyarrow as pa

    cols = [*SPLITS, EXCLUDED]
    by = defaultdict(Counter)
    trajs = Counter()
    if isinstance(rows, pa.Table):
        counts = rows.group_by(["kind", "slice", "split"]).aggregate([([], "count_all")]).to_pylist()
    else:
        counts = [{**r, "count_all": 1} for r in rows]
    for r in counts:
        if r["kind"] == "task":
            by[r["slice"] or "(none)"][r["split"]] += r["count_all"]
        else:
            trajs[r["split"]] += r["count_all"]
    from ratchet.markdown import md_table

    total = Counter()
    for c in by.values():
        total.update(c)
    rows = [[s, *(by[s][c] for c in cols)] for s in sorted(by)]
    rows += [["**all tasks**", *(total[c] for c in cols)], ["*trajectories*", *(trajs[c] for c in cols)]]
    return md_table(["slice", *cols], rows)
