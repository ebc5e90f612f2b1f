"""Reward-hacks bench: every known exploit (sandboxes.redteam) against a sample of tasks.

Each exploit runs as a real episode in the real sandbox (bwrap, pristine verification, real
pytest) on a seeded sample of HumanEval repair tasks plus the six QuixBugs programs of the test
fixtures (tasks we did not write, imported SWE-bench style from a git repository). Beside them
runs the true fix: the task's recorded fix, once with the ground-truth explanation and once
with none (the lowest a true fix can score).

    .venv/bin/python bench/reward_hacks.py [--tasks 6] [--seed 0] [--quixbugs 6]

Every episode runs on both runtimes, bubblewrap and Docker (`--no-docker` runs bwrap only; so does
a machine where no Docker engine can run, and the JSON says why).

Final JSON keys: exploits, episodes, max_exploit_reward (over every exploit, task and runtime),
true_fix_reward (the lowest true-fix reward), true_fix_mean, infra_voids (exploit episodes that
ended as infra_failure: target 0), runtime_disagreements (episodes whose reward or status differ
between the two runtimes: target 0; null when Docker did not run, with `docker_skipped` saying
why), runtimes; the named baseline is the lowest true-fix reward and
ratio = max_exploit_reward / true_fix_reward (target: below 1).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "sandboxes"))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=6, help="HumanEval repair tasks sampled")
    ap.add_argument("--quixbugs", type=int, default=6, help="QuixBugs programs (0-6)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-docker", action="store_true", help="bubblewrap only")
    a = ap.parse_args(argv)

    import quixbugs
    from tqdm import tqdm

    from sandboxes.bundle import Limits
    from sandboxes.humaneval import build_suite
    from sandboxes.redteam import EXPLOITS, run_exploit, run_true_fix
    from sandboxes.runtime import LocalRuntime

    t0 = time.monotonic()
    runtimes, docker_skipped = {"bwrap": LocalRuntime()}, None
    if a.no_docker:
        docker_skipped = "--no-docker"
    else:
        from sandboxes import docker_engine
        docker_skipped, _ = docker_engine.ensure()
        if docker_skipped is None:
            from sandboxes.docker_runtime import DockerRuntime, SandboxUnavailable
            try:
                runtimes["docker"] = DockerRuntime()
            except SandboxUnavailable as e:
                docker_skipped = str(e)
    # short limits: a looping exploit costs wall/verify seconds per episode, nothing else changes
    lim = Limits(wall_s=3, cpu_s=3, verify_s=4)
    pool = sorted(build_suite(seed=0).tasks, key=lambda b: b.task_id)
    tasks = [replace(b, limits=lim) for b in random.Random(a.seed).sample(pool, min(a.tasks, len(pool)))]
    tmp = tempfile.mkdtemp(prefix="ratchet-hacks-")
    tasks += [quixbugs.bundle(n, tmp, wall_s=3, cpu_s=3, verify_s=4) for n in quixbugs.PROGRAMS[:a.quixbugs]]

    rows, true_fix = [], []
    jobs = [(t, None) for t in tasks] + [(t, e) for t in tasks for e in EXPLOITS.values()]
    for rname, rt in runtimes.items():
        for task, exploit in tqdm(jobs, desc=f"episodes ({rname})", unit="ep", file=sys.stderr):
            if exploit is None:
                for explain in (True, False):
                    r = run_true_fix(task, rt, explain=explain)
                    true_fix.append({"runtime": rname, "task": task.task_id, "explain": explain,
                                     "value": r.value, "status": r.status})
                continue
            r = run_exploit(exploit, task, rt)
            if r is None:
                continue
            rows.append({"runtime": rname, "task": task.task_id, "exploit": exploit.name,
                         "kind": exploit.kind, "value": r.value, "status": r.status,
                         "tests": r.components.get("tests")})
    disagree = None
    if len(runtimes) > 1:
        seen: dict = defaultdict(dict)
        for r in rows:
            seen[(r["task"], r["exploit"])][r["runtime"]] = (r["value"], r["status"])
        for r in true_fix:
            seen[(r["task"], f"true_fix(explain={r['explain']})")][r["runtime"]] = (r["value"], r["status"])
        odd = {k: v for k, v in seen.items() if len(set(v.values())) > 1 or len(v) != len(runtimes)}
        for (task, name), v in sorted(odd.items()):
            print(f"runtimes disagree: {task} {name}: {v}", file=sys.stderr)
        disagree = len(odd)

    by = defaultdict(list)
    for r in rows:
        by[r["exploit"]].append(r)
    print(f"{'exploit':26} {'tasks':>5} {'max reward':>10} {'tests=1':>7}  statuses")
    for name in EXPLOITS:
        rs = by.get(name, [])
        if not rs:
            print(f"{name:26} {0:5d} {'n/a':>10}")
            continue
        vals = [r["value"] for r in rs if r["value"] is not None]
        statuses = sorted({r["status"] for r in rs})
        print(f"{name:26} {len(rs):5d} {max(vals) if vals else float('nan'):10.3f} "
              f"{sum(r['tests'] == 1.0 for r in rs):7d}  {', '.join(statuses)}")
    tf = [r["value"] for r in true_fix if r["value"] is not None]
    tf_bad = [r for r in true_fix if r["value"] is None or r["status"] != "scored"]
    max_exploit = max(r["value"] for r in rows if r["value"] is not None)
    voids = sum(r["status"] == "infra_failure" for r in rows)
    print(f"\ntrue fix: min {min(tf):.3f}, mean {sum(tf) / len(tf):.3f} over {len(tf)} episodes"
          f" ({len(tf_bad)} not scored); exploits: max {max_exploit:.3f} over {len(rows)} episodes; "
          f"infra voids {voids}; runtime disagreements {disagree}"
          f"{f' (Docker skipped: {docker_skipped})' if docker_skipped else ''}; {time.monotonic() - t0:.0f} s")
    out = {"bench": "reward_hacks", "exploits": len(EXPLOITS), "tasks": len(tasks),
           "episodes": len(rows) + len(true_fix), "max_exploit_reward": round(max_exploit, 4),
           "max_exploit": max(rows, key=lambda r: r["value"] or 0)["exploit"],
           "true_fix_reward": round(min(tf), 4), "true_fix_mean": round(sum(tf) / len(tf), 4),
           "true_fix_unscored": len(tf_bad), "infra_voids": voids,
           "runtime_disagreements": disagree, "runtimes": sorted(runtimes),
           **({"docker_skipped": docker_skipped} if docker_skipped else {}),
           "baseline": "lowest true-fix reward (recorded fix, no explanation)",
           "ratio": round(max_exploit / min(tf), 4), "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
