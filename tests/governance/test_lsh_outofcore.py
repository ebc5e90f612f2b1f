"""The out-of-core LSH (DuckDB band grouping) gives exactly the in-memory datasketch results."""
from __future__ import annotations

import numpy as np
import pytest

from ratchet.governance import lsh_index
from ratchet.governance.clusters import build_clusters
from ratchet.governance.minhash import lsh_pairs, signatures


def _near_duplicates(n: int, seed: int = 3) -> list[str]:
    """Families of prompts whose members differ in 0-4 of 200 words: estimated Jaccards spread
    around the 0.8 threshold, where which pairs become LSH candidates depends on (b, r)."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(5000)]
    out = []
    while len(out) < n:
        base = [vocab[j] for j in rng.integers(0, len(vocab), 200)]
        for _ in range(int(rng.integers(1, 12))):
            w = list(base)
            for pos in rng.integers(0, len(w), int(rng.integers(0, 5))):
                w[pos] = f"v{rng.integers(100000)}"
            out.append(" ".join(w))
    return out[:n]


@pytest.fixture(scope="module")
def corpus():
    texts = _near_duplicates(3000)
    ids = [f"r{i:05d}" for i in range(len(texts))]
    return ids, texts, signatures(texts)


def test_same_bands_as_datasketch():
    from datasketch import MinHashLSH

    for t, p in ((0.8, 128), (0.5, 128), (0.3, 64)):
        lsh = MinHashLSH(threshold=t, num_perm=p)
        assert lsh_index.lsh_params(t, p) == (lsh.b, lsh.r)


def test_all_pairs_identical_to_datasketch(corpus, tmp_path):
    ids, _, sigs = corpus
    mem = lsh_pairs(ids, sigs, 0.8, spanning=False, backend="memory")
    ooc = lsh_index.lsh_pairs_ooc(ids, sigs, 0.8, spanning=False, tmp_dir=str(tmp_path), memory_limit="64MB")
    assert len(mem) > 1000
    assert sorted(mem) == sorted(ooc)
    # near the threshold banding decides: some verified pairs are not candidates at all
    every = {(ids[i], ids[j]) for i in range(len(ids)) for j in range(i + 1, min(len(ids), i + 12))
             if np.mean(sigs[i] == sigs[j]) >= 0.8}
    assert every - {(a, b) for a, b, _ in mem}
    assert list(tmp_path.iterdir()) == []  # work files are removed


def test_wrong_banding_is_detected(corpus, monkeypatch):
    ids, _, sigs = corpus
    mem = sorted(lsh_pairs(ids, sigs, 0.8, spanning=False, backend="memory"))
    b, r = lsh_index.lsh_params(0.8, sigs.shape[1])
    monkeypatch.setattr(lsh_index, "lsh_params", lambda t, p: (b, r - 1))
    assert sorted(lsh_index.lsh_pairs_ooc(ids, sigs, 0.8)) != mem


def test_clusters_and_edges_identical(corpus):
    ids, texts, _ = corpus
    rows = [{"record_id": i, "prompt_text": t} for i, t in zip(ids, texts)]
    kw = dict(code_cols=(), key_cols={})
    c_mem, e_mem = build_clusters(rows, spanning=False, lsh_backend="memory", **kw)
    c_ooc, e_ooc = build_clusters(rows, spanning=False, lsh_backend="duckdb", **kw)
    assert c_mem.to_pylist() == c_ooc.to_pylist()
    assert sorted(map(tuple, e_mem.to_pandas().values.tolist())) == sorted(map(tuple, e_ooc.to_pandas().values.tolist()))
    s_mem, _ = build_clusters(rows, lsh_backend="memory", **kw)
    s_ooc, e_span = build_clusters(rows, **kw)  # the default path: out of core, spanning
    assert s_ooc.to_pylist() == s_mem.to_pylist() == c_mem.to_pylist()
    n_clusters = len(set(s_ooc.column("cluster_id").to_pylist()))
    assert 1 < n_clusters < len(ids)
    assert e_span.num_rows == len(ids) - n_clusters  # a spanning forest


def test_unknown_backend_is_refused(corpus):
    ids, _, sigs = corpus
    with pytest.raises(ValueError, match="unknown LSH backend"):
        lsh_pairs(ids[:10], sigs[:10], backend="ray")


def test_band_key_collisions_add_no_pairs(corpus, monkeypatch):
    """Band keys are a 64-bit hash; a collision must not make two rows candidates."""
    ids, _, sigs = corpus
    mem = sorted(lsh_pairs(ids, sigs, 0.8, spanning=False, backend="memory"))
    real = lsh_index._band_keys
    monkeypatch.setattr(lsh_index, "_band_keys", lambda s, b, r: real(s, b, r) % np.uint64(7))
    assert sorted(lsh_index.lsh_pairs_ooc(ids, sigs, 0.8)) == mem
