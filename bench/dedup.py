"""Dedup bench: vectorised MinHash vs datasketch, and cluster+split at scale.

  .venv/bin/python bench/dedup.py [--docs 50000] [--baseline-docs 5000] [--cluster-n 1000000]

1. Signatures/s on one corpus of --docs synthetic documents (~200 word 5-shingles each,
   uniform 50k-word vocabulary, so shingles rarely repeat: no cache helps us). Ours runs on
   the whole corpus from raw text (normalise + shingle + hash + permute). The baseline,
   `datasketch.MinHash(num_perm=128, seed=1).update_batch(encoded shingles)` per document,
   runs on the first --baseline-docs documents with shingles prepared outside the timer
   (stricter for us) and is reported as a rate; every baseline signature is compared with ours.
2. End-to-end cluster (MinHash LSH + AST fingerprints + same repo/issue) and split of
   --cluster-n synthetic trajectories (near-duplicate prompt families, patches drawn from a
   pool of mutated functions), wall time and peak RSS.
Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def corpus(n: int, seed: int = 0, words_per_doc: int = 204) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(50_000)], dtype=object)
    ids = rng.integers(0, len(vocab), size=(n, words_per_doc))
    return [" ".join(row) for row in vocab[ids]]


SYSTEM = ("You are a code repair agent. Read the issue, localise the fault, propose a minimal edit, "
          "apply it and run the tests. Never touch tests or CI files. Tools: localize, propose_edits, apply_edit.")


_LEAVES = ["x", "y", "n", "0", "1", "'a'", "xs[i]", "len(xs)"]


def _expr(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(_LEAVES)
    a, b = _expr(rng, depth - 1), _expr(rng, depth - 1)
    return rng.choice([f"({a} + {b})", f"({a} < {b})", f"f({a}, {b})", f"[{a} for i in {b}]", f"({a} if {b} else n)",
                       f"{a}[{b}]", f"not {a}", f"({a} and {b})", f"g({a})", f"{{{a}: {b}}}"])


def random_function(rng: random.Random, name: str) -> str:
    """A structurally random function: distinct tasks get distinct code (the 12 test problems
    alone would collapse 1M trajectories into 12 clusters)."""
    body = []
    for _ in range(rng.randint(4, 7)):
        kind = rng.random()
        if kind < 0.5:
            body.append(f"    x = {_expr(rng, 3)}")
        elif kind < 0.75:
            body.append(f"    for i in range(n):\n        y = {_expr(rng, 2)}")
        else:
            body.append(f"    if {_expr(rng, 2)}:\n        return {_expr(rng, 2)}")
    return f"def {name}(xs, n):\n" + "\n".join(body) + "\n    return x\n"


def trajectories(n: int, seed: int = 0) -> list[dict]:
    """n trajectories over n/50 tasks; prompts of one task differ in a word; every run of a task
    ends in the task's patch (a structurally random function), so ~n/50 distinct patches."""
    rng = random.Random(seed)
    n_tasks = max(1, n // 50)
    words = [f"t{i}" for i in range(20_000)]
    tasks = []
    for t in range(n_tasks):
        issue = " ".join(rng.choice(words) for _ in range(120))
        name = f"fn{t}"
        tasks.append((f"task-{t:07d}", f"org/repo{t % (n_tasks // 3 + 1)}", f"issue-{t}", issue,
                      f"slice{t % 4}", random_function(rng, name)))
    out = []
    for i in range(n):
        tid, repo, issue_id, issue, name, code = tasks[i % n_tasks]
        w = issue.split(" ")
        w[rng.randrange(len(w))] = f"v{rng.randrange(1000)}"  # a per-run token (paths, line numbers)
        patch = f"--- a/{tid}.py\n+++ b/{tid}.py\n@@ -1,10 +1,10 @@\n" + "\n".join("+" + ln for ln in code.splitlines())
        out.append({"record_id": f"r{i:08d}", "task_id": tid, "repo": repo, "issue_id": issue_id,
                    "prompt_text": SYSTEM + " " + " ".join(w), "patch": patch, "slice": name})
    return out


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--baseline-docs", type=int, default=5_000)
    ap.add_argument("--cluster-n", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    from datasketch import MinHash

    from ratchet.governance.clusters import build_clusters
    from ratchet.governance.minhash import shingles, signatures
    from ratchet.governance.splits import assign_splits

    texts = corpus(args.docs)
    nb = min(args.baseline_docs, args.docs)
    prepared = [[s.encode() for s in shingles(t)] for t in texts[:nb]]
    mean_sh = float(np.mean([len(p) for p in prepared]))
    t0 = time.perf_counter()
    base = []
    for sh in prepared:
        m = MinHash(num_perm=128, seed=1)
        m.update_batch(sh)
        base.append(m.hashvalues)
    base_s = time.perf_counter() - t0
    base_per_s = nb / base_s

    signatures(texts[:200], threads=args.threads)  # warm imports / DuckDB
    t0 = time.perf_counter()
    ours = signatures(texts, threads=args.threads)
    ours_s = time.perf_counter() - t0
    ours_per_s = args.docs / ours_s
    t0 = time.perf_counter()
    signatures(texts[: min(args.docs, 20_000)], threads=1)
    one_thread_per_s = min(args.docs, 20_000) / (time.perf_counter() - t0)
    identical = bool(np.array_equal(np.vstack(base), ours[:nb]))

    cn = args.cluster_n
    t0 = time.perf_counter()
    trajs = trajectories(cn)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    clusters, edges = build_clusters(trajs, id_col="record_id", text_col="prompt_text", code_cols=("patch",))
    t_cluster = time.perf_counter() - t0
    slice_of = [t["slice"] for t in trajs]
    del trajs
    items = [{"id": i, "cluster_id": c, "slice": s} for i, c, s in
             zip(clusters.column("id").to_pylist(), clusters.column("cluster_id").to_pylist(), slice_of)]
    t1 = time.perf_counter()
    split = assign_splits(items)
    t_split = time.perf_counter() - t1
    total = t_cluster + t_split
    n_clusters = len(set(clusters.column("cluster_id").to_pylist()))
    counts = {s: split.column("split").to_pylist().count(s) for s in ("train", "val", "holdout")}

    rows = [
        ("corpus", f"{args.docs} docs, {mean_sh:.0f} shingles/doc (k=5), 128 perms, seed 1"),
        ("baseline datasketch update_batch", f"{base_per_s:,.0f} docs/s ({nb} docs, 1 thread, shingles prepared)"),
        ("ours (text -> signature)", f"{ours_per_s:,.0f} docs/s ({args.threads} threads); {one_thread_per_s:,.0f} docs/s on 1 thread"),
        ("ratio", f"{ours_per_s / base_per_s:.1f}x ({one_thread_per_s / base_per_s:.1f}x thread for thread)"),
        ("identical", f"{identical} ({nb} signatures x 128 values compared)"),
        ("cluster+split", f"{cn:,} trajectories: cluster {t_cluster:.1f} s + split {t_split:.1f} s = {total:.1f} s "
                          f"(generation {gen_s:.1f} s not counted)"),
        ("clusters / edges", f"{n_clusters:,} clusters, {edges.num_rows:,} edges; splits {counts}"),
        ("peak RSS", f"{peak_mb():,.0f} MB"),
        ("cpus", f"{os.cpu_count()} (shared with other work: timings are noisy)"),
    ]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    out = {"bench": "dedup", "docs": args.docs, "ours_per_s": round(ours_per_s, 1),
           "baseline": "datasketch.MinHash.update_batch", "baseline_per_s": round(base_per_s, 1),
           "ratio": round(ours_per_s / base_per_s, 2), "identical": identical,
           "cluster_split_n": cn, "cluster_split_1m_s": round(total * 1_000_000 / cn, 1), "peak_mb": round(peak_mb(), 1)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
