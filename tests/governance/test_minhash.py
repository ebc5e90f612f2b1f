import hashlib
import random
import struct

import numpy as np
import pytest
from datasketch import MinHash

from ratchet.governance import minhash
from ratchet.governance.minhash import lsh_pairs, normalise, shingles, signatures

pytestmark = pytest.mark.governance

WORDS = ["alpha", "Beta", "gamma", "δέλτα", "3", "42", "x_1", "naïve", "if", "(", ")", "→", "😀", "fix", "bug"]


def _docs(n, seed):
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 80))) + rng.choice(["", "\n\t  "]) for _ in range(n)]
    return docs + ["", None, "   ", "one", "Two  WORDS"]


_needs_c = pytest.mark.skipif(minhash._sha1batch is None, reason="C extension not built (pip install -e .)")
BACKENDS = [pytest.param("c", marks=_needs_c), "duckdb"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme", ["affine32", "affine64", "legacy"])
@pytest.mark.parametrize("num_perm,seed,k", [(128, 1, 5), (64, 7, 3), (256, 42, 1)])
def test_signatures_bit_identical_to_datasketch(scheme, num_perm, seed, k, backend):
    docs = _docs(150, seed)
    sig = signatures(docs, num_perm=num_perm, seed=seed, k=k, scheme=scheme, chunk_docs=37, threads=2, backend=backend)
    for i, d in enumerate(docs):
        m = MinHash(num_perm=num_perm, seed=seed, scheme=scheme)
        m.update_batch([s.encode("utf-8") for s in shingles(d, k)])
        assert sig.dtype == m.hashvalues.dtype
        assert np.array_equal(sig[i], m.hashvalues), (i, d)


def test_shingles_normalise_case_space_keep_numbers():
    assert normalise("  Fix\tBUG 42\n now ") == "fix bug 42 now"
    assert shingles("a b c", 5) == ["a b c"]
    assert shingles("", 5) == [] and shingles(None, 5) == []
    assert shingles("A b c d e F", 5) == ["a b c d e", "b c d e f"]


def test_lsh_pairs_find_planted_near_duplicate_with_estimated_jaccard():
    rng = random.Random(3)
    base = [" ".join(f"w{rng.randint(0, 10**6)}" for _ in range(200)) for _ in range(30)]
    near = base[0].replace(base[0].split()[100], "changed", 1)
    ids = [f"d{i:02d}" for i in range(30)] + ["near"]
    sig = signatures(base + [near])
    pairs = lsh_pairs(ids, sig, threshold=0.8)
    assert [(a, b) for a, b, _ in pairs] == [("d00", "near")]
    assert 0.85 <= pairs[0][2] <= 1.0


def test_string_view_boundaries_and_shared_template_bit_identical():
    # shingles of 11/12/13 bytes straddle Arrow's 12-byte inline limit (multi-byte chars too);
    # a shared template makes most shingle occurrences repeat across documents
    rng = random.Random(5)
    template = "you are a code repair agent read the issue and fix the bug"
    edge = ["abcdefghijk", "abcdefghijkl", "abcdefghijklm", "δέλτα12", "ééééé", "é" * 7, "x", "😀😀😀"]
    docs = [template + " " + " ".join(rng.choice(edge + WORDS) for _ in range(rng.randint(0, 30))) for _ in range(120)]
    docs += [rng.choice(edge) for _ in range(40)]
    for k in (1, 2, 5):
        sig = signatures(docs, k=k, chunk_docs=50, threads=1)
        for i, d in enumerate(docs):
            m = MinHash(num_perm=128, seed=1)
            m.update_batch([s.encode("utf-8") for s in shingles(d, k)])
            assert np.array_equal(sig[i], m.hashvalues), (k, i, d)


def _ref_le(msgs, nbytes):
    fmt = "<I" if nbytes == 4 else "<Q"
    return np.array([struct.unpack(fmt, hashlib.sha1(m).digest()[:nbytes])[0] for m in msgs],
                    dtype=np.uint32 if nbytes == 4 else np.uint64)


@_needs_c
@pytest.mark.parametrize("portable", [False, True])
def test_c_sha1_bit_identical_to_hashlib_every_length(portable):
    """Every byte length 0..300 (one- and multi-block, all padding cases around 55/56/64), as
    random bytes and as multi-byte UTF-8 text; 4- and 8-byte prefixes; both compress functions
    (SHA-NI when present, and the portable one); offsets form and overlapping spans."""
    sha1_le = minhash._sha1batch.sha1_le
    rng = random.Random(11)
    alphabet = "abc xyz0123_é→δ😀"
    msgs = [rng.randbytes(n) for n in range(301)]
    for n in range(301):  # valid UTF-8 strings, byte length n (pad the last char with ASCII)
        t = ""
        while len(t.encode()) + 4 <= n:
            t += rng.choice(alphabet)
        msgs.append((t + "a" * (n - len(t.encode()))).encode())
    msgs += [rng.randbytes(rng.randint(0, 1000)) for _ in range(500)]
    buf = b"".join(msgs)
    off = np.zeros(len(msgs) + 1, dtype=np.int64)
    off[1:] = np.cumsum([len(m) for m in msgs])
    for nbytes, dt in ((4, np.uint32), (8, np.uint64)):
        out = np.empty(len(msgs), dtype=dt)
        sha1_le(buf, off[:-1], off[1:], out, portable=portable)
        assert np.array_equal(out, _ref_le(msgs, nbytes))
    # overlapping, unordered spans over a numpy buffer; odd count (SHA-NI hashes pairs)
    data = np.frombuffer(" ".join(rng.choice(WORDS) for _ in range(400)).encode(), dtype=np.uint8)
    starts = np.array([rng.randrange(len(data)) for _ in range(999)], dtype=np.int64)
    ends = np.minimum(starts + np.array([rng.choice([0, 1, 30, 55, 56, 64, 120]) for _ in starts]), len(data))
    out = np.empty(len(starts), dtype=np.uint32)
    sha1_le(data, starts, ends, out, portable=portable)
    assert np.array_equal(out, _ref_le([data[a:b].tobytes() for a, b in zip(starts, ends)], 4))


@_needs_c
def test_c_sha1_rejects_bad_input():
    sha1_le = minhash._sha1batch.sha1_le
    out = np.empty(1, dtype=np.uint32)
    with pytest.raises(ValueError):  # span past the end of the buffer
        sha1_le(b"abc", np.array([0], np.int64), np.array([4], np.int64), out)
    with pytest.raises(ValueError):  # negative / reversed span
        sha1_le(b"abc", np.array([2], np.int64), np.array([1], np.int64), out)
    with pytest.raises(ValueError):  # length mismatch
        sha1_le(b"abc", np.array([0, 1], np.int64), np.array([1, 2], np.int64), out)
    with pytest.raises(TypeError):  # int32 spans
        sha1_le(b"abc", np.array([0], np.int32), np.array([1], np.int32), out)
    with pytest.raises(BufferError):  # read-only output
        sha1_le(b"abc", np.array([0], np.int64), np.array([1], np.int64), b"\0\0\0\0")


def test_fallback_without_extension_matches_datasketch(monkeypatch):
    """No compiled extension (build failed or skipped): the default path is DuckDB, still exact."""
    monkeypatch.setattr(minhash, "_sha1batch", None)
    monkeypatch.setattr(minhash, "HASH_BACKEND", "duckdb")
    docs = _docs(60, 9)
    sig = signatures(docs, chunk_docs=16, threads=2)
    for i, d in enumerate(docs):
        m = MinHash(num_perm=128, seed=1)
        m.update_batch([s.encode("utf-8") for s in shingles(d)])
        assert np.array_equal(sig[i], m.hashvalues), (i, d)
    with pytest.raises(RuntimeError):
        signatures(docs, backend="c")


def test_an_extension_that_does_not_import_falls_back_to_duckdb():
    """Where `_sha1batch` did not build, importing minhash picks DuckDB by itself and says so
    (the test above patches the module; this one makes the import fail, in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['ratchet.governance._sha1batch'] = None\n"   # import -> ImportError
            "from ratchet.governance import minhash\n"
            "print(minhash._sha1batch, minhash.HASH_BACKEND, minhash.HASH_IMPL)\n"
            "print(minhash.signatures(['a b c d e f'], num_perm=4)[0].tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, sig = out.stdout.splitlines()
    assert first == "None duckdb duckdb"
    assert sig == str(signatures(["a b c d e f"], num_perm=4)[0].tolist())


def test_hash_backend_reports_the_path_in_use():
    assert minhash.HASH_BACKEND == ("c" if minhash._sha1batch is not None else "duckdb")
    with pytest.raises(ValueError):
        signatures(["a b"], backend="md5")


def test_the_defaults_are_the_documented_ones():
    """The shingle size, permutations and seed decide which items are near-duplicates, so which
    clusters a locked split holds: a default that drifts from docs/governance.md moves splits."""
    import inspect
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs/governance.md").read_text()
    said = re.search(r"`minhash\.signatures\(texts, num_perm=(\d+), seed=(\d+), k=(\d+)\)`: MinHash of word (\d+)-shingles", doc)
    assert said, "docs/governance.md no longer states the MinHash defaults"
    num_perm, seed, k, k_words = map(int, said.groups())
    assert (minhash.DEFAULT_NUM_PERM, minhash.DEFAULT_SEED, minhash.DEFAULT_SHINGLE) == (num_perm, seed, k) and k == k_words
    params = inspect.signature(signatures).parameters
    assert (params["num_perm"].default, params["seed"].default, params["k"].default) == (num_perm, seed, k)
    assert len(shingles(" ".join(f"w{i}" for i in range(k + 1)))) == 2   # k-word windows


def test_the_reported_hash_implementation_is_the_one_in_use():
    """Bench records name the SHA-1 implementation that produced their numbers."""
    if minhash._sha1batch is None:
        assert (minhash.HASH_BACKEND, minhash.HASH_IMPL) == ("duckdb", "duckdb")
    else:
        assert minhash.HASH_BACKEND == "c"
        assert minhash.HASH_IMPL == f"c/{minhash._sha1batch.IMPL}" and minhash._sha1batch.IMPL in ("sha-ni", "portable")


def test_shingle_views_are_valid_arrow_with_zero_padded_inline_values():
    """The DuckDB path hands DuckDB a string_view array built by hand: it must be valid Arrow
    (an inline value of 12 bytes or fewer is zero padded, which comparisons of views rely on) and
    hold exactly the reference shingles, short, 12-byte and long alike."""
    texts = ["a b c d e f g", "hello world foo bar baz qux", "abcde fghijk lmnopqrstuvwxyz", "x", "twelve bytes"]
    for k in (1, 2, 5):
        arr, counts = minhash._chunk_shingles([normalise(t) for t in texts], k)
        arr.validate(full=True)
        assert arr.to_pylist() == [s for t in texts for s in shingles(t, k)]
        assert counts.tolist() == [len(shingles(t, k)) for t in texts]


@pytest.mark.parametrize("backend", ["c", "duckdb"])
def test_a_chunk_of_texts_without_shingles_gets_the_empty_signature_on_both_backends(backend):
    """A chunk holding only empty or blank texts (no shingle to hash) gives each text the
    empty-set signature, as datasketch does, on either hash backend, beside chunks that have text."""
    if backend == "c" and minhash._sha1batch is None:
        pytest.skip("the C extension did not build here")
    texts = ["", None, "   ", "\n", "some words to shingle here and there"]
    got = signatures(texts, backend=backend, chunk_docs=2)
    for i, t in enumerate(texts):
        m = MinHash(num_perm=128, seed=1)
        m.update_batch([s.encode("utf-8") for s in shingles(t)])
        assert np.array_equal(got[i], m.hashvalues), (backend, i)


def test_docs_of_thousands_of_shingles_are_hashed_in_whole_doc_blocks():
    """Blocks hold whole docs up to the block width (the widest doc at least): docs of several
    thousand shingles each, alone or beside short ones, give datasketch's signatures."""
    rng = random.Random(4)
    texts = [" ".join(f"w{rng.randrange(100000)}" for _ in range(n)) for n in (4000, 3500, 5, 4500, 7000, 12)]
    got = signatures(texts)
    for i, t in enumerate(texts):
        m = MinHash(num_perm=128, seed=1)
        m.update_batch([s.encode("utf-8") for s in shingles(t)])
        assert np.array_equal(got[i], m.hashvalues), i


@pytest.mark.parametrize("scheme, dtype", [("affine32", np.uint32), ("legacy", np.uint64), ("affine64", np.uint64)])
def test_no_texts_give_no_signatures_of_the_schemes_dtype(scheme, dtype):
    """No texts: a matrix of no rows, num_perm wide, in the dtype the scheme's signatures have
    (stacked with other chunks' signatures, it must add nothing and change no dtype)."""
    got = signatures([], num_perm=64, scheme=scheme)
    assert got.shape == (0, 64) and got.dtype == dtype
    assert signatures(["some words here"], num_perm=64, scheme=scheme).dtype == dtype


def test_estimated_jaccard_is_datasketchs_row_by_row_and_lsh_pairs_default_to_the_documented_threshold():
    import inspect
    from pathlib import Path

    from ratchet.governance.minhash import estimated_jaccard

    texts = ["a b c d e f g h i j", "a b c d e f g h i k", "z y x w v u t s r q"]
    sig = signatures(texts)
    ms = []
    for t in texts:
        m = MinHash(num_perm=128, seed=1)
        m.update_batch([s.encode("utf-8") for s in shingles(t)])
        ms.append(m)
    assert estimated_jaccard(sig[0], sig[1]) == pytest.approx(ms[0].jaccard(ms[1]))
    rows = estimated_jaccard(sig[[0, 0, 2]], sig[[1, 0, 0]])
    assert rows.shape == (3,) and rows.tolist() == pytest.approx([ms[0].jaccard(ms[1]), 1.0, ms[2].jaccard(ms[0])])
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs/governance.md").read_text().split())
    assert "(`minhash.lsh_pairs`, threshold 0.8 by default)" in doc
    assert inspect.signature(lsh_pairs).parameters["threshold"].default == 0.8


def test_an_unknown_scheme_or_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown MinHash scheme 'affine16'"):
        signatures(["a b c"], scheme="affine16")
    with pytest.raises(ValueError, match="unknown hash backend 'gpu'"):
        signatures(["a b c"], backend="gpu")
    with pytest.raises(ValueError, match="unknown LSH backend 'redis'"):
        lsh_pairs(["a", "b"], signatures(["a b c", "a b c"]), backend="redis")


@pytest.mark.parametrize("backend", ["duckdb", "memory"])
def test_fewer_than_two_texts_have_no_pairs_on_either_lsh_backend(backend):
    for ids in ([], ["only"]):
        sig = signatures(["the same words again"] * len(ids), num_perm=64)
        assert lsh_pairs(ids, sig, backend=backend) == []
    # and two copies of one text are a pair on both
    assert lsh_pairs(["a", "b"], signatures(["the same words again"] * 2, num_perm=64), backend=backend) == [("a", "b", 1.0)]
