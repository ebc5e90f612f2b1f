import random

import numpy as np
import pytest
from datasketch import MinHash

from ratchet.governance.minhash import lsh_pairs, normalise, shingles, signatures

pytestmark = pytest.mark.governance

WORDS = ["alpha", "Beta", "gamma", "δέλτα", "3", "42", "x_1", "naïve", "if", "(", ")", "→", "😀", "fix", "bug"]


def _docs(n, seed):
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 80))) + rng.choice(["", "\n\t  "]) for _ in range(n)]
    return docs + ["", None, "   ", "one", "Two  WORDS"]


@pytest.mark.parametrize("scheme", ["affine32", "affine64", "legacy"])
@pytest.mark.parametrize("num_perm,seed,k", [(128, 1, 5), (64, 7, 3), (256, 42, 1)])
def test_signatures_bit_identical_to_datasketch(scheme, num_perm, seed, k):
    docs = _docs(150, seed)
    sig = signatures(docs, num_perm=num_perm, seed=seed, k=k, scheme=scheme, chunk_docs=37, threads=2)
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
