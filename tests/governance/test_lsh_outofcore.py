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


def _rows(ids, texts):
    """Rows with text, empty text and no text, shared and empty repos, plus one patch family."""
    code = "def f(xs, n):\n    x = 0\n    for i in range(n):\n        x = x + xs[i] * 2 - 1\n    return x\n"
    rows = []
    for j, (i, t) in enumerate(zip(ids, texts)):
        rows.append({"record_id": i, "prompt_text": None if j % 97 == 0 else ("  " if j % 89 == 0 else t),
                     "repo": f"org/r{j % 400}" if j % 5 == 0 else "", "issue_id": None,
                     "patch": code.replace("2", str(j % 3)) if j % 11 == 0 else None})
    return rows


@pytest.mark.parametrize("source", ["parquet", "reader", "table", "parquet-mmap"])
def test_streamed_input_gives_the_clusters_and_signatures_of_the_rows(corpus, tmp_path, monkeypatch, source):
    """Parquet paths, record batch readers and tables are read in batches (here 700 rows) and
    give exactly the clusters, edges (unique without spanning) and signatures of the dicts;
    also with the signatures memory-mapped and their pages dropped after each LSH chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ratchet.governance import clusters

    ids, texts, _ = corpus
    rows = _rows(ids, texts)
    kw = dict(spanning=False)
    want_sigs = {}
    c_rows, e_rows = build_clusters(rows, signatures_out=want_sigs, **kw)
    monkeypatch.setattr(clusters, "_BATCH_ROWS", 700)
    released = []
    if source == "parquet-mmap":
        monkeypatch.setattr(clusters, "_SIG_MMAP_BYTES", 0)
        real = lsh_index.candidate_pairs_ooc

        def counting(*a, release=None, **kw):
            assert release is not None
            return real(*a, release=lambda *r: (released.append(1), release(*r)), **kw)
        monkeypatch.setattr(lsh_index, "candidate_pairs_ooc", counting)
    tbl = pa.Table.from_pylist(rows)
    pq.write_table(tbl, tmp_path / "items.parquet", row_group_size=1000)
    data = {"parquet": str(tmp_path / "items.parquet"), "reader": pa.RecordBatchReader.from_batches(
        tbl.schema, tbl.to_batches(max_chunksize=1000)), "table": tbl,
        "parquet-mmap": str(tmp_path / "items.parquet")}[source]
    got_sigs = {}
    c, e = build_clusters(data, signatures_out=got_sigs, **kw)
    assert c.equals(c_rows)
    assert sorted(e.to_pylist(), key=str) == sorted(e_rows.to_pylist(), key=str)
    assert np.array_equal(got_sigs["sigs"], signatures([r["prompt_text"] for r in rows]))
    assert np.array_equal(got_sigs["sigs"], want_sigs["sigs"])
    assert bool(released) == (source == "parquet-mmap")
    reasons = set(e.column("reason").to_pylist())
    assert {"minhash", "same_repo", "ast_skeleton"} <= reasons
    # rows without text never join by MinHash even though their (empty) signatures are equal
    no_text = {r["record_id"] for r in rows if not (r["prompt_text"] or "").strip()}
    assert not no_text & {x for r in e.to_pylist() if r["reason"] == "minhash" for x in (r["a"], r["b"])}


def test_duplicate_ids_are_refused_before_any_work(tmp_path):
    rows = [{"record_id": "a", "prompt_text": "x y z"}, {"record_id": "b", "prompt_text": "x y z"},
            {"record_id": "a", "prompt_text": "other words"}]
    with pytest.raises(ValueError, match="duplicate ids in column 'record_id'"):
        build_clusters(rows, code_cols=(), key_cols={})


def test_candidate_rows_restrict_the_search_to_those_rows(corpus):
    ids, _, sigs = corpus
    rows = np.arange(0, len(ids), 2)
    sub = {tuple(sorted((ids[rows[int(a)]], ids[rows[int(b)]])))
           for a, b, _ in lsh_pairs([str(i) for i in range(len(rows))], sigs[rows], 0.8, backend="memory")}
    got = set()
    for a, b, _ in lsh_index.candidate_pairs_ooc(sigs, 0.8, rows=rows):
        assert set(a.tolist()) | set(b.tolist()) <= set(rows.tolist())
        got |= {(ids[x], ids[y]) for x, y in zip(a.tolist(), b.tolist())}
    assert got == sub and len(got) > 100


def _labels(n: int, batches) -> list[int]:
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x
    for a, b, _ in batches:
        for x, y in zip(a.tolist(), b.tolist()):
            parent[find(x)] = find(y)
    roots = [find(i) for i in range(n)]
    first = {}
    return [first.setdefault(r, len(first)) for r in roots]


def test_spanning_checks_the_pairs_of_a_group_whose_first_row_matches_nothing():
    """Spanning mode checks a key group as a star from its first row, then the pairs still apart:
    row 0 shares a band with rows 1 and 2 but is otherwise far from both, while 1 and 2 are near
    copies; they must still join (as they do when every candidate pair is listed)."""
    b, r = lsh_index.lsh_params(0.8, 128)
    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 2**32, size=(4, 128), dtype=np.uint64).astype(np.uint32)
    sigs[1] = sigs[2]
    sigs[2, -5:] = rng.integers(0, 2**32, 5, dtype=np.uint64).astype(np.uint32)  # score 123/128
    sigs[0, :r] = sigs[1, :r]  # one shared band: a candidate of 1 and 2, score ~0.1
    full = list(lsh_index.candidate_pairs_ooc(sigs, 0.8, spanning=False))
    span = list(lsh_index.candidate_pairs_ooc(sigs, 0.8, spanning=True))
    assert _labels(4, span) == _labels(4, full) == [0, 1, 1, 2]
    assert [(int(x), int(y)) for a, c, _ in span for x, y in zip(a, c)] == [(1, 2)]
    # the same, with 1 and 2 at the threshold exactly (64 of 128 slots) and sharing no band but the
    # one row 0 heads: only the group's pair-by-pair check can join them, and it keeps the pair
    b, r = lsh_index.lsh_params(0.5, 128)
    sigs = rng.integers(0, 2**32, size=(3, 128), dtype=np.uint64).astype(np.uint32)
    same = list(range(r)) + [j * r + k for j in range(1, 15) for k in range(r - 1)] + list(range(b * r, 128))
    assert len(same) == 64
    sigs[2, same] = sigs[1, same]
    sigs[0, :r] = sigs[1, :r]
    span = list(lsh_index.candidate_pairs_ooc(sigs, 0.5, spanning=True))
    assert [(int(x), int(y), float(s)) for a, c, sc in span for x, y, s in zip(a, c, sc)] == [(1, 2, 0.5)]


def test_spanning_gives_the_components_of_every_verified_pair(corpus):
    ids, _, sigs = corpus
    full = list(lsh_index.candidate_pairs_ooc(sigs, 0.8, spanning=False))
    span = list(lsh_index.candidate_pairs_ooc(sigs, 0.8, spanning=True))
    n_span = sum(len(a) for a, _, _ in span)
    assert _labels(len(ids), span) == _labels(len(ids), full)
    assert n_span == len(ids) - len(set(_labels(len(ids), full))) < sum(len(a) for a, _, _ in full)


def test_gather_reads_mapped_rows_a_window_at_a_time_and_drops_each(tmp_path, monkeypatch):
    """Rows of a memory-mapped matrix come back equal to fancy indexing (repeats and order
    kept), read in file order, and every window they were read from is released: one fault
    maps a whole page-cache folio, so random rows left unreleased pin most of the file."""
    import mmap

    rng = np.random.default_rng(3)
    want = rng.integers(0, 2**32, size=(5000, 32), dtype=np.uint32)
    path = tmp_path / "sigs.bin"
    path.write_bytes(want.tobytes())
    monkeypatch.setattr(lsh_index, "_WINDOW_BYTES", 64 * 1024)  # 512 rows of 128 bytes
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        sigs = np.frombuffer(mm, dtype=np.uint32).reshape(want.shape)
        calls = []
        rows = np.concatenate([rng.integers(0, 5000, 700), [4999, 0, 4999]])
        got = lsh_index._gather(sigs, rows, release=lambda off, ln: calls.append((off, ln)))
        assert np.array_equal(got, want[rows])
        offsets = [off for off, _ in calls]
        assert offsets == sorted(set(offsets))  # file order, each window once
        for r in set(rows.tolist()):
            assert any(off <= r * 128 < off + ln for off, ln in calls)
        assert np.array_equal(lsh_index._gather(sigs, rows[:0], release=lambda *a: None), want[:0])
        # sparse rows: none in the first window, the last alone far past the others
        sparse = np.array([4999, 600, 1100, 600])
        calls = []
        assert np.array_equal(lsh_index._gather(sigs, sparse, release=lambda off, ln: calls.append((off, ln))),
                              want[sparse])
        assert calls == [(w * 512 * 128, 512 * 128) for w in (1, 2, 9)]
        del sigs, got
        mm.close()


def test_ast_subtree_candidates_out_of_core_match_datasketch_and_spanning_keeps_components():
    """The AST shape index runs through the out-of-core LSH with the collision as its check:
    without spanning, its subtree edges are exactly those of datasketch's in-memory index
    (candidates filtered by estimate, then `collide`); with spanning, fewer edges and the same
    clusters."""
    from ratchet.governance import ast_fingerprint as astfp
    from ratchet.governance.clusters import Shape, ast_pairs

    from .synthetic import mutant_tasks

    tasks = mutant_tasks(25)
    codes = [t["solution"] for t in tasks]
    shapes = [tuple(Shape.of(fp) for fp in astfp.fingerprint_code(c)) for c in codes]
    rank = np.arange(len(codes), dtype=np.int64)
    code = np.arange(len(codes), dtype=np.int64)

    def subtree_edges(pieces):
        return {(int(x), int(y)): round(float(s), 6) for a, b, reason, sc in pieces if reason == "ast_subtree"
                for x, y, s in zip(a, b, sc)}

    full = subtree_edges(ast_pairs(rank, code, shapes))
    # the oracle: datasketch's index over the distinct shapes, as the in-memory path did it
    uniq = list(dict.fromkeys(fp for fl in shapes for fp in fl))
    entries = [j for j, fp in enumerate(uniq) if fp.subtrees]
    low = {}
    for i, fl in enumerate(shapes):
        for fp in fl:
            low.setdefault(uniq.index(fp), i)
    sigs = signatures([" ".join(uniq[j].hashes()) for j in entries], k=1)
    want: dict = {}  # item pair -> the scores of the shape pairs behind it (one is kept)
    for a, b, _ in lsh_pairs([f"{j:09d}" for j in range(len(entries))], sigs,
                             threshold=max(0.05, astfp.SUBTREE_JACCARD - 0.15), backend="memory"):
        fa, fb = entries[int(a)], entries[int(b)]
        hit = astfp.collide(uniq[fa].fingerprint(), uniq[fb].fingerprint())
        x, y = sorted((low[fa], low[fb]))
        if hit and hit[0] == "subtree" and x != y:
            want.setdefault((x, y), set()).add(round(hit[1], 6))
    assert full.keys() == want.keys() and len(want) > 20
    assert all(s in want[p] for p, s in full.items())
    span = subtree_edges(ast_pairs(rank, code, shapes, spanning=True))
    assert span.keys() < full.keys()
    assert all(s in want[p] for p, s in span.items())  # each edge keeps its verified Jaccard
    labels = (np.arange(len(codes)) % 2).astype(np.int8)
    mixed = subtree_edges(ast_pairs(rank, code, shapes, labels=labels))
    assert mixed and all(labels[x] != labels[y] and s in want[(x, y)] for (x, y), s in mixed.items())
    kw = dict(id_col="task_id", text_col=None, code_cols=("solution",), key_cols={})
    c_full, _ = build_clusters(tasks, spanning=False, **kw)
    c_span, _ = build_clusters(tasks, spanning=True, **kw)
    assert c_full.equals(c_span)


def test_an_item_whose_own_fingerprints_collide_gets_no_edge_to_itself():
    """Two functions of one item that share subtrees are two shapes with the same smallest item:
    the pair they make joins nothing and is no edge (edges have a < b), whichever index finds it."""
    from ratchet.governance import ast_fingerprint as astfp
    from ratchet.governance.clusters import Shape, ast_pairs

    from .synthetic import mutant_tasks

    codes = [t["solution"] for t in mutant_tasks(25)]
    shapes = [tuple(Shape.of(fp) for fp in astfp.fingerprint_code(c)) for c in codes]
    # an item carrying two solutions whose shapes collide by shared subtrees
    a, b = next((i, j) for i in range(len(codes)) for j in range(i + 1, len(codes))
                if len(shapes[i]) == len(shapes[j]) == 1
                and (astfp.collide(shapes[i][0].fingerprint(), shapes[j][0].fingerprint()) or ("",))[0] == "subtree")
    shapes = [shapes[a] + shapes[b]] + shapes
    rank = np.arange(len(shapes), dtype=np.int64)
    code = np.arange(len(shapes), dtype=np.int64)
    for kw in ({}, {"spanning": True}, {"labels": (np.arange(len(shapes)) % 3).astype(np.int8)}):
        pieces = ast_pairs(rank, code, shapes, **kw)
        assert all((x < y).all() for x, y, _, _ in pieces), kw


def test_releasing_any_byte_range_of_mapped_signatures_keeps_them_intact(monkeypatch):
    """The LSH step drops the pages of each window it has read (`release(offset, length)`); a
    window's offset is a multiple of its row size (num_perm x 4 bytes), so not page-aligned when
    num_perm is not a power of two, and the last window runs past the file's end. Any range is
    accepted and the signatures read back unchanged (the mapping is read-only and file-backed)."""
    import mmap

    from ratchet.governance import clusters

    monkeypatch.setattr(clusters, "_SIG_MMAP_BYTES", 0)
    texts = [f"item {i} " + " ".join(f"w{(i * 7 + j) % 50}" for j in range(30)) for i in range(300)]
    rows = [{"record_id": f"r{i}", "prompt_text": t} for i, t in enumerate(texts)]
    data = clusters.read_items(rows, "record_id", "prompt_text", (), (), num_perm=100)
    assert data.release is not None and isinstance(data.sigs, np.ndarray)
    want = signatures(texts, num_perm=100)
    size = data.sigs.nbytes
    row_bytes = 100 * 4
    for offset, length in ((3 * row_bytes, 17 * row_bytes), (mmap.PAGESIZE + 1, 5), (size - row_bytes, 10 * size),
                           (0, size), (size - 1, 1)):
        assert offset % mmap.PAGESIZE or offset == 0
        data.release(offset, length)
        assert np.array_equal(data.sigs, want)
    data.release()
    assert np.array_equal(data.sigs, want)


@pytest.mark.parametrize("knob,value", [("_PAIR_BATCH", 5), ("_WINDOW_BYTES", 1024)])
def test_key_groups_that_straddle_reader_batches_give_the_same_pairs(corpus, monkeypatch, knob, value):
    """DuckDB hands the sorted band keys over in batches of `_PAIR_BATCH` rows, and a key group
    cut by a batch's end is held back and joined to the next batch. With batches of a few rows
    (most groups cut) the pairs, the components and the cross-label pairs are those of one batch.
    Likewise when no group's signatures fit a window (`_WINDOW_BYTES`: each check then gathers
    its own rows instead of the group's)."""
    ids, _, sigs = corpus
    labels = np.arange(len(ids)) % 3

    def run():
        full = sorted((int(a), int(b)) for x, y, _ in lsh_index.candidate_pairs_ooc(sigs, 0.8)
                      for a, b in zip(x, y))
        span = list(lsh_index.candidate_pairs_ooc(sigs, 0.8, spanning=True))
        cross = sorted((int(a), int(b)) for x, y, _ in lsh_index.candidate_pairs_ooc(sigs, 0.8, labels=labels)
                       for a, b in zip(x, y))
        return full, _labels(len(ids), span), cross

    want = run()
    assert len(want[0]) > 100 and want[2]
    monkeypatch.setattr(lsh_index, knob, value)
    assert run() == want


def test_fewer_than_two_rows_have_no_pairs(corpus):
    _, _, sigs = corpus
    for rows in (np.array([], np.int64), np.array([7])):
        assert list(lsh_index.candidate_pairs_ooc(sigs, 0.8, rows=rows)) == []
    assert list(lsh_index.candidate_pairs_ooc(sigs[:1], 0.8, spanning=True)) == []
    assert list(lsh_index.candidate_pairs_ooc(sigs[:0], 0.8)) == []


@pytest.mark.parametrize("backend", ["memory", "duckdb"])
def test_spanning_pairs_form_a_forest_and_a_pair_at_the_threshold_is_kept(backend):
    """Five copies of one signature: every pair without `spanning` (10), a tree with it (4: a pair
    whose ends earlier pairs already connect is not returned), on either backend. A pair whose
    estimated Jaccard equals the threshold exactly (64 of 128 values) is kept on both."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, 2**32, 128, dtype=np.uint64).astype(np.uint32)
    other = rng.integers(0, 2**32, 128, dtype=np.uint64).astype(np.uint32)
    sigs = np.stack([base] * 5 + [other])
    ids = [f"r{i}" for i in range(6)]
    assert len(lsh_pairs(ids, sigs, 0.8, spanning=False, backend=backend)) == 10
    tree = lsh_pairs(ids, sigs, 0.8, spanning=True, backend=backend)
    assert len(tree) == 4 and {x for p in tree for x in p[:2]} == set(ids[:5])
    half = base.copy()
    half[64:] = other[64:]
    assert lsh_pairs(["a", "b"], np.stack([base, half]), 0.5, backend=backend) == [("a", "b", 0.5)]


def test_the_memory_limit_and_spill_folder_given_else_from_the_environment_reach_duckdb(tmp_path, monkeypatch):
    """`memory_limit` and `tmp_dir` win over RATCHET_DEDUP_MEMORY_LIMIT and RATCHET_DEDUP_TMP,
    which win over 256MB and the system temp folder: the limit is what DuckDB is set to, the
    folder is where the band keys and DuckDB's spill files go (created if missing)."""
    import duckdb

    settings, folders = [], []

    class Recording:
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *a):
            if sql.startswith("set memory_limit"):
                settings.append(sql.split("'")[1])
            return self.con.execute(sql, *a)

        def __getattr__(self, name):
            return getattr(self.con, name)

    connect, mkdtemp = duckdb.connect, lsh_index.tempfile.mkdtemp
    monkeypatch.setattr(duckdb, "connect", lambda *a, **k: Recording(connect(*a, **k)))
    monkeypatch.setattr(lsh_index.tempfile, "mkdtemp", lambda **k: folders.append(k["dir"]) or mkdtemp(**k))
    sigs = signatures(["alpha beta gamma delta epsilon zeta eta theta"] * 2 + ["one two three four five six"])

    def run(**kw):
        return [(a.tolist(), c.tolist()) for a, c, _ in lsh_index.candidate_pairs_ooc(sigs, 0.8, **kw)]

    monkeypatch.delenv("RATCHET_DEDUP_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("RATCHET_DEDUP_TMP", raising=False)
    assert run() == [([0], [1])]
    monkeypatch.setenv("RATCHET_DEDUP_MEMORY_LIMIT", "200MB")
    monkeypatch.setenv("RATCHET_DEDUP_TMP", str(tmp_path / "env"))
    assert run() == [([0], [1])]
    assert run(memory_limit="300MB", tmp_dir=str(tmp_path / "given" / "deeper")) == [([0], [1])]
    assert settings == ["256MB", "200MB", "300MB"]
    assert folders == [None, str(tmp_path / "env"), str(tmp_path / "given" / "deeper")]
    assert (tmp_path / "env").is_dir() and not list((tmp_path / "given" / "deeper").iterdir())  # work removed


def test_whole_groups_keeps_each_key_group_in_one_chunk_whatever_the_batch_sizes():
    """DuckDB's reader may hand over batches of any size, one row included: every chunk holds
    whole key groups, and the chunks are the stream in order."""
    import pyarrow as pa

    keys = np.array([1, 1, 2, 3, 3, 3, 4, 5, 5], dtype=np.uint64)
    ids = np.arange(len(keys), dtype=np.int64) * 10
    for sizes in ([1] * 9, [1, 2, 1, 3, 2], [9], [2, 7], [5, 1, 3], [0, 4, 0, 5]):
        cuts = np.cumsum([0] + sizes)
        batches = [pa.record_batch([pa.array(keys[a:b]), pa.array(ids[a:b])], names=["key", "id"])
                   for a, b in zip(cuts[:-1], cuts[1:])]
        chunks = list(lsh_index._whole_groups(iter(batches)))
        assert np.array_equal(np.concatenate([k for k, _ in chunks]), keys)
        assert np.array_equal(np.concatenate([i for _, i in chunks]), ids)
        assert all(len(k) for k, _ in chunks)
        for (k1, _), (k2, _) in zip(chunks, chunks[1:]):
            assert k1[-1] != k2[0], sizes        # no group split across two chunks
