"""Dedup clusters: connected components over near-duplicate / same-code / same-repo /
same-issue edges. A cluster is the unit a split takes whole.

Rows produced (pyarrow Tables, written as-is to the warehouse):
  dedup_clusters: id (str), cluster_id (str), cluster_size (int64)
  dedup_edges:    a (str), b (str), reason (str), score (float64)     with a < b
reasons: "minhash" (estimated Jaccard of prompt text), "ast_skeleton", "ast_subtree" (see
ast_fingerprint), "same_repo", "same_issue" (score 1.0). Key edges are a star from the
smallest id of each group, so n members give n-1 edges, not n^2.
cluster_id = "dc-" + sha1(smallest member id)[:16]: stable as long as that member stays.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any, Iterable, Sequence

import numpy as np

from . import ast_fingerprint as astfp
from .minhash import DEFAULT_NUM_PERM, DEFAULT_SEED, DEFAULT_SHINGLE, lsh_pairs, signatures

EDGE_COLUMNS = ("a", "b", "reason", "score")


def rows_of(data: Any) -> list[dict]:
    """Accept a pyarrow Table, a pandas DataFrame or an iterable of dicts."""
    if hasattr(data, "to_pylist"):
        return data.to_pylist()
    if hasattr(data, "to_dict") and hasattr(data, "columns"):
        return data.to_dict("records")
    return list(data)


def column(data: Any, name: str) -> list:
    if hasattr(data, "column_names"):
        return data.column(name).to_pylist() if name in data.column_names else [None] * data.num_rows
    return [r.get(name) for r in rows_of(data)]


def cluster_id_for(smallest_member: str) -> str:
    return "dc-" + hashlib.sha1(smallest_member.encode()).hexdigest()[:16]


def key_edges(ids: Sequence[str], keys: Sequence[Any], reason: str) -> list[tuple[str, str, str, float]]:
    """Star edges joining every id that shares a non-empty key with the group's smallest id."""
    groups: dict[Any, list[str]] = defaultdict(list)
    for i, k in zip(ids, keys):
        if k is not None and k != "":
            groups[k].append(i)
    out = []
    for members in groups.values():
        if len(members) > 1:
            members.sort()
            out.extend((members[0], m, reason, 1.0) for m in members[1:] if m != members[0])
    return out


def looks_like_patch(code: str) -> bool:
    return code.startswith(("diff --git", "--- ", "Index: ")) or "\n@@ " in code or code.startswith("@@ ")


def fingerprints(codes: Iterable[str | None]) -> list[list[astfp.Fingerprint]]:
    """Fingerprints per item; identical code texts are fingerprinted once (trajectories of one
    task often carry the same final patch)."""
    cache: dict[str, list[astfp.Fingerprint]] = {}
    out = []
    for code in codes:
        if not code:
            out.append([])
            continue
        if code not in cache:
            cache[code] = astfp.fingerprint_patch(code) if looks_like_patch(code) else astfp.fingerprint_code(code)
        out.append(cache[code])
    return out


def ast_edges(
    ids: Sequence[str],
    fps: Sequence[Sequence[astfp.Fingerprint]],
    seed: int = DEFAULT_SEED,
    num_perm: int = DEFAULT_NUM_PERM,
) -> list[tuple[str, str, str, float]]:
    """Edges between items whose fingerprints collide (`ast_fingerprint.collide`). Skeletons are
    grouped exactly; shape-set Jaccard candidates come from MinHash LSH (datasketch) over the
    shape hashes at a lower threshold, then the exact Jaccard is checked."""
    out: list[tuple[str, str, str, float]] = []
    # identical fingerprints (the same code text, or copies differing only in names/literals)
    # are handled once: trajectories of one task mostly end in the same patch
    members: dict[astfp.Fingerprint, list[str]] = defaultdict(list)
    for item, fl in zip(ids, fps):
        for fp in fl:
            members[fp].append(item)
    uniq = list(members)
    by_skel: dict[tuple[str, str], list[str]] = defaultdict(list)
    for fp in uniq:
        ms = members[fp]
        if fp.kind != "tokens" and fp.size >= astfp.MIN_SKELETON_NODES:
            by_skel[(fp.kind, fp.skeleton)].extend(ms)
        elif fp.subtrees and len(ms) > 1:  # identical small fingerprints: shape Jaccard 1.0
            ms = sorted(set(ms))
            out.extend((ms[0], m, "ast_subtree", 1.0) for m in ms[1:])
    for group in by_skel.values():
        ms = sorted(set(group))
        out.extend((ms[0], m, "ast_skeleton", 1.0) for m in ms[1:])
    entries = [fp for fp in uniq if fp.subtrees]
    if len(entries) > 1:
        docs = [" ".join(sorted(fp.subtrees)) for fp in entries]
        sigs = signatures(docs, num_perm=num_perm, seed=seed, k=1)
        cand_threshold = max(0.05, astfp.SUBTREE_JACCARD - 0.15)  # recall first; verified below
        seen = set()
        for a, b, _ in lsh_pairs([f"{j:09d}" for j in range(len(entries))], sigs, threshold=cand_threshold, seed=seed,
                                 backend="memory"):  # one entry per distinct code shape: small
            fa, fb = entries[int(a)], entries[int(b)]
            hit = astfp.collide(fa, fb)
            if hit and hit[0] == "subtree":
                x, y = min(members[fa]), min(members[fb])
                x, y = min(x, y), max(x, y)
                if x != y and (x, y) not in seen:
                    seen.add((x, y))
                    out.append((x, y, "ast_subtree", round(hit[1], 6)))
    return out


def components(ids: Sequence[str], edges: Iterable[tuple]) -> tuple[np.ndarray, list[str]]:
    """Connected components (scipy.sparse.csgraph) -> (component index per id, cluster ids)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    index = {x: i for i, x in enumerate(ids)}
    if len(index) != len(ids):
        raise ValueError("duplicate ids given to components()")
    src, dst = [], []
    for e in edges:
        if e[0] in index and e[1] in index:
            src.append(index[e[0]])
            dst.append(index[e[1]])
    n = len(ids)
    g = coo_matrix((np.ones(len(src), dtype=np.int8), (np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))), shape=(n, n))
    ncomp, labels = connected_components(g, directed=False)
    smallest: list[str | None] = [None] * ncomp
    for x, c in zip(ids, labels.tolist()):
        if smallest[c] is None or x < smallest[c]:
            smallest[c] = x
    return labels, [cluster_id_for(s) for s in smallest]  # type: ignore[arg-type]


def build_clusters(
    items: Any,
    id_col: str = "record_id",
    text_col: str | None = "prompt_text",
    code_cols: Sequence[str] = ("patch",),
    key_cols: dict[str, str] | None = None,
    threshold: float = 0.8,
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    k: int = DEFAULT_SHINGLE,
    spanning: bool = True,
    signatures_out: dict | None = None,
    lsh_backend: str = "duckdb",
):
    """Cluster items (trajectories, or tasks with id_col="task_id", text_col="issue",
    code_cols=("solution",)). key_cols maps column -> edge reason, default
    {"repo": "same_repo", "issue_id": "same_issue"}. Returns (dedup_clusters, dedup_edges)
    as pyarrow Tables. `spanning=True` keeps only the MinHash pairs needed for connectivity
    (see minhash.lsh_pairs); set False to list every near-duplicate pair.
    If `signatures_out` is a dict, the computed signatures are stored under "sigs".
    `lsh_backend` is minhash.lsh_pairs's backend ("duckdb", out of core, or "memory")."""
    import pyarrow as pa

    ids = [str(x) for x in column(items, id_col)]
    edges: list[tuple[str, str, str, float]] = []
    if text_col:
        texts = column(items, text_col)
        sigs = signatures(texts, num_perm=num_perm, seed=seed, k=k)
        if signatures_out is not None:
            signatures_out["sigs"] = sigs
        # texts without a shingle all carry the same "empty" signature; they are not duplicates
        has_text = np.asarray([i for i, t in enumerate(texts) if t and t.strip()], dtype=np.int64)
        sub_ids = [ids[i] for i in has_text]
        edges.extend((a, b, "minhash", s) for a, b, s in lsh_pairs(sub_ids, sigs[has_text], threshold, seed,
                                                                         spanning=spanning, backend=lsh_backend))
    for col in code_cols:
        edges.extend(ast_edges(ids, fingerprints(column(items, col)), seed=seed, num_perm=num_perm))
    for col, reason in (key_cols if key_cols is not None else {"repo": "same_repo", "issue_id": "same_issue"}).items():
        edges.extend(key_edges(ids, column(items, col), reason))
    labels, cids = components(ids, edges)
    sizes = np.bincount(labels, minlength=len(cids)) if len(labels) else np.zeros(0, int)
    clusters = pa.table({
        "id": pa.array(ids, pa.string()),
        "cluster_id": pa.array([cids[c] for c in labels.tolist()], pa.string()),
        "cluster_size": pa.array(sizes[labels] if len(labels) else [], pa.int64()),
    })
    e = list(zip(*edges)) if edges else [[], [], [], []]
    edge_tbl = pa.table({
        "a": pa.array(e[0], pa.string()), "b": pa.array(e[1], pa.string()),
        "reason": pa.array(e[2], pa.string()), "score": pa.array(e[3], pa.float64()),
    })
    return clusters, edge_tbl
