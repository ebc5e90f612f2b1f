"""MinHash LSH candidate pairs out of core: band keys to Parquet, grouped and joined by DuckDB
(which spills to disk under its memory limit), pairs verified by estimated Jaccard in batches.

Same candidates as `datasketch.MinHashLSH(threshold, num_perm)`: the same (b, r), read from
datasketch itself, and a pair is a candidate iff some band of r slots is equal in both
signatures. DuckDB groups on a 64-bit hash of the band, so every candidate is re-checked for an
exactly equal band before it counts (a hash collision never adds a pair).

Memory knobs (environment): RATCHET_DEDUP_MEMORY_LIMIT (DuckDB memory_limit, default "256MB") and
RATCHET_DEDUP_TMP (where band keys, pairs and DuckDB's spill files go; default the system temp
folder). The signatures are a numpy array (n x num_perm x 4 bytes); build_clusters memory-maps
them from 1 GiB on and passes `release` so the pages read are dropped after each chunk.

Rows of a memory-mapped matrix are gathered in file order, a window at a time, each window's
pages dropped before the next (`_gather`): the kernel maps a whole page-cache folio (up to
megabytes) on each fault, so 20k random rows of a 1.5 GB file mapped all 1.5 GB into this process
(measured), and at 10M rows the verify step held the whole 5 GB signature file resident.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Sequence

import numpy as np

_ROWS_PER_FILE = 1 << 16  # pragma: no mutate (a file size: any value gives the same pairs)
_PAIR_BATCH = 1 << 16  # pragma: no mutate (a batch size: any value gives the same pairs)
# mapped signature pages held at once by _gather
_WINDOW_BYTES = 128 << 20  # pragma: no mutate (a memory bound: any value gives the same pairs)


def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) exactly as datasketch picks them (weighted FP/FN minimum)."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return int(lsh.b), int(lsh.r)


def _band_keys(sigs: np.ndarray, b: int, r: int) -> np.ndarray:
    """(n, b) uint64: a 64-bit mix of each band's r slots (collisions are re-checked later)."""
    s = sigs[:, : b * r].reshape(len(sigs), b, r)  # a view: slot j of every band is s[:, :, j]
    h = np.full((len(sigs), b), np.uint64(0x9E3779B97F4A7C15), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(r):
            h ^= s[:, :, j].astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
            h *= np.uint64(0xFF51AFD7ED558CCD)
            h ^= h >> np.uint64(33)
    return h


def _gather(sigs: np.ndarray, rows: np.ndarray, release=None) -> np.ndarray:
    """sigs[rows] (a copy). With `release` (memory-mapped sigs), the distinct rows are read in
    file order one window of the file at a time, and `release(offset, length)` drops each
    window's pages before the next is read."""
    if release is None or not len(rows):
        return sigs[rows]
    u, inv = np.unique(rows, return_inverse=True)
    row_bytes = sigs.shape[1] * sigs.itemsize
    per = max(1, _WINDOW_BYTES // row_bytes)  # rows a window
    out = np.empty((len(u), sigs.shape[1]), dtype=sigs.dtype)
    cuts = np.searchsorted(u, np.arange(0, (int(u[-1]) // per + 2) * per, per))
    for w in np.flatnonzero(np.diff(cuts)).tolist():
        lo, hi = cuts[w], cuts[w + 1]
        out[lo:hi] = sigs[u[lo:hi]]
        release(w * per * row_bytes, per * row_bytes)
    return out[inv]


def _find(parent: np.ndarray, x: np.ndarray) -> np.ndarray:
    r = parent[x]
    while True:
        nr = parent[r]
        if np.array_equal(nr, r):
            return r
        r = nr


def _find1(parent: np.ndarray, x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = int(parent[x])
    return x


def candidate_pairs_ooc(
    sigs: np.ndarray,
    threshold: float,
    spanning: bool = False,
    memory_limit: str | None = None,
    tmp_dir: str | None = None,
    rows: np.ndarray | None = None,
    release=None,
    check=None,
    labels: np.ndarray | None = None,
):
    """Yield (a_idx, b_idx, score) numpy batches of verified pairs (a_idx < b_idx, row indices).
    A pair is verified when its estimated Jaccard reaches `threshold` and, given `check(a, b,
    score) -> (keep mask, score)`, when `check` keeps it (its score replaces the estimate).
    With `spanning` only pairs that join two components so far are yielded (a spanning forest
    of the verified graph: the same connected components, at most n - 1 pairs). `rows`
    (ascending row indices) restricts the search to those rows without copying `sigs`.
    `release(offset=0, length=None)` (for memory-mapped `sigs`) drops the pages of that byte
    range (default: all) from this process; it is called after each chunk read from them.

    Every candidate pair is listed (and deduplicated across bands by DuckDB) only without
    `spanning`. With it, each band's rows are read sorted by band key, and a group of rows sharing
    a key is checked as a star from its first row, then pair by pair only where its rows are still
    in different components: a family of k near-copies costs k - 1 checks per band instead of
    k(k - 1)/2 pairs (at 10M trajectories, 50 runs a task, the full pair list is ~2 billion rows
    before deduplication and did not fit DuckDB's memory limit). Every candidate pair is either
    checked or already connected, so the components are those of the full verified graph.

    With `labels` (one small non-negative integer a row, e.g. a split: not with `spanning`) only
    pairs whose labels differ are listed, each once: a band's rows are grouped by key in DuckDB,
    only groups holding two labels are read back (sorted by key), and their cross-label pairs are
    verified in numpy. Over a clean split almost no group holds two labels, so the cost is one
    group-by a band whatever the families' sizes; the full pair list (same-label pairs included)
    is what ran out of DuckDB's memory at 10M trajectories."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, num_perm = sigs.shape
    if labels is not None and spanning:
        raise ValueError("labels lists every cross-label pair; it cannot be combined with spanning")
    if (n if rows is None else len(rows)) < 2:
        return
    b, r = lsh_params(threshold, num_perm)
    memory_limit = memory_limit or os.environ.get("RATCHET_DEDUP_MEMORY_LIMIT") or "256MB"
    base = tmp_dir or os.environ.get("RATCHET_DEDUP_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ratchet-lsh-", dir=base)
    parent = np.arange(n, dtype=np.int64) if spanning else None

    def verify(a: np.ndarray, c: np.ndarray):
        """The pairs (a, c) that share a band exactly and reach the threshold (spanning: and
        still join two components, which they then merge)."""
        if spanning:
            keep = _find(parent, a) != _find(parent, c)
            a, c = a[keep], c[keep]
        if not len(a):
            return None
        # an exactly equal band (drops 64-bit key collisions), then the Jaccard estimate
        sa, sc = _gather(sigs, a, release), _gather(sigs, c, release)
        same_band = (sa[:, : b * r].reshape(len(a), b, r) == sc[:, : b * r].reshape(len(c), b, r)).all(axis=2).any(axis=1)
        a, c = a[same_band], c[same_band]
        score = np.mean(sa[same_band] == sc[same_band], axis=1)
        del sa, sc
        ok = score >= threshold
        a, c, score = a[ok], c[ok], score[ok]
        if check is not None and len(a):
            ok, score = check(a, c, score)
            a, c, score = a[ok], c[ok], np.asarray(score)[ok]
        if spanning:
            take = np.zeros(len(a), dtype=bool)
            for j, (x, y) in enumerate(zip(a.tolist(), c.tolist())):
                rx, ry = _find1(parent, x), _find1(parent, y)
                if rx != ry:
                    parent[rx] = ry
                    take[j] = True
            a, c, score = a[take], c[take], score[take]
        return (a, c, score) if len(a) else None

    def near(members: np.ndarray):
        """For one group's residual checks: est(p, rows) -> which of `rows` (positions in
        `members`) reach the threshold against member p, from the group's signatures gathered
        once (None when the group is too large to hold: each check then gathers its own rows)."""
        if len(members) * num_perm * sigs.itemsize > _WINDOW_BYTES:
            return None
        g = _gather(sigs, members, release)
        return lambda p, rows: rows[np.mean(g[rows] == g[p], axis=1) >= threshold]

    try:
        bands_dir = os.path.join(work, "bands")
        for j in range(b):
            os.makedirs(os.path.join(bands_dir, f"band={j}"))
        m = n if rows is None else len(rows)
        label_type = np.int8 if labels is None or not len(labels) or int(np.max(labels)) < 128 else np.int32
        for f, i0 in enumerate(range(0, m, _ROWS_PER_FILE)):
            i1 = min(m, i0 + _ROWS_PER_FILE)
            part = np.arange(i0, i1, dtype=np.int64) if rows is None else np.asarray(rows[i0:i1], dtype=np.int64)
            keys = _band_keys(sigs[i0:i1] if rows is None else _gather(sigs, part, release), b, r)
            cols = {"id": pa.array(part.astype(np.int32))}
            if labels is not None:
                cols["label"] = pa.array(np.asarray(labels)[part].astype(label_type))
            for j in range(b):  # one folder per band: a band's query reads only its own keys
                pq.write_table(pa.table({"key": keys[:, j], **cols}), os.path.join(bands_dir, f"band={j}", f"{f:06d}.parquet"))
            if release:
                release()
        con = duckdb.connect()
        try:
            con.execute(f"set memory_limit='{memory_limit}'")
            con.execute(f"set temp_directory='{os.path.join(work, 'spill')}'")
            con.execute("set preserve_insertion_order=false")
            if labels is not None:
                yield from _cross_bands(con, bands_dir, b, verify)
                return
            if spanning:
                for j in range(b):
                    files = os.path.join(bands_dir, f"band={j}", "*.parquet")
                    reader = con.sql(f"""
                        with k as (select key, id from read_parquet('{files}', hive_partitioning = false)),
                        shared as (select key from k group by key having count(*) > 1)
                        select key, id from k where key in (select key from shared) order by key, id
                        """).to_arrow_reader(_PAIR_BATCH)
                    for keys, ids in _whole_groups(reader):
                        yield from _span_groups(keys, ids, parent, verify, near)
                    shutil.rmtree(os.path.join(bands_dir, f"band={j}"), ignore_errors=True)
                return
            pairs_path = os.path.join(work, "pairs.parquet")
            con.execute(f"""
                copy (
                  with k as (select band, key, id from read_parquet('{bands_dir}/*/*.parquet', hive_partitioning = true)),
                  shared as (select band, key from k group by band, key having count(*) > 1),
                  g as (select k.band, k.key, k.id from k join shared using (band, key))
                  select distinct x.id as a, y.id as b
                  from g x join g y on x.band = y.band and x.key = y.key and x.id < y.id
                ) to '{pairs_path}' (format parquet)""")
        finally:
            con.close()
        shutil.rmtree(bands_dir, ignore_errors=True)
        for batch in pq.ParquetFile(pairs_path).iter_batches(batch_size=_PAIR_BATCH):
            got = verify(batch.column(0).to_numpy().astype(np.int64), batch.column(1).to_numpy().astype(np.int64))
            if got:
                yield got
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _whole_groups(reader):
    """(keys, ids, ...) numpy chunks of a stream sorted by key (its first column; the others
    as int64), each holding whole key groups (the last group of a batch is held back until the
    next batch shows where it ends)."""
    carry = None
    for batch in reader:
        cols = [batch.column(0).to_numpy()] + [batch.column(c).to_numpy().astype(np.int64) for c in range(1, batch.num_columns)]
        if carry is not None:
            cols = [np.concatenate([x, y]) for x, y in zip(carry, cols)]
        k = cols[0]
        cut = int(np.searchsorted(k, k[-1], side="left")) if len(k) else 0
        if cut:
            yield tuple(c[:cut] for c in cols)
        carry = [c[cut:] for c in cols]
    if carry is not None and len(carry[0]):
        yield tuple(carry)


def _cross_in_groups(keys: np.ndarray, ids: np.ndarray, labels: np.ndarray):
    """(a, c) batches of every pair within a key group whose labels differ (ids ascending within
    a group, so a < c), at most about _PAIR_BATCH pairs a batch."""
    head = np.ones(len(keys), dtype=bool)
    head[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(head)
    ends = np.append(starts[1:], len(keys))
    buf_a: list[np.ndarray] = []
    buf_c: list[np.ndarray] = []
    size = 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        g, lab = ids[s:e], labels[s:e]
        if len(g) * len(g) <= 2 * _PAIR_BATCH:
            x, y = np.triu_indices(len(g), 1)
            keep = lab[x] != lab[y]
            parts = [(g[x[keep]], g[y[keep]])]
        else:  # a large group: a member at a time (its pairs would not fit one batch)
            parts = ((np.full(int(k.sum()), g[p]), g[p + 1:][k]) for p in range(len(g) - 1)
                     for k in [lab[p + 1:] != lab[p]])
        for a, c in parts:
            if not len(a):
                continue
            buf_a.append(a)
            buf_c.append(c)
            size += len(a)
            if size >= _PAIR_BATCH:
                yield np.concatenate(buf_a), np.concatenate(buf_c)
                buf_a, buf_c, size = [], [], 0
    if size:
        yield np.concatenate(buf_a), np.concatenate(buf_c)


def _cross_bands(con, bands_dir: str, b: int, verify):
    """Verified cross-label pairs over every band, each pair once (a pair sharing several bands
    is verified in each; only verified pairs are kept to deduplicate)."""
    got_a: list[np.ndarray] = []
    got_c: list[np.ndarray] = []
    got_s: list[np.ndarray] = []
    for j in range(b):
        files = os.path.join(bands_dir, f"band={j}", "*.parquet")
        reader = con.sql(f"""
            with k as (select key, id, label from read_parquet('{files}', hive_partitioning = false)),
            mixed as (select key from k group by key having min(label) <> max(label))
            select key, id, label from k where key in (select key from mixed) order by key, id
            """).to_arrow_reader(_PAIR_BATCH)
        for keys, ids, labs in _whole_groups(reader):
            for a, c in _cross_in_groups(keys, ids, labs):
                got = verify(a, c)
                if got:
                    got_a.append(got[0])
                    got_c.append(got[1])
                    got_s.append(got[2])
        shutil.rmtree(os.path.join(bands_dir, f"band={j}"), ignore_errors=True)
    if got_a:
        a, c, s = np.concatenate(got_a), np.concatenate(got_c), np.concatenate(got_s)
        _, first = np.unique(a.astype(np.int64) * (int(max(a.max(), c.max())) + 1) + c, return_index=True)
        yield a[first], c[first], s[first]


def _span_groups(keys: np.ndarray, ids: np.ndarray, parent: np.ndarray, verify, near=None):
    """Spanning pairs of whole key groups (ids ascending within a group): first a star from each
    group's first row, then, in groups whose rows are still in several components, every pair
    whose ends are still apart (the star's own pairs were checked already). `near(members)`, if
    given, returns a prefilter est(p, rows) -> rows that reach the threshold, so a large group of
    unrelated rows (a low threshold over similar documents) costs one gather, not one a member;
    `verify` re-checks what passes, so the pairs are the same."""
    head = np.ones(len(keys), dtype=bool)
    head[1:] = keys[1:] != keys[:-1]
    gid = np.cumsum(head) - 1
    starts = np.flatnonzero(head)
    got = verify(ids[starts][gid[~head]], ids[~head])
    if got:
        yield got
    roots = _find(parent, ids)
    apart = np.unique(gid[roots != roots[starts][gid]])
    ends = np.append(starts[1:], len(ids))
    for g in apart.tolist():
        members = ids[starts[g]:ends[g]]
        est = near(members) if near is not None else None
        for p in range(1, len(members) - 1):
            rr = _find(parent, members)
            if (rr == rr[0]).all():
                break  # the whole group is one component now
            far = np.flatnonzero(rr[p + 1:] != rr[p]) + p + 1
            if est is not None and len(far):
                far = est(p, far)
            if len(far):
                got = verify(np.full(len(far), members[p], dtype=np.int64), members[far])
                if got:
                    yield got


def mixed_component_pairs(
    sigs: np.ndarray,
    threshold: float,
    labels: np.ndarray,
    check=None,
    memory_limit: str | None = None,
    tmp_dir: str | None = None,
):
    """The pairs `candidate_pairs_ooc(labels=labels)` lists, found in two passes: the spanning
    pass gives the components of the verified graph; only rows of components holding two labels
    are searched for cross-label pairs (a verified pair across labels is an edge inside one such
    component, so none is missed). Where unrelated rows share bands often (the AST shape index's
    low threshold: random functions share subtrees), the direct cross-label search verifies every
    mixed group's pairs in every band (32 bands, ~1 min each at 200k shapes, measured); a clean
    split's components hold one label each and the second pass is empty."""
    n = len(sigs)
    parent = np.arange(n, dtype=np.int64)
    for a, c, _ in candidate_pairs_ooc(sigs, threshold, spanning=True, memory_limit=memory_limit, tmp_dir=tmp_dir,
                                       check=check):
        for x, y in zip(a.tolist(), c.tolist()):
            rx, ry = _find1(parent, x), _find1(parent, y)
            if rx != ry:
                parent[rx] = ry
    root = _find(parent, np.arange(n, dtype=np.int64))
    lab = np.asarray(labels).astype(np.int64)
    lo = np.full(n, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(lo, root, lab)
    np.maximum.at(hi, root, lab)
    rows = np.flatnonzero(lo[root] != hi[root])
    if len(rows) > 1:
        yield from candidate_pairs_ooc(sigs, threshold, memory_limit=memory_limit, tmp_dir=tmp_dir, rows=rows,
                                       check=check, labels=labels)


def lsh_pairs_ooc(
    ids: Sequence[str],
    sigs: np.ndarray,
    threshold: float = 0.8,
    spanning: bool = False,
    memory_limit: str | None = None,
    tmp_dir: str | None = None,
) -> list[tuple[str, str, float]]:
    """`minhash.lsh_pairs` computed out of core: (a, b, score) with a < b."""
    out: list[tuple[str, str, float]] = []
    for a, c, s in candidate_pairs_ooc(sigs, threshold, spanning, memory_limit, tmp_dir):
        for x, y, v in zip(a.tolist(), c.tolist(), s.tolist()):
            p, q = ids[x], ids[y]
            out.append((p, q, float(v)) if p < q else (q, p, float(v)))
    return out
