"""MinHash signatures of normalised prompt text, bit-identical to `datasketch.MinHash`.

Why hand-written: `datasketch.MinHash.update_batch` hashes shingles one Python call at a time and
builds one MinHash object per document. bench/dedup.py (50k docs x 200 five-word shingles, 128
permutations) on this shared 2-core box: datasketch ~2.5-3.3k docs/s; this path ~26-33k docs/s
per CPU-second on one thread (~10x; 13-17x on the uniform corpus), wall-clock ratios with 2
threads 8-13x depending on the other load. SHA-1 is fixed by bit-identity (datasketch's
sha1_hash32), so it runs in compiled code, batched per chunk (HASH_BACKEND):
  * "c": ratchet/governance/_sha1batch.c (built by setup.py on `pip install -e .`), SHA-NI with a
    CPUID check and a portable C fallback: ~28-35 ns per ~33-byte shingle with SHA-NI (portable
    ~170), straight from byte spans into the joined text, GIL released;
  * "duckdb" (when the optional extension is not built): DuckDB `sha1()` on Arrow string views
    plus a SWAR hex decode, ~170-260 ns/shingle; a hashlib loop is ~400-500 ns (per-call cost).
Per 1024-doc chunk, CPU ms with "c": normalise ~8-12, shingle spans ~6-12, SHA-1 ~6-7,
permutation+min ~8; with "duckdb" SHA-1 ~35-40 and string views ~13 more.
  * shingles are byte spans into the chunk's joined UTF-8 bytes (for DuckDB: Arrow string_view
    values, 16 bytes of numpy per shingle); no shingle text is copied (the copy cost as much as
    SHA-1 itself did);
  * DuckDB's hex digests are decoded SWAR, 8 chars per uint64;
  * the permutation is one reused (num_perm x ~6k shingles) matrix per block of whole docs,
    min-reduced per doc with `np.minimum.reduceat` along the contiguous axis (cache-resident).
Hashing each distinct shingle once was measured and rejected: on a prompt-log corpus (~40% of
occurrences template boilerplate) exact per-chunk dedup (DuckDB group-by/join, pyarrow
dictionary_encode) costs as much as or more than the SHA-1 it saves, and a 64-bit-hash dedup is
not exact.
Identity with datasketch is asserted in tests/governance (all three schemes) and in the bench (default).
LSH candidate search (`lsh_pairs`) runs out of core by default (ratchet/governance/lsh_index.py:
band keys grouped by DuckDB, which spills to disk); backend="memory" uses `datasketch.MinHashLSH`.
Both give the same candidates and the same connected components.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

import numpy as np

try:  # built by setup.py (`pip install -e .`); optional: without it SHA-1 runs in DuckDB
    from ratchet.governance import _sha1batch
except ImportError:  # pragma: no cover - depends on the install
    _sha1batch = None

# "c" (ratchet/governance/_sha1batch.c, SHA-NI when the CPU has it) or "duckdb" (sha1() on
# Arrow string views). Both give bit-identical signatures; `signatures(backend=...)` overrides.
HASH_BACKEND = "c" if _sha1batch is not None else "duckdb"
HASH_IMPL = f"c/{_sha1batch.IMPL}" if _sha1batch is not None else "duckdb"
logging.getLogger(__name__).debug("minhash SHA-1 backend: %s", HASH_IMPL)

DEFAULT_NUM_PERM = 128
DEFAULT_SEED = 1
# Word 5-shingles: prompts here are issue/task text of a few hundred words. k=5 keeps a
# one-word edit (a renamed variable, a changed number) from touching more than 5 of ~200
# shingles (J ~ 0.95), while shared boilerplate phrases of 2-3 words (common with k=2-3) no
# longer make unrelated tasks look similar. Numbers are kept: "off by 1" vs "off by 2" are
# different tasks only through their other words.
DEFAULT_SHINGLE = 5
DEFAULT_SCHEME = "affine32"  # datasketch 2.x default

_MERSENNE = np.uint64((1 << 61) - 1)
_MAX32 = np.uint64((1 << 32) - 1)
# 128 perms x 6144 x 4 B = 3 MB per permutation block
_BLOCK_SHINGLES = 6144  # pragma: no mutate (a block size: any value gives the same signatures)
_INLINE = 12  # Arrow string_view keeps values of <= 12 bytes inline


def normalise(text: str | None) -> str:
    """Lowercase and collapse all whitespace to single spaces (numbers and punctuation kept)."""
    return " ".join((text or "").lower().split())


def shingles(text: str | None, k: int = DEFAULT_SHINGLE) -> list[str]:
    """Word k-shingles of the normalised text. Reference definition (the vectorised path must
    agree with it): a text with 1..k-1 words is one shingle; an empty text has none."""
    words = normalise(text).split(" ") if normalise(text) else []
    if not words:
        return []
    if len(words) <= k:
        return [" ".join(words)]
    return [" ".join(words[i : i + k]) for i in range(len(words) - k + 1)]


def permutations(num_perm: int = DEFAULT_NUM_PERM, seed: int = DEFAULT_SEED, scheme: str = DEFAULT_SCHEME):
    """(a, b) exactly as datasketch generates them (we call its own generator)."""
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed, scheme=scheme).permutations
    return np.asarray(a), np.asarray(b)


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _fmix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def _hex8_le(chars: np.ndarray) -> np.ndarray:
    """(n, 8) lowercase-hex ASCII -> uint64 holding those 4 digest bytes read little-endian.
    SWAR on one uint64 per row: '0'-'9' = 0x30-0x39, 'a'-'f' = 0x61-0x66, so a nibble is
    (c & 0xF) + 9 * (c >> 6)."""
    x = np.ascontiguousarray(chars).view("<u8")[:, 0]
    x = (x & np.uint64(0x0F0F0F0F0F0F0F0F)) + np.uint64(9) * ((x >> np.uint64(6)) & np.uint64(0x0101010101010101))
    # char 2i (high nibble of byte i) sits in byte 2i of x, char 2i+1 in byte 2i+1
    y = ((x & np.uint64(0x000F000F000F000F)) << np.uint64(4)) | ((x >> np.uint64(8)) & np.uint64(0x000F000F000F000F))
    y = (y | (y >> np.uint64(8))) & np.uint64(0x0000FFFF0000FFFF)
    return (y | (y >> np.uint64(16))) & np.uint64(0xFFFFFFFF)


def _hex_le(hexdigits: np.ndarray, nbytes: int) -> np.ndarray:
    """First `nbytes` (4 or 8) of SHA-1 digests (given as (n, 40) ASCII hex) read little-endian,
    which is what datasketch's sha1_hash32/64 do with struct '<I' / '<Q'."""
    out = _hex8_le(hexdigits[:, :8])
    if nbytes == 8:
        out |= _hex8_le(hexdigits[:, 8:16]) << np.uint64(32)
    return out


def _chunk_spans(norm: Sequence[str], k: int):
    """Byte spans of the word k-shingles of already-normalised texts inside their joined UTF-8
    bytes. Returns (joined bytes, starts, ends, per-doc shingle counts); starts/ends are int32
    (None when there are no shingles). Nothing is copied per shingle: shingles overlap, so a
    shingle is ~k times its share of the text."""
    ntok = np.fromiter((t.count(" ") + 1 if t else 0 for t in norm), dtype=np.int64, count=len(norm))
    nsh = np.where(ntok == 0, 0, np.maximum(ntok - k + 1, 1))
    if nsh.sum() == 0:
        return b"", None, None, nsh
    data = " ".join(t for t in norm if t).encode("utf-8")
    if len(data) >= 2**31 - 16:  # int32 spans (and view offsets); callers chunk far below this
        raise ValueError("chunk too large for int32 spans; lower chunk_docs")
    sp = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 32)  # UTF-8 continuation bytes never equal 0x20
    starts = np.concatenate(([0], sp + 1)).astype(np.int32)
    ends = np.concatenate((sp, [len(data)])).astype(np.int32)
    nt = ntok[ntok > 0].astype(np.int32)
    ns = nsh[ntok > 0].astype(np.int32)
    tok0 = np.concatenate(([0], np.cumsum(nt)[:-1])).astype(np.int32)
    sh0 = np.concatenate(([0], np.cumsum(ns)[:-1])).astype(np.int32)
    # shingle j of a doc spans tokens j .. min(j+k-1, ntok-1)
    doc_rep = np.repeat(np.arange(len(nt), dtype=np.int32), ns)
    j = np.arange(int(ns.sum()), dtype=np.int32) - sh0[doc_rep]
    first = tok0[doc_rep] + j
    last = tok0[doc_rep] + np.minimum(j + np.int32(k - 1), (nt - 1)[doc_rep])
    return data, starts[first], ends[last], nsh


def _chunk_shingles(norm: Sequence[str], k: int):
    """Shingles as a pyarrow string_view array pointing into the chunk's joined UTF-8 bytes (for
    DuckDB), plus per-doc shingle counts: only 16 bytes per shingle are written, all in numpy."""
    import pyarrow as pa

    data, s, e, nsh = _chunk_spans(norm, k)
    if s is None:
        return pa.array([], pa.string()), nsh
    buf = np.frombuffer(data + bytes(_INLINE), dtype=np.uint8)  # padded for the inline gather
    lens = e - s
    # Arrow string_view layout, 16 bytes per value: int32 length, then either the value itself
    # (<= 12 bytes, zero padded) or a 4-byte prefix, int32 buffer index and int32 offset.
    views = np.lib.stride_tricks.sliding_window_view(buf, _INLINE)[s]
    short = lens <= _INLINE
    if short.any():
        views[short] *= np.arange(_INLINE, dtype=np.int32)[None, :] < lens[short, None]
    v = np.empty((len(s), 4), dtype=np.int32)
    v[:, 1:] = views.view(np.int32)
    v[:, 0] = lens
    longv = ~short
    v[longv, 2] = 0
    v[longv, 3] = s[longv]
    arr = pa.Array.from_buffers(pa.string_view(), len(s), [None, pa.py_buffer(v), pa.py_buffer(buf)])
    return arr, nsh


def _chunk_hashes_c(norm: Sequence[str], k: int, nbytes: int):
    """(first `nbytes` of SHA-1, little-endian, per shingle; per-doc shingle counts) via the C
    extension, straight from the spans (no views, no hex)."""
    data, s, e, nsh = _chunk_spans(norm, k)
    if s is None:
        return np.empty(0, dtype=np.uint32 if nbytes == 4 else np.uint64), nsh
    hv = np.empty(len(s), dtype=np.uint32 if nbytes == 4 else np.uint64)
    _sha1batch.sha1_le(data, s.astype(np.int64), e.astype(np.int64), hv)  # releases the GIL
    return hv, nsh


def _sha1_le(con, arr, nbytes: int) -> np.ndarray:
    import pyarrow as pa

    tbl = pa.table({"s": arr})  # noqa: F841 (DuckDB replacement scan)
    col = con.sql("select sha1(s) as h from tbl").to_arrow_table().column(0).combine_chunks()
    if col.type != pa.string():
        col = col.cast(pa.string())
    off = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset : col.offset + len(col) + 1]
    data = np.frombuffer(col.buffers()[2], dtype=np.uint8)
    if not np.all(np.diff(off) == 40):  # never seen; keeps the reshape below honest
        raise RuntimeError("unexpected sha1 hex layout from DuckDB")
    return _hex_le(data[off[0] : off[-1]].reshape(-1, 40), nbytes)


def _signature_chunk(con, norm, k, a, b, scheme) -> np.ndarray:
    """One chunk of signatures; `con` is a DuckDB cursor (hash in DuckDB) or None (C extension)."""
    nbytes = 8 if scheme == "affine64" else 4
    if con is None:
        hv, nsh = _chunk_hashes_c(norm, k, nbytes)
    else:
        arr, nsh = _chunk_shingles(norm, k)
        hv = _sha1_le(con, arr, nbytes) if len(arr) else None
    dtype = np.uint64 if scheme in ("legacy", "affine64") else np.uint32
    init = _MAX32 if scheme == "legacy" else np.iinfo(dtype).max
    out = np.full((len(norm), len(a)), init, dtype=dtype)
    if hv is None or len(hv) == 0:
        return out
    has = np.flatnonzero(nsh > 0)
    bounds = np.concatenate(([0], np.cumsum(nsh[has])))
    if scheme == "affine32":
        hv = _fmix32(hv.astype(np.uint32))
    elif scheme == "affine64":
        hv = _fmix64(hv)
    a2, b2 = a[:, None], b[:, None]
    # Blocks of ~_BLOCK_SHINGLES shingles (whole docs) into one reused (num_perm x block)
    # buffer keep the matrix cache-resident: 2x faster than blocks of 64 docs (~6.5 MB).
    width = max(_BLOCK_SHINGLES, int(nsh.max()))
    buf = np.empty((len(a), width), dtype=dtype)
    d0 = 0
    while d0 < len(has):
        d1 = max(d0 + 1, int(np.searchsorted(bounds, bounds[d0] + width, "right")) - 1)
        d1 = min(d1, len(has))
        h = hv[bounds[d0] : bounds[d1]]
        p = buf[:, : len(h)]
        np.multiply(a2, h[None, :], out=p)  # wraps mod 2^width, exactly like datasketch
        p += b2
        if scheme == "legacy":  # (a*hv + b) % (2^61-1) & (2^32-1)
            p %= _MERSENNE
            p &= _MAX32
        out[has[d0:d1]] = np.minimum.reduceat(p, bounds[d0:d1] - bounds[d0], axis=1).T
        d0 = d1
    return out


def signatures(
    texts: Iterable[str | None],
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    k: int = DEFAULT_SHINGLE,
    scheme: str = DEFAULT_SCHEME,
    threads: int | None = None,
    chunk_docs: int = 1024,
    backend: str | None = None,
) -> np.ndarray:
    """MinHash signatures, one row per text: (n, num_perm) uint32 for "affine32", uint64 for
    "affine64"/"legacy". Row i equals `datasketch.MinHash(num_perm, seed, scheme=scheme)` updated
    with `[s.encode() for s in shingles(texts[i], k)]` (a text without shingles keeps
    datasketch's initial all-max values). `threads` defaults to min(2, cpu_count). `backend`
    ("c" or "duckdb") picks where SHA-1 runs; default HASH_BACKEND."""
    backend = backend or HASH_BACKEND
    if backend not in ("c", "duckdb"):
        raise ValueError(f"unknown hash backend {backend!r}")
    if backend == "c" and _sha1batch is None:
        raise RuntimeError("hash backend 'c' requested but ratchet.governance._sha1batch is not built")
    if scheme not in ("affine32", "affine64", "legacy"):
        raise ValueError(f"unknown MinHash scheme {scheme!r}")
    texts = texts if isinstance(texts, Sequence) else list(texts)
    a, b = permutations(num_perm, seed, scheme)
    threads = threads or min(2, os.cpu_count() or 1)
    # normalised per chunk: a normalised copy of all texts at once cost ~0.9 GB at 1M prompts
    chunks = [texts[i : i + chunk_docs] for i in range(0, len(texts), chunk_docs)]
    if not chunks:
        return np.zeros((0, num_perm), dtype=np.uint32 if scheme == "affine32" else np.uint64)
    root = None
    if backend == "duckdb":
        import duckdb

        root = duckdb.connect()
        root.execute("set threads=1")

    def run(chunk):
        chunk = [normalise(t) for t in chunk]
        if root is None:
            return _signature_chunk(None, chunk, k, a, b, scheme)
        con = root.cursor()  # one cursor per call: DuckDB cursors are not shared across threads
        try:
            return _signature_chunk(con, chunk, k, a, b, scheme)
        finally:
            con.close()

    try:
        if threads == 1 or len(chunks) == 1:
            parts = [run(c) for c in chunks]
        else:  # the C hash, DuckDB and numpy ufuncs release the GIL, so threads use both cores
            with ThreadPoolExecutor(threads) as ex:
                parts = list(ex.map(run, chunks))
    finally:
        if root is not None:
            root.close()
    return np.vstack(parts)


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Fraction of equal slots (datasketch's MinHash.jaccard), row-wise for 2-D inputs."""
    return np.mean(np.asarray(sig_a) == np.asarray(sig_b), axis=-1)


def lsh_pairs(
    ids: Sequence[str],
    sigs: np.ndarray,
    threshold: float = 0.8,
    seed: int = DEFAULT_SEED,
    scheme: str = DEFAULT_SCHEME,
    spanning: bool = False,
    backend: str = "duckdb",
) -> list[tuple[str, str, float]]:
    """Candidate pairs of MinHash LSH (datasketch's (b, r) for `threshold`), kept when the
    estimated Jaccard >= threshold. Returns (a, b, score) with a < b. With `spanning=True` a pair
    whose ends are already connected by earlier pairs is not returned: enough to build the same
    clusters, and it keeps big near-duplicate families from emitting O(n^2) edges (which pairs
    are kept then depends on the backend; the components do not). backend "duckdb" (default)
    groups band keys out of core (lsh_index); "memory" uses `datasketch.MinHashLSH`, whose index
    holds every band of every row in Python objects (~6 GB at 1M rows)."""
    if backend == "duckdb":
        from .lsh_index import lsh_pairs_ooc

        return lsh_pairs_ooc(ids, sigs, threshold, spanning=spanning)
    if backend != "memory":
        raise ValueError(f"unknown LSH backend {backend!r} (expected 'duckdb' or 'memory')")
    from datasketch import LeanMinHash, MinHashLSH

    n, num_perm = sigs.shape
    if n < 2:
        return []
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    out: list[tuple[str, str, float]] = []
    for i in range(n):
        m = LeanMinHash(seed=seed, hashvalues=sigs[i], scheme=scheme)
        cands = lsh.query(m)
        if cands:
            if spanning:
                cands = [c for c in cands if find(c) != find(i)]
            if cands:
                cs = np.asarray(cands)
                est = np.mean(sigs[cs] == sigs[i], axis=1)
                for c, s in zip(cs.tolist(), est.tolist()):
                    if s >= threshold and (not spanning or find(c) != find(i)):
                        x, y = sorted((ids[i], ids[c]))
                        out.append((x, y, float(s)))
                        if spanning:
                            parent[find(c)] = find(i)
        lsh.insert(i, m, check_duplication=False)
    return out
