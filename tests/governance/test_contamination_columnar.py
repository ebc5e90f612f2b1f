"""The columnar contamination check (what the `contamination` asset check runs: items read in
batches, an item an int8 split label, MinHash and AST overlaps from the out-of-core LSH's
cross-label search) against the row-by-row version it replaced, kept here as an oracle: the same
verdict, counts and pairs on heavily contaminated random splits."""
from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ratchet.governance import lsh_index
from ratchet.governance.clusters import ast_edges, fingerprints, rows_of
from ratchet.governance.contamination import SPLIT_NAMES, contamination_report, report_rows, report_tables
from ratchet.governance.minhash import DEFAULT_SCHEME, DEFAULT_SEED, signatures

pytestmark = pytest.mark.governance


def column(data, name: str) -> list:
    if hasattr(data, "column_names"):
        return data.column(name).to_pylist() if name in data.column_names else [None] * data.num_rows
    return [r.get(name) for r in rows_of(data)]


def _reference(assignments, items, id_col="id", text_col="prompt_text", code_cols=("patch",), key_cols=None,
               threshold=0.8, seed=DEFAULT_SEED):
    """The row-by-row check: a dict per item, datasketch's in-memory index per split."""
    from datasketch import LeanMinHash, MinHashLSH

    key_cols = key_cols if key_cols is not None else {"repo": "repo", "issue_id": "issue"}
    splits_of = defaultdict(set)
    for r in rows_of(assignments):
        if r["split"] in SPLIT_NAMES:
            splits_of[str(r["id"])].add(r["split"])
    pairs = defaultdict(list)
    for i, ss in splits_of.items():
        if len(ss) > 1:
            s = sorted(ss, key=SPLIT_NAMES.index)
            pairs["exact_id"].append((i, i, s[0], s[1], 1.0))
    split1 = {i: min(ss, key=SPLIT_NAMES.index) for i, ss in splits_of.items()}
    all_ids = [str(x) for x in column(items, id_col)]
    keep = [n for n, i in enumerate(all_ids) if i in split1]
    ids = [all_ids[n] for n in keep]

    def add(kind, a, b, score):
        if split1[a] != split1[b]:
            pairs[kind].append((a, b, split1[a], split1[b], float(score)))

    for col, kind in key_cols.items():
        vals = column(items, col)
        first = defaultdict(dict)
        for n in keep:
            if vals[n] is not None and vals[n] != "":
                first[vals[n]].setdefault(split1[all_ids[n]], all_ids[n])
        for per in first.values():
            reps = list(per.values())
            for b in reps[1:]:
                add(kind, reps[0], b, 1.0)
    if text_col:
        texts = column(items, text_col)
        sub = [n for n in keep if texts[n] and texts[n].strip()]
        if len(sub) > 1:
            sigs = signatures([texts[n] for n in sub])
            by = defaultdict(list)
            for j, n in enumerate(sub):
                by[split1[all_ids[n]]].append(j)
            names = [s for s in SPLIT_NAMES if by.get(s)]
            for x, sx in enumerate(names):
                lsh = MinHashLSH(threshold=threshold, num_perm=sigs.shape[1])
                for i in by[sx]:
                    lsh.insert(i, LeanMinHash(seed=seed, hashvalues=sigs[i], scheme=DEFAULT_SCHEME), check_duplication=False)
                for sy in names[x + 1:]:
                    for j in by[sy]:
                        for i in lsh.query(LeanMinHash(seed=seed, hashvalues=sigs[j], scheme=DEFAULT_SCHEME)):
                            est = float(np.mean(sigs[i] == sigs[j]))
                            if est >= threshold:
                                add("minhash", all_ids[sub[i]], all_ids[sub[j]], est)
    for col in code_cols:
        codes = column(items, col)
        for a, b, _reason, score in ast_edges(ids, fingerprints([codes[n] for n in keep])):
            add("ast", a, b, score)
    involved = {p[x] for ps in pairs.values() for p in ps for x in (0, 1)}
    return {"involved": len(involved), "n": len(split1), "pairs": pairs}


def _oriented(kind, a, b, sa, sb):
    """A pair with its earlier split first (the columnar report's orientation)."""
    return (kind, a, b, sa, sb) if SPLIT_NAMES.index(sa) <= SPLIT_NAMES.index(sb) else (kind, b, a, sb, sa)


FUNCS = [
    "def add(a, b):\n    total = a + b\n    if total > 10:\n        return total - 1\n    return total\n",
    "def scale(xs, k):\n    out = []\n    for x in xs:\n        out.append(x * k)\n    return out\n",
    "def pick(d, key):\n    if key in d:\n        return d[key]\n    for k, v in d.items():\n        if v == key:\n            return k\n    return None\n",
]


def _items(rng: random.Random, n: int) -> list[dict]:
    vocab = [f"w{i}" for i in range(400)]
    bases = [[rng.choice(vocab) for _ in range(60)] for _ in range(n // 8)]
    out = []
    for i in range(n):
        w = list(rng.choice(bases))
        for _ in range(rng.randrange(3)):
            w[rng.randrange(len(w))] = f"v{rng.randrange(10_000)}"
        f = rng.choice(FUNCS)
        code = rng.choice([None, "", f, f.replace("x", "y").replace("total", "acc"),
                           f + "\ndef extra_%d(q):\n    return q + %d\n" % (i % 5, i % 3)])
        out.append({"id": f"item-{i:04d}", "prompt_text": rng.choice([" ".join(w)] * 8 + ["", "   ", None]),
                    "patch": code, "repo": rng.choice([None, "", "org/a", "org/b", "org/c", f"org/solo{i}"]),
                    "issue_id": rng.choice([None, f"i{rng.randrange(40)}"])})
    return out


def _assign(rng: random.Random, items: list[dict]) -> list[dict]:
    rows = []
    for it in items:
        r = rng.random()
        if r < 0.05:
            continue  # no split
        split = rng.choice(["train"] * 6 + ["val", "holdout", "excluded_contaminated"])
        rows.append({"id": it["id"], "split": split})
        if r > 0.97:
            rows.append({"id": it["id"], "split": rng.choice(SPLIT_NAMES)})  # one id, two splits
    rows += [{"id": "not-an-item", "split": "holdout"}, {"id": "not-an-item", "split": "train"}]
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_verdict_counts_and_pairs_as_the_row_version(seed, tmp_path):
    rng = random.Random(seed)
    items = _items(rng, 240)
    assignments = _assign(rng, items)
    ref = _reference(assignments, items)
    path = tmp_path / "items.parquet"
    pq.write_table(pa.Table.from_pylist(items), path, row_group_size=50)  # several batches
    for src in (items, pa.Table.from_pylist(items), str(path)):
        rep = contamination_report(assignments, src)
        assert rep["n_items"] == ref["n"]
        assert rep["n_overlapping_items"] == ref["involved"] > 0
        assert not rep["passed"]
        assert rep["overlap_fraction"] == ref["involved"] / ref["n"]
        got = {(r["kind"], r["a"], r["b"], r["split_a"], r["split_b"]) for r in report_rows(rep)}
        want = {_oriented(kind, *p[:4]) for kind, ps in ref["pairs"].items() for p in ps}
        assert got == want
        assert rep["counts"] == {k: len(ref["pairs"].get(k, [])) for k in rep["counts"]}
        assert all(rep["counts"][k] for k in ("exact_id", "repo", "issue", "minhash", "ast"))
        mh = {(r["a"], r["b"]): r["score"] for r in report_rows(rep, "minhash")}
        assert mh == {_oriented("minhash", *p[:4])[1:3]: p[4] for p in ref["pairs"]["minhash"]}
    # pairs sorted by kind, then splits, then ids; each kind's examples are its first pairs
    rows = report_rows(rep)
    order = list(rep["counts"])
    keyed = [(order.index(r["kind"]), SPLIT_NAMES.index(r["split_a"]), SPLIT_NAMES.index(r["split_b"]), r["a"], r["b"])
             for r in rows]
    assert keyed == sorted(keyed)
    assert rep["examples"]["minhash"] == [{k: v for k, v in r.items() if k != "kind"}
                                          for r in report_rows(rep, "minhash")[:5]]


def test_a_clean_split_passes_with_nothing_listed():
    rng = random.Random(5)
    items = _items(rng, 120)
    # every item in train, one unrelated item in holdout
    items.append({"id": "zzz", "prompt_text": "entirely different words here", "patch": None, "repo": "x/y", "issue_id": None})
    assignments = [{"id": it["id"], "split": "train"} for it in items[:-1]] + [{"id": "zzz", "split": "holdout"}]
    rep = contamination_report(assignments, items)
    assert rep["passed"] and rep["overlap_fraction"] == 0.0 and rep["pairs"].num_rows == 0
    assert rep["n_items"] == 121 and set(rep["counts"].values()) == {0}
    stamped = report_tables(rep, datetime(2026, 1, 1, tzinfo=timezone.utc), "run")
    assert stamped["contamination_pairs"].num_rows == 0
    assert stamped["contamination_report"][0]["passed"] is True


def test_keys_no_item_has_make_no_overlap():
    """Items whose repo and issue are all empty or missing share no key: nothing overlaps."""
    items = [{"id": f"i{k}", "prompt_text": f"unrelated text number {k} " + " ".join(f"w{k}x{j}" for j in range(12)),
              "patch": None, "repo": ["", None][k % 2], "issue_id": None} for k in range(6)]
    assignments = [{"id": it["id"], "split": ["train", "holdout"][k % 2]} for k, it in enumerate(items)]
    rep = contamination_report(assignments, items)
    assert rep["passed"] and rep["pairs"].num_rows == 0 and set(rep["counts"].values()) == {0}


def test_one_id_in_two_splits_is_an_exact_id_pair_however_few_the_rows():
    """The smallest contaminated assignment, one id in train and in holdout (two rows), is
    reported as an exact_id pair, as it is among other rows."""
    item = {"id": "t1", "prompt_text": "the only task", "patch": None, "repo": None, "issue_id": None}
    for assignments in ([{"id": "t1", "split": "train"}, {"id": "t1", "split": "holdout"}],
                        [{"id": "t0", "split": "val"}, {"id": "t1", "split": "holdout"}, {"id": "t1", "split": "train"}]):
        rep = contamination_report(assignments, [item])
        assert not rep["passed"] and rep["counts"]["exact_id"] == 1, rep["counts"]
        assert rep["pairs"].to_pylist() == [
            {"kind": "exact_id", "a": "t1", "b": "t1", "split_a": "train", "split_b": "holdout", "score": 1.0}]


def test_two_near_copies_in_two_splits_are_a_minhash_pair_with_nothing_else_to_compare():
    """Two items with text, one in train and one in holdout, their texts near copies: a minhash
    pair scored by the estimated similarity, and a repo they share is a key pair of score 1."""
    text = " ".join(f"word{j}" for j in range(80))
    items = [{"id": "a", "prompt_text": text, "patch": None, "repo": "o/r", "issue_id": None},
             {"id": "b", "prompt_text": text + " extra", "patch": None, "repo": "o/r", "issue_id": None}]
    rep = contamination_report([{"id": "a", "split": "train"}, {"id": "b", "split": "holdout"}], items)
    got = {r["kind"]: r for r in rep["pairs"].to_pylist()}
    assert set(got) == {"minhash", "repo"}, got
    assert 0.8 <= got["minhash"]["score"] < 1.0 and got["repo"]["score"] == 1.0, got
    assert (got["minhash"]["a"], got["minhash"]["split_a"], got["minhash"]["split_b"]) == ("a", "train", "holdout")


def test_no_assignment_is_no_overlap():
    """Before any split there is nothing to overlap: the fraction is 0 and the check passes."""
    items = [{"id": "a", "prompt_text": "some text here", "patch": None, "repo": "o/r", "issue_id": None}]
    for assignments in ([], pa.table({"id": pa.array([], pa.string()), "split": pa.array([], pa.string())})):
        rep = contamination_report(assignments, items)
        assert rep["passed"] and rep["overlap_fraction"] == 0.0 and rep["pairs"].num_rows == 0, rep


def _brute(sigs, rows, labels, threshold=0.8):
    """Every pair of `rows` sharing a band, labelled differently and reaching the threshold."""
    b, r = lsh_index.lsh_params(threshold, sigs.shape[1])
    bands = sigs[:, : b * r].reshape(len(sigs), b, r)
    want = {}
    in_rows = bands[rows]
    for i in rows.tolist():
        same = (in_rows == bands[i]).all(axis=2).any(axis=1)
        for j in rows[same].tolist():
            if i < j and labels[i] != labels[j]:
                est = float(np.mean(sigs[i] == sigs[j]))
                if est >= threshold:
                    want[(i, j)] = est
    return want


def test_cross_label_pairs_equal_brute_force(tmp_path):
    """`candidate_pairs_ooc(labels=...)`: exactly the band-sharing, verified pairs whose labels
    differ, each once, including a key group too large for one batch of pairs."""
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(3000)]
    texts = []
    for _ in range(300):
        base = [vocab[j] for j in rng.integers(0, len(vocab), 120)]
        for _ in range(int(rng.integers(1, 6))):
            w = list(base)
            for pos in rng.integers(0, len(w), int(rng.integers(0, 4))):
                w[pos] = f"v{rng.integers(10**6)}"
            texts.append(" ".join(w))
    texts += ["one long shared text " * 20] * 600  # one key group of 600 rows in every band
    sigs = signatures(texts)
    labels = rng.integers(0, 3, len(texts)).astype(np.int8)
    rows = np.sort(rng.choice(len(texts), len(texts) - 40, replace=False))
    got = [(a, c, s) for a, c, s in lsh_index.candidate_pairs_ooc(sigs, 0.8, rows=rows, labels=labels,
                                                                  tmp_dir=str(tmp_path), memory_limit="64MB")]
    pairs = {(int(x), int(y)): float(v) for a, c, s in got for x, y, v in zip(a, c, s)}
    assert sum(len(a) for a, _, _ in got) == len(pairs)  # each pair once
    assert pairs == pytest.approx(_brute(sigs, rows, labels))
    big = {k for k in pairs if k[0] >= len(texts) - 600}
    assert len(big) > lsh_index._PAIR_BATCH  # the group's pairs span batches
    assert list(tmp_path.iterdir()) == []
    # two passes (components of a spanning pass, then only the components holding two labels):
    # the same pairs over every row
    everything = np.arange(len(texts))
    in_all = _brute(sigs, everything, labels)
    two = {(int(x), int(y)): float(v) for a, c, s in lsh_index.mixed_component_pairs(sigs, 0.8, labels)
           for x, y, v in zip(a, c, s)}
    assert two == pytest.approx(in_all) and len(two) > len(pairs)
    one_label = np.zeros(len(texts), np.int8)
    one_label[-600:] = 1  # the big group's rows apart from the rest: no pair crosses
    assert list(lsh_index.mixed_component_pairs(sigs, 0.8, one_label)) == []
    with pytest.raises(ValueError, match="spanning"):
        list(lsh_index.candidate_pairs_ooc(sigs, 0.8, spanning=True, labels=labels))


def test_labels_past_a_byte_stay_apart():
    """Labels are stored in one byte only while they fit: two near copies labelled 0 and 256 (or
    1 and 257) are still a cross-label pair, not one label wrapped onto the other."""
    sigs = signatures(["the same words in the same order here"] * 2)
    for labels in ([0, 256], [257, 1]):
        got = [(int(x), int(y)) for a, c, _ in lsh_index.candidate_pairs_ooc(sigs, 0.8, labels=np.array(labels))
               for x, y in zip(a, c)]
        assert got == [(0, 1)]
    assert list(lsh_index.candidate_pairs_ooc(sigs, 0.8, labels=np.array([3, 3]))) == []


def test_a_component_of_two_rows_with_two_labels_is_searched():
    """The smallest mixed component, two near copies under two labels beside unrelated rows, still
    gets its second pass: the pair is listed."""
    texts = ["the same words in the same order here"] * 2 + [f"unrelated text number {i} of many" for i in range(4)]
    sigs = signatures(texts)
    got = [(int(x), int(y)) for a, c, _ in lsh_index.mixed_component_pairs(sigs, 0.8, np.array([0, 1, 0, 0, 1, 1]))
           for x, y in zip(a, c)]
    assert got == [(0, 1)]
