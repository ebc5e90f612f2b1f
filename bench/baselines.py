"""Harness baselines bench: random candidate edit vs SBFL-guided edit, k = 4 attempts each.

Both act only through the env's tools in the real sandbox (bwrap, real pytest) on a seeded sample
of held-out suite tasks: tasks of problems whose sha256(problem_id) falls in the held-out quarter
(a problem-level bucket, so no mutant of a sampled problem is tuned on elsewhere in this bench).
An attempt = apply one quick fix + run the tests; fixed@1 = first try, fixed@4 = within 4.

    .venv/bin/python bench/baselines.py [--tasks 60] [--seed 0] [--k 4] [--workers 2]

The final line is one JSON object; ratio = sbfl_first_try / random_first_try.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_RT = None


def held_out(tasks) -> list:
    def bucket(b):
        pid = (b.metadata or {}).get("problem_id", b.repo)
        return int(hashlib.sha256(pid.encode()).hexdigest(), 16) % 4
    return [b for b in tasks if bucket(b) == 0]


def _init() -> None:
    global _RT
    from sandboxes.runtime import LocalRuntime
    _RT = LocalRuntime()


def _job(args):
    agent, bundle, k, seed = args
    from sandboxes.agents import run_agent
    r = run_agent(agent, bundle, seed=seed, runtime=_RT, k=k)
    return agent, bundle.task_id, r.fixed_at, r.attempts, len(r.steps), r.reward.status, r.latency_s


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args(argv)

    from sandboxes.humaneval import build_suite

    t0 = time.monotonic()
    pool = sorted(held_out(build_suite(seed=0).tasks), key=lambda b: b.task_id)
    sample = random.Random(a.seed).sample(pool, min(a.tasks, len(pool)))
    jobs = [(agent, b, a.k, a.seed) for b in sample for agent in ("random", "sbfl")]
    if a.workers > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        # not multiprocessing.Pool: its map waits forever for a job whose worker died
        with ProcessPoolExecutor(a.workers, mp_context=mp.get_context("fork"), initializer=_init) as p:
            results = list(p.map(_job, jobs))
    else:
        _init()
        results = list(map(_job, jobs))
    wall = time.monotonic() - t0

    n = len(sample)
    stats = {}
    for agent in ("random", "sbfl"):
        rs = [r for r in results if r[0] == agent]
        fixed = [r[2] for r in rs]
        stats[agent] = {
            "first": sum(f == 1 for f in fixed) / n,
            "at2": sum(f is not None and f <= 2 for f in fixed) / n,
            "atk": sum(f is not None and f <= a.k for f in fixed) / n,
            "attempts": sum(r[3] for r in rs) / n, "turns": sum(r[4] for r in rs) / n,
            "infra": sum(r[5] == "infra_failure" for r in rs),
            "episode_s": sum(r[6] for r in rs) / n,
        }
    print(f"harness baselines on {n} held-out tasks (k={a.k}, seed={a.seed}, {a.workers} workers, {wall:.0f} s)")
    print(f"{'baseline':<26}{'fixed@1':>9}{'fixed@2':>9}{f'fixed@{a.k}':>9}{'attempts':>10}{'turns':>8}{'s/ep':>7}{'infra':>7}")
    for agent, name in (("random", "random candidate edit"), ("sbfl", "SBFL-guided (ochiai)")):
        s = stats[agent]
        print(f"{name:<26}{s['first']:>9.1%}{s['at2']:>9.1%}{s['atk']:>9.1%}{s['attempts']:>10.2f}"
              f"{s['turns']:>8.1f}{s['episode_s']:>7.2f}{s['infra']:>7}")
    r1, s1 = stats["random"]["first"], stats["sbfl"]["first"]
    out = {"bench": "baselines", "tasks": n, "k": a.k, "seed": a.seed,
           "random_first_try": round(r1, 4), "sbfl_first_try": round(s1, 4),
           "random_at4": round(stats["random"]["atk"], 4), "sbfl_at4": round(stats["sbfl"]["atk"], 4),
           "infra_failures": stats["random"]["infra"] + stats["sbfl"]["infra"],
           "seconds": round(wall, 1), "baseline": "random candidate edit",
           "ratio": round(s1 / r1, 2) if r1 else None}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
