"""Contamination gate: recompute, from the raw items (not from the cluster ids the split was
built on), every way two splits can overlap, and pass only at exactly 0.0%.

Kinds: exact_id (one id in two splits), repo, issue (a key value in two splits), minhash
(estimated prompt Jaccard >= threshold across splits), ast (skeleton or shape-set collision
across splits). Items `excluded_contaminated` are in no split.

Report (dict): passed (bool), overlap_fraction (float: items in any cross-split overlap / items
in splits), n_items, n_overlapping_items, threshold, counts {kind: pairs}, examples {kind:
[pair, ...]} with pair = {a, b, split_a, split_b, score} (JSON-serialisable), and pairs: a
pyarrow Table (kind, a, b, split_a, split_b, score) of every pair, split_a before split_b in
train, val, holdout order, sorted. `report_rows` gives them as dicts.

Everything runs on columns: items are read once in batches (text is never whole in memory), an
item is an int8 split label, and MinHash and AST overlaps come from the out-of-core LSH listing
only cross-split pairs (`lsh_index.candidate_pairs_ooc(labels=...)`). The row-by-row version
(a dict per item, datasketch's in-memory index) is the memory limit of the governance group at
millions of trajectories.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .clusters import _ranks, ast_pairs, read_items, rows_of
from .minhash import DEFAULT_NUM_PERM, DEFAULT_SEED, DEFAULT_SHINGLE

KINDS = ("exact_id", "repo", "issue", "minhash", "ast")
SPLIT_NAMES = ("train", "val", "holdout")
PAIR_COLUMNS = ("kind", "a", "b", "split_a", "split_b", "score")


def _assignment_table(assignments: Any):
    """(id, split) as a pyarrow Table of strings, from a Table, a DataFrame or dict rows."""
    import pyarrow as pa

    if not isinstance(assignments, pa.Table):
        rows = rows_of(assignments)
        assignments = pa.table({"id": [r["id"] for r in rows], "split": [r["split"] for r in rows]})
    return pa.table({c: assignments.column(c).cast(pa.string()) for c in ("id", "split")})


def _splits(assignments: Any):
    """(ids in a split, each one's first split code, exact_id pairs (id, code, second code)) from
    the assignment rows: an id in several splits is reported with its first two."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = _assignment_table(assignments)
    code = pc.index_in(t.column("split"), value_set=pa.array(SPLIT_NAMES))
    t = pa.table({"id": t.column("id"), "code": code}).filter(pc.is_valid(code))
    t = t.group_by(["id", "code"], use_threads=False).aggregate([])  # distinct (id, split)
    t = t.take(pc.sort_indices(t, sort_keys=[("id", "ascending"), ("code", "ascending")]))
    ids, codes = t.column("id").combine_chunks(), t.column("code").to_numpy().astype(np.int8)
    head = np.ones(len(ids), dtype=bool)
    if len(ids) > 1:
        head[1:] = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)
    first = np.flatnonzero(head)
    second = first + 1
    multi = second[(second < len(ids)) & ~head[np.minimum(second, len(ids) - 1)]]
    exact = (ids.take(pa.array(multi)), codes[multi - 1], codes[multi])
    return ids.take(pa.array(first)), codes[first], exact


def _key_cross(codes: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows (x, y) of pairs sharing a key value in different splits: per value, the first row of
    each split, and a star from the first of those to the others (codes < 0: no value)."""
    rows = np.flatnonzero(codes >= 0)
    if not len(rows):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = rows[np.lexsort((rows, labels[rows], codes[rows]))]
    c, lab = codes[order], labels[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (c[1:] != c[:-1]) | (lab[1:] != lab[:-1])
    reps = order[first]  # the first row of each (value, split)
    reps = reps[np.lexsort((reps, codes[reps]))]  # by value, then first seen
    c = codes[reps]
    head = np.ones(len(reps), dtype=bool)
    head[1:] = c[1:] != c[:-1]
    root = reps[np.flatnonzero(head)][np.cumsum(head) - 1]
    return root[~head], reps[~head]


def contamination_report(
    assignments: Any,
    items: Any,
    id_col: str = "id",
    text_col: str | None = "prompt_text",
    code_cols: Sequence[str] = ("patch",),
    key_cols: dict[str, str] | None = None,
    threshold: float = 0.8,
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    k: int = DEFAULT_SHINGLE,
    max_examples: int = 5,
) -> dict:
    """`assignments`: (id, split) rows or a Table (split_assignments). `items`: anything
    `clusters.read_items` reads (a Table, a Parquet path, a RecordBatchReader, dict rows) with
    `id_col` and the text / code / key columns. key_cols maps column -> kind (default repo,
    issue_id); a key kind may be "exact_id" (a trajectory's task in another split)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .lsh_index import candidate_pairs_ooc

    key_cols = key_cols if key_cols is not None else {"repo": "repo", "issue_id": "issue"}
    split_ids, split_code, (ex_ids, ex_a, ex_b) = _splits(assignments)
    kinds = list(dict.fromkeys([*KINDS, *key_cols.values()]))
    parts: list[tuple[str, Any, Any, np.ndarray, np.ndarray, np.ndarray | None]] = [
        ("exact_id", ex_ids, ex_ids, ex_a, ex_b, None)]

    # every item is read (signatures included: items outside the splits are few) and labelled
    # with one lookup afterwards: a lookup per batch rebuilt the hash set of all split ids each
    # time (10M ids x 600 batches)
    data = read_items(items, id_col, text_col, code_cols, key_cols, num_perm=num_perm, seed=seed, k=k)
    ids = data.ids
    at = pc.index_in(ids, value_set=split_ids)
    labels = np.full(len(ids), -1, np.int8)
    found = np.flatnonzero(pc.is_valid(at).to_numpy(zero_copy_only=False))
    labels[found] = split_code[pc.take(at, pa.array(found)).to_numpy().astype(np.int64)]
    del at
    outside = labels < 0  # in no split: joins nothing
    for col in data.codes:
        data.codes[col][outside] = -1
    for col in data.keys:
        data.keys[col][outside] = -1

    def add(kind: str, x: np.ndarray, y: np.ndarray, score: np.ndarray | None):
        x, y = np.asarray(x, np.int64), np.asarray(y, np.int64)
        keep = labels[x] != labels[y]
        x, y = x[keep], y[keep]
        swap = labels[x] > labels[y]  # split_a is the earlier split
        x, y = np.where(swap, y, x), np.where(swap, x, y)
        parts.append((kind, ids.take(pa.array(x)), ids.take(pa.array(y)), labels[x], labels[y],
                      None if score is None else np.asarray(score, np.float64)[keep]))

    for col, kind in key_cols.items():
        add(kind, *_key_cross(data.keys.pop(col), labels), None)
    rows = data.has_text[labels[data.has_text] >= 0]
    if text_col and len(rows) > 1:
        got = list(candidate_pairs_ooc(data.sigs, threshold, rows=None if len(rows) == len(ids) else rows,
                                       release=data.release, labels=labels))
        if got:
            add("minhash", *(np.concatenate([g[j] for g in got]) for j in range(3)))
    data.sigs = data.release = None
    if code_cols:
        rank, _ = _ranks(ids)
        order = np.empty(len(rank), np.int64)
        order[rank] = np.arange(len(rank))  # rank -> row
        by_rank = labels[order]
        for col in code_cols:
            for a, b, _reason, score in ast_pairs(rank, data.codes.pop(col), data.code_fps.pop(col), seed=seed,
                                                   num_perm=num_perm, labels=by_rank):
                add("ast", order[a], order[b], score)
    del data

    names = pa.array(SPLIT_NAMES)
    tables = [pa.table({
        "kind": pa.repeat(pa.scalar(kind), len(a)), "a": a.cast(pa.string()), "b": b.cast(pa.string()),
        "split_a": names.take(pa.array(la.astype(np.int64))), "split_b": names.take(pa.array(lb.astype(np.int64))),
        "score": pa.repeat(pa.scalar(1.0), len(a)) if s is None else pa.array(s, pa.float64()),
        "_k": pa.repeat(pa.scalar(kinds.index(kind), pa.int8()), len(a)),
        "_sa": pa.array(la.astype(np.int8)), "_sb": pa.array(lb.astype(np.int8))})
        for kind, a, b, la, lb, s in parts]
    pairs = pa.concat_tables(tables)
    pairs = pairs.take(pc.sort_indices(pairs, sort_keys=[(c, "ascending") for c in ("_k", "_sa", "_sb", "a", "b")]))
    pairs = pairs.select(list(PAIR_COLUMNS))
    involved = pc.count_distinct(pa.chunked_array(pairs.column("a").chunks + pairs.column("b").chunks,
                                                  pa.string())).as_py() if pairs.num_rows else 0
    n = len(split_ids)
    frac = involved / n if n else 0.0
    counts = {kind: 0 for kind in kinds}
    for r in pc.value_counts(pairs.column("kind")).to_pylist():
        counts[r["values"]] = r["counts"]
    examples = {kind: [] for kind in kinds}
    for kind in kinds:
        if counts[kind]:
            sub = pairs.filter(pc.equal(pairs.column("kind"), kind)).slice(0, max_examples)
            examples[kind] = sub.drop_columns(["kind"]).to_pylist()
    return {
        "passed": involved == 0,
        "overlap_fraction": frac,
        "n_items": n,
        "n_overlapping_items": involved,
        "threshold": threshold,
        "counts": counts,
        "examples": examples,
        "pairs": pairs,
    }


def report_rows(report: dict, kind: str | None = None) -> list[dict]:
    """One dict per overlapping pair (kind, a, b, split_a, split_b, score); only `kind`'s if given."""
    import pyarrow.compute as pc

    pairs = report["pairs"]
    return (pairs if kind is None else pairs.filter(pc.equal(pairs.column("kind"), kind))).to_pylist()


def report_tables(report: dict, checked_at, run_id: str | None) -> dict:
    """The rows one check run appends: `contamination_report` (the verdict) and
    `contamination_pairs` (a Table: one row per pair, stamped)."""
    import pyarrow as pa

    from ratchet.tables import TS

    pairs = report["pairs"]
    stamp = {"checked_at": checked_at, "dagster_run_id": run_id}
    return {"contamination_report": [{**stamp, **{k: report[k] for k in (
                "passed", "overlap_fraction", "n_items", "n_overlapping_items", "threshold", "counts", "examples")}}],
            "contamination_pairs": pairs.append_column("checked_at", pa.repeat(pa.scalar(checked_at, TS), pairs.num_rows))
                                        .append_column("dagster_run_id", pa.repeat(pa.scalar(run_id, pa.string()), pairs.num_rows))}
