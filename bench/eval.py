"""Holdout evaluation bench: 400 locked holdout tasks x 3 seeds on the machine's cores (2 here),
with the SBFL-guided harness baseline ("harness:sbfl"; the embedded learned policy does not exist
yet), through the real path: a warehouse with a locked holdout manifest, the spawn pool, the
sandbox, pristine verification, rows written to DuckDB as they finish.

    .venv/bin/python bench/eval.py [--tasks 400] [--seeds 3] [--workers 2] [--baseline-episodes 24]

Measured: the wall time of the whole evaluation (`wall_s_400x3`; with --tasks below 400 it is
extrapolated linearly from the measured run and the JSON says so), the overhead outside the
policy and its sandbox work (`overhead_fraction` = 1 - sum(policy_s + sandbox_s) / (wall x
workers): env setup/teardown, the pool, row building and warehouse writes), and the named
baseline: the same episodes one at a time in one process (sequential), measured on
--baseline-episodes episodes and extrapolated to 1,200 (said in the JSON). Progress lines go to
stderr as rows are stored, so a run stopped early still says how far it got; the JSON also holds
the latency p50/p95/max, the episodes over 5 s, the tasks' per-test CPU limit (`test_cpu_s`) and
the suite generator version (the environment), and the load average at start and end.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POLICY = "harness:sbfl"


def setup(home: Path, n_tasks: int, seed: int, suite=None):
    """A warehouse whose locked holdout is a seeded sample of n_tasks suite tasks. Build (or load)
    the suite before pointing RATCHET_HOME elsewhere: its cache lives under the caller's home."""
    from ratchet.governance.holdout import lock_holdout
    from ratchet.governance.tasks import task_rows
    from ratchet.store import replace
    from ratchet.warehouse import Warehouse
    from sandboxes.humaneval import build_suite

    suite = suite or build_suite(seed=0)
    tasks = random.Random(seed).sample(sorted(suite.tasks, key=lambda t: t.task_id), min(n_tasks, len(suite.tasks)))
    wh = Warehouse(home / "warehouse.duckdb")
    wh.ensure_schema()
    path = home / "holdout_manifest.json"
    with wh.connect() as con:
        replace(con, "tasks", task_rows(tasks, suite_key="bench"))
        lock_holdout(con, path, [t.task_id for t in tasks], locked_by="bench/eval.py")
    return wh, path, tasks


def run(wh, path, seeds, workers, task_limit=None, progress=False):
    from ratchet.evaluation import tables
    from ratchet.evaluation.runner import evaluate, holdout_plan, warehouse_sink

    with wh.connect() as con:
        tables.ensure(con)
        plan = holdout_plan(con, path, task_limit=task_limit)
    done, store = warehouse_sink(wh)
    t0 = time.monotonic()
    n = [0]

    def sink(rows):
        store(rows)
        n[0] += len(rows)
        if progress:     # a run stopped early still says how far it got, and how fast
            print(f"progress: {n[0]} episodes in {time.monotonic() - t0:.1f} s "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    r = evaluate(plan, POLICY, "", seeds=seeds, done=done, sink=sink, workers=workers, flush_every=50,
                 flush_s=30.0)
    return r, time.monotonic() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--baseline-episodes", type=int, default=30)
    ap.add_argument("--sample-seed", type=int, default=0)
    a = ap.parse_args(argv)

    from sandboxes.humaneval import build_suite

    suite = build_suite(seed=0)          # from the usual cache, before RATCHET_HOME moves
    load0 = os.getloadavg()[0]           # the machine is shared: say how busy it was
    with tempfile.TemporaryDirectory(prefix="ratchet-bench-eval-") as tmp:
        os.environ["RATCHET_HOME"] = tmp
        wh, path, tasks = setup(Path(tmp), a.tasks, a.sample_seed, suite)
        seeds = list(range(a.seeds))
        res, wall = run(wh, path, seeds, a.workers, progress=True)
        rows = res.rows
        n = len(rows)
        work = sum(r["policy_s"] + r["sandbox_s"] for r in rows)
        in_episode = sum(r["latency_s"] for r in rows)
        overhead = 1 - work / (wall * res.workers)
        lat = sorted(r["latency_s"] for r in rows)
        passed = sum(r["outcome"] == "pass" for r in rows)
        infra = sum(r["outcome"] == "infra_failure" for r in rows)
        # baseline, measured back to back on the same subset: one at a time in one process vs the
        # pool (fresh seeds, so nothing is resumed; the SBFL harness does the same work per seed)
        b = max(1, a.baseline_episodes)
        bres, bwall = run(wh, path, [a.seeds + 100], 1, task_limit=b)
        pres, pwall = run(wh, path, [a.seeds + 101], a.workers, task_limit=b)
    full = 400 * 3
    measured_full = a.tasks >= 400 and a.seeds >= 3
    wall_full = wall if measured_full else wall / n * full
    speedup = bwall / pwall if pwall else None
    print(f"holdout evaluation: {POLICY} (SBFL-guided harness baseline; no learned policy yet), "
          f"{len(tasks)} tasks x {a.seeds} seeds = {n} episodes, {res.workers} workers")
    print(f"{'run':<48}{'episodes':>9}{'wall s':>9}{'s/episode':>11}")
    print(f"{'full: parallel (spawn pool, rows to DuckDB)':<48}{n:>9}{wall:>9.1f}{wall / n:>11.3f}")
    print(f"{'subset: sequential one at a time (baseline)':<48}{len(bres.rows):>9}{bwall:>9.1f}{bwall / len(bres.rows):>11.3f}")
    print(f"{'subset: parallel':<48}{len(pres.rows):>9}{pwall:>9.1f}{pwall / len(pres.rows):>11.3f}")
    print(f"pass {passed}/{n} episodes, infra failures {infra}; policy+sandbox work {work:.0f} s of "
          f"{wall * res.workers:.0f} worker-s -> overhead {overhead:.1%}; inside episodes "
          f"{1 - work / in_episode:.1%} of episode time is setup/teardown/bookkeeping")
    out = {"bench": "eval", "policy": POLICY, "policy_note": "SBFL-guided harness (the embedded policy does not exist yet)",
           "tasks": len(tasks), "seeds": a.seeds, "episodes": n, "workers": res.workers, "cores": os.cpu_count(),
           "wall_s_400x3": round(wall_full, 1), "wall_s_measured": round(wall, 1),
           "wall_s_400x3_extrapolated": not measured_full,
           **({} if measured_full else {"extrapolated_from_episodes": n}),
           "overhead_fraction": round(overhead, 4),
           "episode_internal_overhead_fraction": round(1 - work / in_episode, 4),
           "passed_episodes": passed, "infra_failures": infra,
           "latency_p50_s": round(lat[len(lat) // 2], 2), "latency_p95_s": round(lat[int(len(lat) * 0.95)], 2),
           "latency_max_s": round(lat[-1], 2), "episodes_over_5s": sum(x > 5 for x in lat),
           "test_cpu_s": tasks[0].limits.test_cpu_s, "wall_s_limit": tasks[0].limits.wall_s,
           "environment": tasks[0].metadata.get("generator", {}).get("version"),
           "baseline": "sequential one-at-a-time (1 process), same subset, back to back",
           "subset_episodes": len(bres.rows), "baseline_subset_wall_s": round(bwall, 1),
           "parallel_subset_wall_s": round(pwall, 1),
           "baseline_wall_s_400x3": round(wall_full * speedup, 1) if speedup else None, "baseline_wall_s_400x3_derived": True,
           "ratio": round(speedup, 2) if speedup else None,
           "loadavg_1m_start": round(load0, 2), "loadavg_1m_end": round(os.getloadavg()[0], 2)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
