"""Contamination gate: recompute, from the raw items (not from the cluster ids the split was
built on), every way two splits can overlap, and pass only at exactly 0.0%.

Kinds: exact_id (one id in two splits), repo, issue (a key value in two splits), minhash
(estimated prompt Jaccard >= threshold across splits, datasketch LSH), ast (skeleton or
shape-set collision across splits). Items `excluded_contaminated` are in no split.

Report (dict, JSON-serialisable):
  passed (bool), overlap_fraction (float: items in any cross-split overlap / items in splits),
  n_items, n_overlapping_items, threshold, counts {kind: pairs}, examples {kind: [pair, ...]}
  with pair = {a, b, split_a, split_b, score}. `report_rows` flattens pairs for a table.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from .clusters import ast_edges, column, fingerprints, rows_of
from .minhash import (
    DEFAULT_NUM_PERM,
    DEFAULT_SCHEME,
    DEFAULT_SEED,
    DEFAULT_SHINGLE,
    signatures,
)

KINDS = ("exact_id", "repo", "issue", "minhash", "ast")
SPLIT_NAMES = ("train", "val", "holdout")


def _cross_minhash(ids, sigs, split, threshold, seed):
    """Pairs across splits only: index one split, query with the later ones."""
    from datasketch import LeanMinHash, MinHashLSH

    out = []
    by = defaultdict(list)
    for i, s in enumerate(split):
        by[s].append(i)
    names = [s for s in SPLIT_NAMES if by.get(s)]
    for x, sx in enumerate(names):
        lsh = MinHashLSH(threshold=threshold, num_perm=sigs.shape[1])
        for i in by[sx]:
            lsh.insert(i, LeanMinHash(seed=seed, hashvalues=sigs[i], scheme=DEFAULT_SCHEME), check_duplication=False)
        for sy in names[x + 1:]:
            for j in by[sy]:
                cands = lsh.query(LeanMinHash(seed=seed, hashvalues=sigs[j], scheme=DEFAULT_SCHEME))
                for i in cands:
                    est = float(np.mean(sigs[i] == sigs[j]))
                    if est >= threshold:
                        out.append((ids[i], ids[j], est))
    return out


def contamination_report(
    assignments: Any,
    items: Any,
    id_col: str = "id",
    text_col: str | None = "prompt_text",
    code_cols: Sequence[str] = ("patch",),
    key_cols: dict[str, str] | None = None,
    threshold: float = 0.8,
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    k: int = DEFAULT_SHINGLE,
    max_examples: int = 5,
) -> dict:
    """`assignments`: rows with id, split (split_assignments). `items`: rows with `id_col` and
    the text / code / key columns. key_cols maps column -> kind (default repo, issue_id)."""
    key_cols = key_cols if key_cols is not None else {"repo": "repo", "issue_id": "issue"}
    splits_of: dict[str, set] = defaultdict(set)
    for r in rows_of(assignments):
        if r["split"] in SPLIT_NAMES:
            splits_of[str(r["id"])].add(r["split"])
    pairs: dict[str, list[dict]] = {k_: [] for k_ in KINDS}
    for i, ss in splits_of.items():
        if len(ss) > 1:
            s = sorted(ss, key=SPLIT_NAMES.index)
            pairs["exact_id"].append({"a": i, "b": i, "split_a": s[0], "split_b": s[1], "score": 1.0})
    split1 = {i: min(ss, key=SPLIT_NAMES.index) for i, ss in splits_of.items()}

    all_ids = [str(x) for x in column(items, id_col)]
    keep = [n for n, i in enumerate(all_ids) if i in split1]
    ids = [all_ids[n] for n in keep]

    def add(kind, a, b, score):
        sa, sb = split1[a], split1[b]
        if sa != sb:
            pairs[kind].append({"a": a, "b": b, "split_a": sa, "split_b": sb, "score": float(score)})

    for col, kind in key_cols.items():
        vals = column(items, col)
        first: dict[Any, dict[str, str]] = defaultdict(dict)  # key -> split -> first id
        for n in keep:
            v = vals[n]
            if v is not None and v != "":
                first[v].setdefault(split1[all_ids[n]], all_ids[n])
        for v, per in first.items():
            reps = list(per.values())
            for b in reps[1:]:
                add(kind, reps[0], b, 1.0)
    if text_col and len(ids) > 1:
        texts = column(items, text_col)
        sub = [n for n in keep if texts[n] and texts[n].strip()]
        if len(sub) > 1:
            sigs = signatures([texts[n] for n in sub], num_perm=num_perm, seed=seed, k=k)
            sub_ids = [all_ids[n] for n in sub]
            for a, b, est in _cross_minhash(sub_ids, sigs, [split1[i] for i in sub_ids], threshold, seed):
                add("minhash", a, b, est)
    for col in code_cols:
        codes = column(items, col)
        for a, b, _reason, score in ast_edges(ids, fingerprints([codes[n] for n in keep]), seed=seed, num_perm=num_perm):
            add("ast", a, b, score)

    involved = {p[x] for ps in pairs.values() for p in ps for x in ("a", "b")}
    n = len(split1)
    frac = len(involved) / n if n else 0.0
    return {
        "passed": frac == 0.0 and not any(pairs.values()),
        "overlap_fraction": frac,
        "n_items": n,
        "n_overlapping_items": len(involved),
        "threshold": threshold,
        "counts": {kind: len(ps) for kind, ps in pairs.items()},
        "examples": {kind: ps[:max_examples] for kind, ps in pairs.items()},
        "pairs": pairs,
    }


def report_rows(report: dict) -> list[dict]:
    """One row per overlapping pair: kind, a, b, split_a, split_b, score."""
    return [{"kind": kind, **p} for kind, ps in report["pairs"].items() for p in ps]


def report_tables(report: dict, checked_at, run_id: str | None) -> dict[str, list[dict]]:
    """The rows one check run appends: `contamination_report` (the verdict) and `contamination_pairs`."""
    stamp = {"checked_at": checked_at, "dagster_run_id": run_id}
    return {"contamination_report": [{**stamp, **{k: report[k] for k in (
                "passed", "overlap_fraction", "n_items", "n_overlapping_items", "threshold", "counts", "examples")}}],
            "contamination_pairs": [{**p, **stamp} for p in report_rows(report)]}
