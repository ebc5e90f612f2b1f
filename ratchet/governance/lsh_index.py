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
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Sequence

import numpy as np

_ROWS_PER_FILE = 1 << 16
_PAIR_BATCH = 1 << 16


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
):
    """Yield (a_idx, b_idx, score) numpy batches of verified pairs (a_idx < b_idx, row indices).
    With `spanning` only pairs that join two components so far are yielded (a spanning forest
    of the verified graph: the same connected components, at most n - 1 pairs). `rows`
    (ascending row indices) restricts the search to those rows without copying `sigs`.
    `release` (for memory-mapped `sigs`) is called after each chunk read from them, to drop
    those pages from this process."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, num_perm = sigs.shape
    if (n if rows is None else len(rows)) < 2:
        return
    b, r = lsh_params(threshold, num_perm)
    memory_limit = memory_limit or os.environ.get("RATCHET_DEDUP_MEMORY_LIMIT") or "256MB"
    base = tmp_dir or os.environ.get("RATCHET_DEDUP_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ratchet-lsh-", dir=base)
    try:
        bands_dir = os.path.join(work, "bands")
        os.makedirs(bands_dir)
        band_col = np.tile(np.arange(b, dtype=np.int16), _ROWS_PER_FILE)
        m = n if rows is None else len(rows)
        for f, i0 in enumerate(range(0, m, _ROWS_PER_FILE)):
            i1 = min(m, i0 + _ROWS_PER_FILE)
            part = np.arange(i0, i1, dtype=np.int64) if rows is None else np.asarray(rows[i0:i1], dtype=np.int64)
            keys = _band_keys(sigs[i0:i1] if rows is None else sigs[part], b, r).reshape(-1)
            ids = np.repeat(part.astype(np.int32), b)
            pq.write_table(pa.table({"band": band_col[: len(keys)], "key": keys, "id": ids}),
                           os.path.join(bands_dir, f"{f:06d}.parquet"))
            if release:
                release()
        pairs_path = os.path.join(work, "pairs.parquet")
        con = duckdb.connect()
        try:
            con.execute(f"set memory_limit='{memory_limit}'")
            con.execute(f"set temp_directory='{os.path.join(work, 'spill')}'")
            con.execute("set preserve_insertion_order=false")
            con.execute(f"""
                copy (
                  with k as (select band, key, id from read_parquet('{bands_dir}/*.parquet')),
                  shared as (select band, key from k group by band, key having count(*) > 1),
                  g as (select k.band, k.key, k.id from k join shared using (band, key))
                  select distinct x.id as a, y.id as b
                  from g x join g y on x.band = y.band and x.key = y.key and x.id < y.id
                ) to '{pairs_path}' (format parquet)""")
        finally:
            con.close()
        shutil.rmtree(bands_dir, ignore_errors=True)
        parent = np.arange(n, dtype=np.int64) if spanning else None
        rb = sigs[:, : b * r]
        for batch in pq.ParquetFile(pairs_path).iter_batches(batch_size=_PAIR_BATCH):
            a = batch.column(0).to_numpy().astype(np.int64)
            c = batch.column(1).to_numpy().astype(np.int64)
            if spanning:
                keep = _find(parent, a) != _find(parent, c)
                a, c = a[keep], c[keep]
            if not len(a):
                continue
            # an exactly equal band (drops 64-bit key collisions), then the Jaccard estimate
            same_band = (rb[a].reshape(len(a), b, r) == rb[c].reshape(len(c), b, r)).all(axis=2).any(axis=1)
            a, c = a[same_band], c[same_band]
            score = np.mean(sigs[a] == sigs[c], axis=1)
            ok = score >= threshold
            a, c, score = a[ok], c[ok], score[ok]
            if spanning:
                take = np.zeros(len(a), dtype=bool)
                for j, (x, y) in enumerate(zip(a.tolist(), c.tolist())):
                    rx, ry = _find1(parent, x), _find1(parent, y)
                    if rx != ry:
                        parent[rx] = ry
                        take[j] = True
                a, c, score = a[take], c[take], score[take]
            if release:
                release()
            if len(a):
                yield a, c, score
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
