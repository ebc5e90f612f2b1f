"""Dedup clusters: connected components over near-duplicate / same-code / same-repo /
same-issue edges. A cluster is the unit a split takes whole.

Rows produced (pyarrow Tables, written as-is to the warehouse):
  dedup_clusters: id (str), cluster_id (str), cluster_size (int64)
  dedup_edges:    a (str), b (str), reason (str), score (float64)     with a < b
                  (a, b and reason dictionary-encoded: they read as strings)
reasons: "minhash" (estimated Jaccard of prompt text), "ast_skeleton", "ast_subtree" (see
ast_fingerprint), "same_repo", "same_issue" (score 1.0). Key edges are a star from the
smallest id of each group, so n members give n-1 edges, not n^2.
cluster_id = "dc-" + sha1(smallest member id)[:16]: stable as long as that member stays.
"""
from __future__ import annotations

import gc
import hashlib
import os
import tempfile
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from . import ast_fingerprint as astfp
from .minhash import DEFAULT_NUM_PERM, DEFAULT_SEED, DEFAULT_SHINGLE, lsh_pairs, signatures


def rows_of(data: Any) -> list[dict]:
    """Accept a pyarrow Table, a pandas DataFrame or an iterable of dicts."""
    if hasattr(data, "to_pylist"):
        return data.to_pylist()
    if hasattr(data, "to_dict") and hasattr(data, "columns"):
        return data.to_dict("records")
    return list(data)


def cluster_id_for(smallest_member: str) -> str:
    return "dc-" + hashlib.sha1(smallest_member.encode()).hexdigest()[:16]


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


class Shape(NamedTuple):
    """A fingerprint as build_clusters keeps it: the subtree hashes (16 hex digits each) as sorted
    uint64 bytes. A frozenset of hex strings cost ~10 KB per distinct patch (2 GB at 10M
    trajectories over 200k tasks); this is ~0.4 KB, and `fingerprint` gives back the same set."""
    name: str  # part of a Fingerprint's equality, so kept: the same fingerprints group the same way
    kind: str
    skeleton: str
    size: int
    subtrees: bytes

    @classmethod
    def of(cls, fp: astfp.Fingerprint) -> "Shape":
        return cls(fp.name, fp.kind, fp.skeleton, fp.size, np.array(sorted(int(h, 16) for h in fp.subtrees), dtype=np.uint64).tobytes())

    def hashes(self) -> list[str]:
        return [format(v, "016x") for v in np.frombuffer(self.subtrees, dtype=np.uint64).tolist()]

    def fingerprint(self) -> astfp.Fingerprint:
        return astfp.Fingerprint(name=self.name, kind=self.kind, skeleton=self.skeleton, subtrees=frozenset(self.hashes()),
                                 size=self.size)


def ast_edges(
    ids: Sequence[str],
    fps: Sequence[Sequence[astfp.Fingerprint]],
    seed: int = DEFAULT_SEED,
    num_perm: int = DEFAULT_NUM_PERM,
) -> list[tuple[str, str, str, float]]:
    """Edges between items whose fingerprints collide (`ast_fingerprint.collide`), a < b. See
    `ast_pairs`; this takes id strings and one fingerprint list per item."""
    ids = [str(i) for i in ids]
    order = sorted(range(len(ids)), key=ids.__getitem__)
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids))
    lists = [[Shape.of(fp) for fp in fl] for fl in fps]
    codes = np.array([i if fl else -1 for i, fl in enumerate(lists)], dtype=np.int64)
    return [(ids[order[x]], ids[order[y]], reason, float(s))
            for a, b, reason, score in ast_pairs(rank, codes, lists, seed=seed, num_perm=num_perm)
            for x, y, s in zip(a.tolist(), b.tolist(), score.tolist())]


def ast_pairs(
    rank: np.ndarray,
    code: np.ndarray,
    code_fps: Sequence[Sequence[Shape]],
    seed: int = DEFAULT_SEED,
    num_perm: int = DEFAULT_NUM_PERM,
    spanning: bool = False,
    labels: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray, str, np.ndarray]]:
    """AST edges over integers: item i has rank `rank[i]` (ids' sort order) and code `code[i]`
    (an index into `code_fps`, the fingerprints (`Shape`) of each distinct code text; -1: none). Returns
    (a, b, reason, score) pieces, a and b ranks with a < b, one reason a piece.

    Skeletons are grouped exactly (a star from each group's smallest item, "ast_skeleton");
    identical small fingerprints join the same way ("ast_subtree", 1.0); shape-set Jaccard
    candidates among distinct fingerprints come from MinHash LSH at a lower threshold and are
    checked exactly (datasketch's index; with `spanning`, the out-of-core LSH, keeping only the
    subtree edges that join components). Items are handled as numpy arrays (one row per item and
    fingerprint), never a Python object per item: at 10M items Python lists of ids and edge
    tuples took ~280 MB per million.

    `labels` (indexed by rank; the contamination check's splits) keeps only the subtree pairs
    whose two items carry different labels (`lsh_index.mixed_component_pairs`):
    a subtree edge joins the smallest items of two fingerprints, so that is the pair it is
    judged by. The skeleton and identical-subtree stars are returned whole (the caller filters)."""
    fp_ids: dict[Shape, int] = {}
    ptr = np.zeros(len(code_fps) + 1, dtype=np.int64)
    flat: list[int] = []
    for j, fl in enumerate(code_fps):
        flat.extend(fp_ids.setdefault(fp, len(fp_ids)) for fp in fl)
        ptr[j + 1] = len(flat)
    uniq = list(fp_ids)  # first-seen order
    flat_a = np.asarray(flat, dtype=np.int64)
    rows = np.flatnonzero(code >= 0)
    lens = ptr[code[rows] + 1] - ptr[code[rows]]
    item_rank = np.repeat(rank[rows], lens)  # one row per (item, fingerprint)
    first = np.repeat(ptr[code[rows]], lens)
    del rows
    item_fp = flat_a[first + (np.arange(len(item_rank)) - np.repeat(np.cumsum(lens) - lens, lens))]
    del first, lens, flat_a
    skel_ids: dict[tuple[str, str], int] = {}
    skel = np.array([skel_ids.setdefault((fp.kind, fp.skeleton), len(skel_ids))
                     if fp.kind != "tokens" and fp.size >= astfp.MIN_SKELETON_NODES else -1 for fp in uniq], dtype=np.int64)
    small = np.array([j if skel[j] < 0 and fp.subtrees else -1 for j, fp in enumerate(uniq)], dtype=np.int64)
    pieces = [(a, b, reason, np.ones(len(a))) for a, b, reason in
              [(*_star(skel[item_fp] if len(uniq) else item_fp, item_rank), "ast_skeleton"),
               (*_star(small[item_fp] if len(uniq) else item_fp, item_rank), "ast_subtree")]]
    low = np.full(len(uniq), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(low, item_fp, item_rank)  # each fingerprint's smallest item
    # fingerprints no item carries (their code's items were left out: code -1) index nothing
    entries = [j for j, fp in enumerate(uniq) if fp.subtrees and low[j] < np.iinfo(np.int64).max]
    if len(entries) > 1:
        docs = [" ".join(uniq[j].hashes()) for j in entries]  # sorted: hex of equal length sorts as the number
        sigs = signatures(docs, num_perm=num_perm, seed=seed, k=1)
        cand_threshold = max(0.05, astfp.SUBTREE_JACCARD - 0.15)  # recall first; verified below
        seen: dict[tuple[int, int], float] = {}

        def subtree_score(x: int, y: int) -> float | None:
            """The shape-set Jaccard of entries x and y when they collide by shared subtrees."""
            hit = astfp.collide(uniq[entries[x]].fingerprint(), uniq[entries[y]].fingerprint())
            return round(hit[1], 6) if hit and hit[0] == "subtree" else None

        def check(a: np.ndarray, b: np.ndarray, _est: np.ndarray):
            scores = [subtree_score(x, y) for x, y in zip(a.tolist(), b.tolist())]
            return np.array([v is not None for v in scores], bool), np.array([v or 0.0 for v in scores])

        # One entry per distinct code shape (200k at 10M trajectories). With `spanning` (clusters),
        # through the out-of-core LSH with the collision as its check, made only where it can still
        # join two groups of shapes: datasketch's in-memory index of 200k shapes held ~2 GB at 10M.
        # With `labels` (the contamination check), only cross-label pairs, searched for within the
        # components (of a spanning pass) that hold two labels.
        # Every pair (`ast_edges`) stays on datasketch's index: the out-of-core all-pairs join at
        # this low threshold ran out of DuckDB's 256 MB at 100k random functions. Entries joined
        # through one item need no edge (the item joins them).
        if labels is not None:
            from .lsh_index import mixed_component_pairs

            found = ((ea, eb, v) for a, b, score in mixed_component_pairs(sigs, cand_threshold, np.asarray(labels)[low[entries]],
                                                                          check=check)
                     for ea, eb, v in zip(a.tolist(), b.tolist(), score.tolist()))
        elif spanning:
            from .lsh_index import candidate_pairs_ooc

            found = ((ea, eb, v) for a, b, score in candidate_pairs_ooc(sigs, cand_threshold, spanning=True, check=check)
                     for ea, eb, v in zip(a.tolist(), b.tolist(), score.tolist()))
        else:
            found = ((ea, eb, subtree_score(ea, eb)) for ea, eb in (
                (int(a), int(b)) for a, b, _ in lsh_pairs([f"{j:09d}" for j in range(len(entries))], sigs,
                                                          threshold=cand_threshold, seed=seed, backend="memory")))
        for ea, eb, v in found:
            if v is None:
                continue
            x, y = sorted((int(low[entries[ea]]), int(low[entries[eb]])))
            if x != y and (x, y) not in seen:
                seen[(x, y)] = v
        # datasketch's index is a reference cycle: ~0.2 GB per 60k shapes until collected
        if not spanning and labels is None:  # pragma: no mutate (memory only: the pairs are already found)
            gc.collect()
        if seen:
            ab = np.array(list(seen), dtype=np.int64)
            pieces.append((ab[:, 0].copy(), ab[:, 1].copy(), "ast_subtree", np.fromiter(seen.values(), np.float64, len(seen))))
    return pieces


def _star(group: np.ndarray, item: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Star edges (smallest item of each group, every other item) over (group, item) rows;
    group < 0 joins nothing; an item listed twice in a group counts once."""
    keep = group >= 0
    g, it = group[keep], item[keep]
    if not len(g):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((it, g))
    g, it = g[order], it[order]
    new = np.ones(len(g), dtype=bool)
    new[1:] = (g[1:] != g[:-1]) | (it[1:] != it[:-1])
    g, it = g[new], it[new]
    head = np.ones(len(g), dtype=bool)
    head[1:] = g[1:] != g[:-1]
    root = it[np.flatnonzero(head)][np.cumsum(head) - 1]
    return root[~head], it[~head]


_BATCH_ROWS = 1 << 14  # pragma: no mutate (a batch size: any value gives the same clusters)
# signatures at least this large are memory-mapped from their temp file, not read into memory
_SIG_MMAP_BYTES = 1 << 30  # pragma: no mutate (memory or a mapped file: the same signatures)


def _batches(data: Any, columns: Sequence[str]):
    """Iterator of (rows, {column: list}) over `data` read in batches of at most
    _BATCH_ROWS rows: a pyarrow Table, RecordBatchReader or iterable of RecordBatches, a Parquet
    file or folder path, a pandas DataFrame or an iterable of dicts. Only `columns` are read; a
    missing column reads as None. Streaming inputs never hold more than one batch of text."""
    import pyarrow as pa

    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet")) \
            if os.path.isdir(path) else [path]
        if not files:
            raise ValueError(f"no Parquet files in {path}")
        return _parquet_batches(files, columns)
    if isinstance(data, pa.Table):
        have = [c for c in columns if c in data.column_names]
        return _arrow_batches(data.select(have).to_batches(max_chunksize=_BATCH_ROWS), columns)
    if isinstance(data, pa.RecordBatchReader):
        return _arrow_batches(data, columns)
    if hasattr(data, "to_dict") and hasattr(data, "columns"):
        return _row_batches(data.to_dict("records"), columns)
    if not isinstance(data, Sequence):   # a generator, a dict's values: read once, indexed below
        data = list(data)
    if data and isinstance(data[0], pa.RecordBatch):
        return _arrow_batches(data, columns)
    return _row_batches(data, columns)


def _parquet_batches(files, columns):
    import pyarrow.parquet as pq

    for f in files:
        pf = pq.ParquetFile(f)
        have = [c for c in columns if c in pf.schema_arrow.names]
        # one row group at a time: a dataset scanner reads ahead and iter_batches keeps what it
        # has read until the file is done (measured: both hold most of the text column)
        for g in range(pf.metadata.num_row_groups):
            yield from _arrow_batches(pf.read_row_group(g, columns=have, use_threads=False).to_batches(), columns)


def _arrow_batches(batches, columns):
    for b in batches:
        names = b.schema.names
        for i0 in range(0, b.num_rows, _BATCH_ROWS):
            part = b.slice(i0, _BATCH_ROWS)
            yield part.num_rows, {c: part.column(names.index(c)).to_pylist() if c in names else [None] * part.num_rows
                                  for c in columns}


def _row_batches(rows, columns):
    for i0 in range(0, len(rows), _BATCH_ROWS):
        part = rows[i0 : i0 + _BATCH_ROWS]
        yield len(part), {c: [r.get(c) for r in part] for c in columns}


def _key_pairs(rank: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Key edges (same repo, same issue) on integers: star edges from the smallest-ranked row of
    each key group to the others (codes < 0 join nothing), groups in first-seen order, members by rank."""
    rows = np.flatnonzero(codes >= 0)
    if not len(rows):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = rows[np.lexsort((rank[rows], codes[rows]))]
    c = codes[order]
    head = np.ones(len(order), dtype=bool)
    head[1:] = c[1:] != c[:-1]
    first = order[np.flatnonzero(head)]
    root = first[np.cumsum(head) - 1]
    return rank[root[~head]], rank[order[~head]]


class ItemColumns:
    """What `read_items` keeps of each item read: its id (a pyarrow string array), its MinHash signature (`sigs`, n x num_perm; memory-mapped from
    1 GiB on, with `release` to drop its pages), which rows have text (`has_text`, row indices),
    per code column an index into that column's distinct fingerprints (`codes`, -1: no code;
    `code_fps`, a tuple of `Shape` per distinct text) and per key column the key's code in
    first-seen order (`keys`, -1: empty)."""

    def __init__(self, ids, sigs, release, has_text, codes, code_fps, keys):
        self.ids, self.sigs, self.release, self.has_text = ids, sigs, release, has_text
        self.codes, self.code_fps, self.keys = codes, code_fps, keys


def read_items(
    items: Any,
    id_col: str,
    text_col: str | None,
    code_cols: Sequence[str],
    key_cols: Iterable[str],
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    k: int = DEFAULT_SHINGLE,
) -> ItemColumns:
    """Read `items` once in batches (see `_batches`) into `ItemColumns`: past the batch being
    read only ids, signatures (one numpy matrix), interned keys and fingerprints are kept, so
    text never has to be in memory whole."""
    import pyarrow as pa

    key_cols = list(key_cols)
    batches = _batches(items, [id_col, *([text_col] if text_col else []), *code_cols, *key_cols])
    id_parts: list[pa.Array] = []
    # signatures go to a temp file batch by batch and are read back as one matrix: collecting
    # the parts and stacking them would hold every signature twice (+512 MB at 1M rows)
    tmp = os.environ.get("RATCHET_DEDUP_TMP") or None
    if tmp:
        os.makedirs(tmp, exist_ok=True)
    sig_file = tempfile.TemporaryFile(dir=tmp) if text_col else None
    sig_dtype = None
    has_text_parts: list[np.ndarray] = []
    # code texts are kept as a 16-byte digest -> index into their fingerprints (one task's
    # trajectories mostly carry the same final patch: each distinct text is fingerprinted once)
    code_index: dict[str, dict[bytes, int]] = {c: {} for c in code_cols}
    code_fps: dict[str, list] = {c: [] for c in code_cols}
    code_parts: dict[str, list[np.ndarray]] = {c: [] for c in code_cols}
    key_codes: dict[str, dict[Any, int]] = {c: {} for c in key_cols}
    key_parts: dict[str, list[np.ndarray]] = {c: [] for c in key_cols}
    for m, cols in batches:
        id_parts.append(pa.array([str(x) for x in cols[id_col]], pa.string()))
        if text_col:
            texts = cols[text_col]
            part = signatures(texts, num_perm=num_perm, seed=seed, k=k)
            sig_dtype = part.dtype
            sig_file.write(part.tobytes())
            del part
            has_text_parts.append(np.fromiter((bool(t and t.strip()) for t in texts), dtype=bool, count=m))
        for c in code_cols:
            index, known = code_index[c], code_fps[c]
            part = np.full(m, -1, dtype=np.int32)
            for j, code in enumerate(cols[c]):
                if not code:
                    continue
                key = hashlib.blake2b(code.encode("utf-8", "surrogatepass"), digest_size=16).digest()
                at = index.get(key)
                if at is None:
                    at = index[key] = len(known)
                    known.append(tuple(Shape.of(fp) for fp in (
                        astfp.fingerprint_patch(code) if looks_like_patch(code) else astfp.fingerprint_code(code))))
                part[j] = at
            code_parts[c].append(part)
        for c in key_cols:
            codes = key_codes[c]  # first-seen order, as key_edges groups
            key_parts[c].append(np.fromiter(
                (-1 if v is None or v == "" else codes.setdefault(v, len(codes)) for v in cols[c]), dtype=np.int32, count=m))
        del cols
    del code_index, key_codes
    ids = pa.concat_arrays(id_parts) if id_parts else pa.array([], pa.string())
    del id_parts
    n = len(ids)
    sigs = release = None
    if text_col:
        dtype = np.dtype(sig_dtype or np.uint32)
        sig_file.flush()
        if n * num_perm * dtype.itemsize >= _SIG_MMAP_BYTES:
            # memory-mapped; the LSH step drops the pages it has read from this process
            # after each chunk (they stay in the page cache / on disk)
            import mmap

            mm = mmap.mmap(sig_file.fileno(), 0, access=mmap.ACCESS_READ)
            sigs = np.frombuffer(mm, dtype=dtype).reshape(n, num_perm)

            def release(offset: int = 0, length: int | None = None):
                start = offset - offset % mmap.PAGESIZE  # madvise wants a page-aligned start
                end = len(mm) if length is None else min(len(mm), offset + length)
                if end > start:
                    mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        else:
            sig_file.seek(0)
            sigs = np.fromfile(sig_file, dtype=dtype).reshape(n, num_perm)
        sig_file.close()  # a mapping keeps the (unlinked) file alive
    # texts without a shingle all carry the same "empty" signature; they are not duplicates
    has_text = np.flatnonzero(np.concatenate(has_text_parts)) if has_text_parts else np.zeros(0, np.int64)

    def joined(parts: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    return ItemColumns(
        ids, sigs, release, has_text,
        {c: joined(code_parts.pop(c), np.int32) for c in code_cols}, code_fps,
        {c: joined(key_parts.pop(c), np.int32) for c in key_cols})


def _ranks(ids):
    """(rank, sorted ids): rank = each row's position in id order. Integers ordered like the ids,
    so the smallest id of a group, "a < b" and every ordering are integer comparisons (UTF-8 byte
    order = str order); int32 below 2^31 rows (at 10M rows every edge list is over ranks)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(ids)
    idx = np.int32 if n < 2**31 else np.int64
    order = pc.sort_indices(ids).to_numpy().astype(idx)
    rank = np.empty(n, dtype=idx)
    rank[order] = np.arange(n, dtype=idx)
    return rank, ids.take(pa.array(order))


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
    `lsh_backend` is minhash.lsh_pairs's backend ("duckdb", out of core, or "memory").
    `items` may be a pyarrow Table, a RecordBatchReader (e.g. DuckDB's `to_arrow_reader`), a
    Parquet path, a DataFrame or dicts: it is read once in batches, and past the batch being
    read only ids, signatures (one numpy matrix), interned keys and fingerprints are kept, so
    text never has to be in memory whole."""
    import pyarrow as pa
    import pyarrow.compute as pc

    key_cols = key_cols if key_cols is not None else {"repo": "same_repo", "issue_id": "same_issue"}
    data = read_items(items, id_col, text_col, code_cols, key_cols, num_perm=num_perm, seed=seed, k=k)
    ids = data.ids
    n = len(ids)
    if pc.count_distinct(ids).as_py() != n:
        raise ValueError(f"duplicate ids in column {id_col!r}: each item needs its own id")
    rank, sorted_ids = _ranks(ids)
    idx = rank.dtype.type
    del ids
    pieces: list[tuple] = []  # (rank a, rank b, reason, score or None for 1.0)
    if text_col:
        sigs, release, has_text = data.sigs, data.release, data.has_text
        data.sigs = None
        if signatures_out is not None:
            signatures_out["sigs"] = sigs
        if lsh_backend == "duckdb":
            from .lsh_index import candidate_pairs_ooc

            got = [(np.minimum(rank[a], rank[b]), np.maximum(rank[a], rank[b]), s.astype(np.float64))
                   for a, b, s in candidate_pairs_ooc(sigs, threshold, spanning,
                                                      rows=None if len(has_text) == n else has_text, release=release)]
            del sigs
            if got:
                pieces.append((*(np.concatenate([g[k] for g in got]) for k in range(2)), "minhash",
                               np.concatenate([g[2] for g in got])))
            del got
        else:
            sub_ids = [int(r) for r in rank[has_text]]
            pairs = lsh_pairs(sub_ids, sigs[has_text], threshold, seed, spanning=spanning, backend=lsh_backend)
            del sigs
            if pairs:
                a, b, s = (np.asarray(x) for x in zip(*pairs))
                pieces.append((a.astype(np.int64), b.astype(np.int64), "minhash", s.astype(np.float64)))
    for c in code_cols:
        pieces.extend(ast_pairs(rank, data.codes.pop(c), data.code_fps.pop(c), seed=seed, num_perm=num_perm, spanning=spanning))
    for c, reason in key_cols.items():
        a, b = _key_pairs(rank, data.keys.pop(c))
        pieces.append((a, b, reason, None))
    del data
    labels = _component_labels(n, [(p[0], p[1]) for p in pieces])  # over ranks
    gc.collect()  # scipy's graph copies are garbage now: give their pages back before the tables
    ncomp = int(labels.max()) + 1 if n else 0
    smallest = np.full(ncomp, n, dtype=np.int64)
    np.minimum.at(smallest, labels, np.arange(n, dtype=np.int64))
    cids = pa.array([cluster_id_for(x) for x in sorted_ids.take(pa.array(smallest)).to_pylist()], pa.string())
    sizes = np.bincount(labels, minlength=ncomp)
    lab = labels[rank]  # back to input order
    clusters = pa.table({
        "id": sorted_ids.take(pa.array(rank)),
        "cluster_id": cids.take(pa.array(lab)),
        "cluster_size": pa.array(sizes[lab].astype(np.int64), pa.int64()),
    })
    del labels, lab, rank
    # Edge columns are dictionary-encoded: a and b index the sorted ids (4 bytes an edge, where
    # strings took ~13 plus the id's length), reason is one value a piece (1 byte). They read as
    # strings, and the warehouse columns are VARCHAR. At 10M rows (~40M edges) string columns
    # were ~1.5 GB of the 4 GB. One table chunk a piece, its arrays dropped as it is built.
    ref = pa.int32() if idx is np.int32 else pa.int64()
    parts = []
    pieces.reverse()
    while pieces:
        a, b, reason, s = pieces.pop()
        parts.append(pa.table({
            "a": pa.DictionaryArray.from_arrays(pa.array(a.astype(idx, copy=False), ref), sorted_ids),
            "b": pa.DictionaryArray.from_arrays(pa.array(b.astype(idx, copy=False), ref), sorted_ids),
            "reason": pa.DictionaryArray.from_arrays(pa.repeat(pa.scalar(0, pa.int8()), len(a)), pa.array([reason], pa.string())),
            "score": pa.repeat(pa.scalar(1.0, pa.float64()), len(a)) if s is None else pa.array(s, pa.float64())}))
        del a, b, s
    edge_tbl = pa.concat_tables(parts) if parts else pa.table({
        "a": pa.array([], pa.dictionary(ref, pa.string())), "b": pa.array([], pa.dictionary(ref, pa.string())),
        "reason": pa.array([], pa.dictionary(pa.int8(), pa.string())), "score": pa.array([], pa.float64())})
    return clusters, edge_tbl


def _component_labels(n: int, edges: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Connected components over integer edges (scipy.sparse.csgraph), one label per node. One
    edge list at a time over the components so far: scipy copies a graph into float64 CSR plus
    its transpose, ~26 bytes an edge, so all ~40M edges of 10M rows at once took ~1.7 GB; a list
    at a time needs a quarter of that, and the components are the same (labels are renumbered,
    which nothing downstream depends on)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    idx = np.int32 if n < 2**31 else np.int64
    labels = np.arange(n, dtype=idx)
    m = n
    for a, b in edges:
        if not len(a):
            continue
        la, lb = labels[a], labels[b]
        g = coo_matrix((np.ones(len(la), dtype=np.int8), (la, lb)), shape=(m, m))
        del la, lb
        m, sub = connected_components(g, directed=False)
        del g
        labels = sub.astype(idx, copy=False)[labels]
    return labels.astype(np.int64)
