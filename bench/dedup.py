"""Dedup bench: vectorised MinHash vs datasketch, and cluster+split at scale.

  .venv/bin/python bench/dedup.py [--docs 50000] [--baseline-docs 5000] [--cluster-n 1000000]
                                 [--peak-1m] [--size-10m] [--cluster-only]

1. Signatures/s on two corpora of --docs synthetic documents (~200 word 5-shingles each):
   "prompt-log" (headline): an agent prompt log, i.e. one of 6 scaffold templates (80 words of
   system prompt / tool instructions) + a task's issue text (124 words from a 50k vocabulary),
   8 rollouts per task differing in one per-run word, shuffled (~40% of shingle occurrences are
   template boilerplate; real scaffolds are usually longer than the issue, so this is on the
   low side); and "uniform" (worst case: 204 words from a uniform 50k vocabulary, no shingle
   repeats). Ours runs on each whole corpus from raw text (normalise + shingle + hash +
   permute); it hashes every shingle occurrence, so repetition does not help it. The baseline,
   `datasketch.MinHash(num_perm=128, seed=1).update_batch(encoded shingles)` per document,
   runs on the first --baseline-docs documents with shingles prepared outside the timer
   (stricter for us) and is reported as a rate; every baseline signature is compared with ours.
2. End-to-end cluster (MinHash LSH + AST fingerprints + same repo/issue) and split of
   --cluster-n synthetic trajectories (near-duplicate prompt families, patches drawn from a
   pool of mutated functions), wall time and peak RSS, each size in its own child process
   (input generation included in the peak). --peak-1m: peak_mb_1m; --size-10m:
   cluster_split_10m_s and peak_mb_10m.
3. --contamination: each cluster+split child then runs the contamination check on its split
   (what the blocking `contamination` asset check computes: every cross-split overlap from the
   raw items), streamed from the same Parquet file; its wall time and the peak RSS sampled while
   it runs (contamination_1m_s / contamination_peak_mb_1m, and _10m with --size-10m). The split
   is built from the clusters, so the check must pass.
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


def prompt_corpus(n: int, seed: int = 0, templates: int = 6, template_words: int = 80,
                  issue_words: int = 124, rollouts: int = 8) -> list[str]:
    """Agent prompt log: template (shared boilerplate) + task issue text, `rollouts` runs per task
    each with one per-run word (a path, a line number), in shuffled order."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(50_000)], dtype=object)
    tvocab = np.array([f"t{i}" for i in range(5_000)], dtype=object)
    tmpl = [" ".join(tvocab[rng.integers(0, len(tvocab), template_words)]) for _ in range(templates)]
    n_tasks = max(1, n // rollouts)
    issues = vocab[rng.integers(0, len(vocab), size=(n_tasks, issue_words))]
    out = []
    for i in rng.permutation(n):
        w = list(issues[i % n_tasks])
        w[rng.integers(issue_words)] = f"v{rng.integers(1000)}"
        out.append(tmpl[rng.integers(templates)] + " " + " ".join(w))
    return out


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


def trajectory_batches(n: int, seed: int = 0, batch: int = 10_000):
    """n trajectories over n/50 tasks, as lists of dicts of at most `batch` rows; prompts of one
    task differ in a word; every run of a task ends in the task's patch (a structurally random
    function), so ~n/50 distinct patches."""
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
        if len(out) == batch:
            yield out
            out = []
    if out:
        yield out


def trajectories(n: int, seed: int = 0) -> list[dict]:
    return [t for b in trajectory_batches(n, seed) for t in b]


def write_trajectories(n: int, path: str, seed: int = 0) -> None:
    """The same trajectories written to Parquet batch by batch: the input lives on disk, as the
    warehouse table does for the dedup asset, which streams it into build_clusters."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for rows in trajectory_batches(n, seed):
        tbl = pa.Table.from_pylist(rows)
        writer = writer or pq.ParquetWriter(path, tbl.schema)
        writer.write_table(tbl)
    if writer:
        writer.close()


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _child(n: int, phases: bool = False, contamination: bool = False) -> None:
    """Generate n trajectories to a Parquet file, cluster them (streamed from that file, as the
    dedup asset streams its warehouse query) and split them; print timings and this process's
    peak. With `phases`, also the peak RSS of each phase (sampled every 20 ms)."""
    import tempfile
    import threading

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ratchet.governance import clusters as cl
    from ratchet.governance.splits import assign_splits

    phase = {"name": "generate", "peak": {}, "contamination": False, "contamination_peak": 0.0}

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def sample():
        while True:
            rss = rss_mb()
            if phase["contamination"]:
                phase["contamination_peak"] = max(phase["contamination_peak"], rss)
            else:
                p = phase["name"]
                phase["peak"][p] = max(phase["peak"].get(p, 0.0), rss)
            time.sleep(0.02)

    if phases or contamination:
        threading.Thread(target=sample, daemon=True).start()
    if phases:
        from ratchet.governance import lsh_index

        def mark(mod, fn, name):
            f = getattr(mod, fn)

            def inner(*a, **kw):
                prev, phase["name"] = phase["name"], name
                try:
                    return f(*a, **kw)
                finally:
                    phase["name"] = prev
            setattr(mod, fn, inner)

        def mark_gen(mod, fn, name, after):
            f = getattr(mod, fn)

            def inner(*a, **kw):
                phase["name"] = name
                yield from f(*a, **kw)
                phase["name"] = after
            setattr(mod, fn, inner)

        mark(cl, "signatures", "read + signatures")
        mark_gen(lsh_index, "candidate_pairs_ooc", "lsh (band keys, DuckDB, verify)", "cluster: ast + keys")
        mark(cl, "ast_pairs", "cluster: ast + keys")
        mark(cl, "_component_labels", "components")
    with tempfile.TemporaryDirectory(prefix="ratchet-dedup-bench-", dir=os.environ.get("RATCHET_DEDUP_TMP")) as tmp:
        path = os.path.join(tmp, "trajectories.parquet")
        t0 = time.perf_counter()
        write_trajectories(n, path)
        gen_s, gen_mb = time.perf_counter() - t0, peak_mb()
        phase["name"] = "read + signatures"
        t0 = time.perf_counter()
        clusters, edges = cl.build_clusters(path, id_col="record_id", text_col="prompt_text", code_cols=("patch",))
        t_cluster = time.perf_counter() - t0
        phase["name"] = "split"
        slice_of = pq.read_table(path, columns=["slice"]).column("slice")
        n_clusters, n_edges = pc.count_distinct(clusters.column("cluster_id")).as_py(), edges.num_rows
        del edges  # the dedup asset writes them; the split asset reads only the clusters
        t1 = time.perf_counter()
        # columns, as the split takes them: no Python object per trajectory
        items = pa.table({"id": clusters.column("id"), "cluster_id": clusters.column("cluster_id"), "slice": slice_of})
        del clusters, slice_of
        split = assign_splits(items)
        t_split = time.perf_counter() - t1
        del items
        counts = {r["values"]: r["counts"] for r in pc.value_counts(split.column("split")).to_pylist()}
        res = {"n": n, "gen_s": round(gen_s, 1), "gen_mb": round(gen_mb, 1), "cluster_s": round(t_cluster, 1),
               "split_s": round(t_split, 1), "total_s": round(t_cluster + t_split, 1),
               "clusters": n_clusters, "edges": n_edges,
               "splits": {s: counts.get(s, 0) for s in ("train", "val", "holdout")}}
        if contamination:
            from ratchet.governance.contamination import contamination_report

            assignments = split.select(["id", "split"])
            del split
            phase["contamination"] = True
            t2 = time.perf_counter()
            rep = contamination_report(assignments, path, id_col="record_id", text_col="prompt_text", code_cols=("patch",),
                                       key_cols={"repo": "repo", "issue_id": "issue", "task_id": "exact_id"})
            res["contamination_s"] = round(time.perf_counter() - t2, 1)
            time.sleep(0.05)  # one more sample
            phase["contamination"] = False
            res["contamination_peak_mb"] = round(phase["contamination_peak"])
            res["contamination"] = {k: rep[k] for k in ("passed", "n_items", "n_overlapping_items", "counts")}
    if phases:
        res["phase_peak_mb"] = {k: round(v) for k, v in phase["peak"].items()}
    print(json.dumps(res))


def cluster_split(n: int, phases: bool = False, contamination: bool = False) -> dict:
    """Cluster + split of n synthetic trajectories in a fresh child process, so the peak RSS is
    that work's alone (input generation included) and not the signature bench's."""
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    cmd = [sys.executable, __file__, "--_child", str(n)] + (["--phases"] if phases else []) + (
        ["--contamination"] if contamination else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cluster+split child failed for n={n}:\n{proc.stderr[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    # RUSAGE_CHILDREN is the largest child so far; run sizes in increasing order (as main does)
    res["peak_mb"] = round(after / 1024.0, 1)
    if after == before and before:
        res["peak_mb_note"] = "not above an earlier child's peak"
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--baseline-docs", type=int, default=5_000)
    ap.add_argument("--cluster-n", type=int, default=1_000_000,
                    help="cluster+split size for cluster_split_1m_s (0 skips it)")
    ap.add_argument("--peak-1m", action="store_true", help="also report peak_mb_1m (1M trajectories, child process)")
    ap.add_argument("--size-10m", action="store_true",
                    help="also report cluster_split_10m_s and peak_mb_10m (10M trajectories: tens of minutes)")
    ap.add_argument("--cluster-only", action="store_true", help="skip the signature-throughput part")
    ap.add_argument("--_child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--phases", action="store_true", help="also report the peak RSS of each cluster+split phase")
    ap.add_argument("--contamination", action="store_true",
                    help="also run the contamination check on each split: contamination_1m_s, contamination_peak_mb_1m "
                         "(and _10m with --size-10m)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", choices=("c", "duckdb"), default=None,
                    help="where SHA-1 runs (default: the C extension when built, else DuckDB)")
    args = ap.parse_args(argv)
    if args._child is not None:
        _child(args._child, args.phases, args.contamination)
        return {}
    if args.peak_1m:
        args.cluster_n = 1_000_000  # one 1M child gives cluster_split_1m_s and peak_mb_1m

    from datasketch import MinHash

    from ratchet.governance import minhash
    from ratchet.governance.minhash import shingles

    backend = args.backend or minhash.HASH_BACKEND
    hash_impl = minhash.HASH_IMPL if backend == minhash.HASH_BACKEND else backend

    def signatures(texts, threads):
        return minhash.signatures(texts, threads=threads, backend=backend)

    def measure(texts):
        nb = min(args.baseline_docs, args.docs)
        prepared = [[s.encode() for s in shingles(t)] for t in texts[:nb]]
        n_sh = sum(len(p) for p in prepared)
        distinct = len({s for p in prepared for s in p}) / n_sh
        t0, c0 = time.perf_counter(), time.process_time()
        base = []
        for sh in prepared:
            m = MinHash(num_perm=128, seed=1)
            m.update_batch(sh)
            base.append(m.hashvalues)
        base_per_s = nb / (time.perf_counter() - t0)
        base_cpu = nb / (time.process_time() - c0)
        signatures(texts[:200], threads=args.threads)  # warm imports / DuckDB
        t0 = time.perf_counter()
        ours = signatures(texts, threads=args.threads)
        ours_per_s = args.docs / (time.perf_counter() - t0)
        n1 = min(args.docs, 20_000)
        t0, c0 = time.perf_counter(), time.process_time()
        signatures(texts[:n1], threads=1)
        one_per_s = n1 / (time.perf_counter() - t0)
        one_cpu = n1 / (time.process_time() - c0)
        identical = bool(np.array_equal(np.vstack(base), ours[:nb]))
        return {"mean_shingles": n_sh / nb, "distinct_frac": distinct, "nb": nb, "base_per_s": base_per_s,
                "ours_per_s": ours_per_s, "one_per_s": one_per_s, "identical": identical,
                "base_cpu": base_cpu, "one_cpu": one_cpu}

    res = {} if args.cluster_only else {
        name: measure(gen(args.docs)) for name, gen in (("prompt-log", prompt_corpus), ("uniform", corpus))}

    cn = args.cluster_n
    cs = cluster_split(cn, args.phases, args.contamination) if cn else None
    at_1m = cs if args.peak_1m else None
    at_10m = cluster_split(10_000_000, args.phases, args.contamination) if args.size_10m else None

    rows = []
    for name, r in res.items():
        rows += [
            (f"[{name}] corpus", f"{args.docs} docs, {r['mean_shingles']:.0f} shingles/doc (k=5), 128 perms, seed 1; "
                                 f"{r['distinct_frac']:.0%} of shingle occurrences distinct (first {r['nb']} docs)"),
            (f"[{name}] baseline datasketch", f"{r['base_per_s']:,.0f} docs/s (update_batch, {r['nb']} docs, 1 thread, shingles prepared)"),
            (f"[{name}] ours (text -> sig)", f"{r['ours_per_s']:,.0f} docs/s on {args.threads} threads; {r['one_per_s']:,.0f} docs/s on 1 thread"),
            (f"[{name}] ratio", f"{r['ours_per_s'] / r['base_per_s']:.1f}x ({args.threads} threads vs 1); "
                               f"{r['one_per_s'] / r['base_per_s']:.1f}x thread for thread"),
            (f"[{name}] per CPU-second", f"baseline {r['base_cpu']:,.0f} docs/s, ours 1 thread {r['one_cpu']:,.0f} docs/s: "
                                        f"{r['one_cpu'] / r['base_cpu']:.1f}x (process CPU time: robust to other load)"),
            (f"[{name}] identical", f"{r['identical']} ({r['nb']} signatures x 128 values compared)"),
        ]
    for r in (cs, at_10m):
        if r:
            rows += [
                (f"cluster+split {r['n']:,}", f"cluster {r['cluster_s']:.1f} s + split {r['split_s']:.1f} s = "
                                             f"{r['total_s']:.1f} s (generation {r['gen_s']:.1f} s not counted)"),
                (f"  clusters / edges", f"{r['clusters']:,} clusters, {r['edges']:,} edges; splits {r['splits']}"),
                (f"  peak RSS (child)", f"{r['peak_mb']:,.0f} MB ({r['gen_mb']:,.0f} MB after generating the input)"),
            ]
            rows += [(f"  peak RSS in {k}", f"{v:,} MB") for k, v in r.get("phase_peak_mb", {}).items()]
            if "contamination" in r:
                c = r["contamination"]
                rows += [(f"contamination check {r['n']:,}", f"{r['contamination_s']:.1f} s, peak RSS {r['contamination_peak_mb']:,} MB "
                                                            f"(sampled while it ran); passed={c['passed']}, "
                                                            f"{c['n_overlapping_items']:,} of {c['n_items']:,} items overlap")]
    rows += [
        ("peak RSS (bench process)", f"{peak_mb():,.0f} MB"),
        ("cpus", f"{os.cpu_count()} (shared with other work: timings are noisy)"),
        ("SHA-1 backend", hash_impl),
    ]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    out = {"bench": "dedup", "hash_backend": hash_impl, "peak_mb": round(peak_mb(), 1)}
    if res:
        r = res["prompt-log"]
        base_per_s, ours_per_s, identical = r["base_per_s"], r["ours_per_s"], r["identical"]
        out.update({"docs": args.docs, "corpus": "prompt-log", "threads": args.threads, "hash_backend": hash_impl,
           "ours_per_s": round(ours_per_s, 1), "ours_1thread_per_s": round(res["prompt-log"]["one_per_s"], 1),
           "baseline": "datasketch.MinHash.update_batch", "baseline_per_s": round(base_per_s, 1),
           "ratio": round(ours_per_s / base_per_s, 2), "ratio_1thread": round(res["prompt-log"]["one_per_s"] / base_per_s, 2),
           "ratio_cpu_1thread": round(res["prompt-log"]["one_cpu"] / res["prompt-log"]["base_cpu"], 2),
           "identical": identical and res["uniform"]["identical"],
           "uniform": {"ours_per_s": round(res["uniform"]["ours_per_s"], 1),
                       "baseline_per_s": round(res["uniform"]["base_per_s"], 1),
                       "ratio": round(res["uniform"]["ours_per_s"] / res["uniform"]["base_per_s"], 2),
                       "ratio_cpu_1thread": round(res["uniform"]["one_cpu"] / res["uniform"]["base_cpu"], 2)}})
    if cs:
        out.update({"cluster_split_n": cn, "cluster_split_1m_s": round(cs["total_s"] * 1_000_000 / cn, 1),
                    "cluster_split_peak_mb": cs["peak_mb"]})
    if at_1m:
        out["peak_mb_1m"] = at_1m["peak_mb"]
    if at_10m:
        out.update({"cluster_split_10m_s": round(at_10m["total_s"], 1), "peak_mb_10m": at_10m["peak_mb"]})
    for r, size in ((cs, f"{cn // 1_000_000}m" if cn and cn % 1_000_000 == 0 else f"{cn}"), (at_10m, "10m")):
        if r and "contamination" in r:
            out.update({f"contamination_{size}_s": r["contamination_s"], f"contamination_peak_mb_{size}": r["contamination_peak_mb"],
                        f"contamination_passed_{size}": r["contamination"]["passed"]})
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
