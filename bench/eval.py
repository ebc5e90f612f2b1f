"""Holdout evaluation bench: 400 locked holdout tasks x 3 seeds on the machine's cores (2 here),
through the real path: a warehouse with a locked holdout manifest, the spawn pool, the sandbox,
pristine verification, rows written to DuckDB as they finish.

    .venv/bin/python bench/eval.py [--policy sbfl|embedded] [--tasks 400] [--seeds 3] [--workers 2]
                                   [--checkpoint PATH] [--baseline-episodes N]

Policies: `--policy sbfl` (the default) is the SBFL-guided harness baseline "harness:sbfl", one
episode per pool job. `--policy embedded` is the embedded learned policy ("embedded:<name>",
made by ratchet.policy.make_policy from a checkpoint folder, decoded under the mask saved with
it): `--checkpoint PATH` evaluates a trained checkpoint (bench/learning.py's, the demo's under
RATCHET_HOME), otherwise the untrained base_policy is built here from train-side tasks (suite
tasks outside the holdout sample; an untrained policy submits at random, so its episodes are
short). Its episodes go through the batched path: chunks of episodes per pool job, generation
batched across the chunk's open episodes (ratchet.evaluation.runner, `--chunk`, `--concurrency`).

Measured: the wall time of the whole evaluation (`wall_s_400x3`; with --tasks / --seeds below
400 x 3 it is extrapolated linearly per episode from the measured run and the JSON says so) and
the overhead outside the policy and its sandbox work (`overhead_fraction`):
  sbfl: 1 - sum(policy_s + sandbox_s) / (wall x workers): env setup/teardown, the pool, row
        building and warehouse writes;
  embedded (batched): 1 - sum(time inside run_episodes) / (wall x workers). Inside run_episodes a
        worker is either generating (one batch for the waiting episodes) or waiting for its
        episodes' sandbox steps (tool calls, env setup and verification run in threads,
        overlapping generation); everything else is overhead: worker start and policy loading,
        bundle decoding, row building, pickling, and workers idle at the end. The split is in
        the JSON (`generate_fraction`, `sandbox_wait_fraction`, `worker_other_fraction`,
        `pool_idle_fraction`).
The named baseline: the same episodes one at a time, on a sample of --baseline-episodes:
  sbfl: one process, sequential, vs the pool on the same subset, back to back (the ratio scales
        the full run);
  embedded: today's one-episode-per-job path of the same pool (2 workers, one torch thread
        each) on the first tasks' episodes of the full run, extrapolated per episode to 1,200;
        their rows are compared with the batched run's rows (`sample_rows_identical`).
The sandbox test-result cache (`sandboxes.result_cache`) is on, as in `holdout_eval`, in a file
that starts empty (a cold run; `test_cache` in the JSON: hits, runs made, stored);
`--no-test-cache` makes every test run. The baseline samples never use it.
Progress lines go to stderr as rows are stored, so a run stopped early still says how far it
got; the JSON also holds turns / tool calls / tokens per episode, latency p50/p95/max, the tasks'
per-test CPU limit and the suite generator version, and the load average at start and end.
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

from ratchet.policy.runner import TURN_BUDGET  # noqa: E402

POLICIES = {"sbfl": "harness:sbfl", "embedded": "embedded:bench"}
CACHE = Path(tempfile.gettempdir()) / "ratchet-bench-eval-base"


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


def base_policy(suite, holdout_ids: set, n_train: int = 200) -> Path:
    """The untrained embedded base_policy, built (or reused: content-keyed) from train-side tasks:
    the first n_train suite tasks by id that are not in the holdout sample (other mutants of the
    same problems may be in the holdout: this is a timing bench of a random-weight model), with
    the structured action mask and calls-only bounds the training recipe decodes under."""
    from ratchet.policy.action_mask import structured_tools
    from ratchet.policy.embedded.corpus import task_texts
    from ratchet.policy.embedded.decoding import write_decoding
    from ratchet.policy.embedded.model import build_base_policy
    from ratchet.training.recipe import RecipeSettings
    from sandboxes.tools import TOOL_SCHEMAS

    train = [b for b in sorted(suite.tasks, key=lambda t: t.task_id) if b.task_id not in holdout_ids][:n_train]
    rows = [{"task_id": b.task_id, "split": "train", "repo": b.repo, "issue_id": b.issue_id,
             "issue_title": b.issue_title, "issue_body": b.issue_body, "solution": b.files.get("solution.py")}
            for b in train]
    path = build_base_policy(CACHE, task_texts(rows, structured_tools(TOOL_SCHEMAS)))
    write_decoding(path, action_mask="structured", bounds=RecipeSettings().grpo().bounds())
    return path


def run(wh, path, policy_id, seeds, workers, task_limit=None, progress=False, store=True, max_turns=None, **kw):
    """One evaluate() over the locked holdout; store=False keeps rows in memory only (nothing is
    skipped as done, nothing written): the baseline samples re-run episodes of the full run."""
    from ratchet.evaluation import tables
    from ratchet.evaluation.runner import evaluate, holdout_plan, warehouse_sink

    with wh.connect() as con:
        tables.ensure(con)
        plan = holdout_plan(con, path, task_limit=task_limit, max_turns=max_turns)
    done, store_rows = warehouse_sink(wh) if store else (None, None)
    cpu0, busy0 = _cpu(), _machine_busy()
    t0 = time.monotonic()
    n = [0]

    def sink(rows):
        if store_rows:
            store_rows(rows)
        n[0] += len(rows)
        if progress:     # a run stopped early still says how far it got, and how fast
            print(f"progress: {n[0]} episodes in {time.monotonic() - t0:.1f} s "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    r = evaluate(plan, policy_id, "", seeds=seeds, done=done, sink=sink, workers=workers, flush_every=50,
                 flush_s=30.0, **kw)
    wall = time.monotonic() - t0
    r.timing["cpu_s"] = _cpu() - cpu0
    r.timing["machine_cpu_s"] = _machine_busy() - busy0
    return r, wall


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine (/proc/stat): the sandboxes' test processes run
    under other uids and are not all reaped through this process tree, so rusage misses most of
    them (measured: 12.4 of 33.4 CPU-s for 24 episodes). Includes whatever else the machine ran:
    read it with the load average."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the pool's workers once it shut
    down, and the sandboxes they ran): what the evaluation cost whatever else the machine ran."""
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _mean(xs):
    xs = list(xs)
    return round(sum(xs) / len(xs), 2) if xs else None


def _repro(row):
    from ratchet.evaluation.tables import NON_REPRODUCIBLE
    return {k: v for k, v in row.items() if k not in NON_REPRODUCIBLE}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", choices=sorted(POLICIES), default="sbfl")
    ap.add_argument("--checkpoint", default=None, help="embedded: a trained checkpoint folder (default: build "
                                                       "the untrained base_policy)")
    ap.add_argument("--temperature", type=float, default=None,
                    help="embedded: sample at this temperature (default: the policy's own, greedy)")
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--baseline-episodes", type=int, default=None, help="default 30 (sbfl), 24 (embedded)")
    ap.add_argument("--chunk", type=int, default=None, help="embedded: episodes per pool job (default runner.CHUNK)")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="embedded: episodes open at once per job (default runner.CONCURRENCY)")
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--max-turns", type=int, default=TURN_BUDGET,
                    help="turn budget per episode, as holdout_eval's default (0: the tasks' own limit, 30)")
    ap.add_argument("--no-test-cache", action="store_true",
                    help="make every sandbox test run (the holdout_eval default reuses exact repeats: "
                         "sandboxes.result_cache); the baseline samples never use the cache")
    a = ap.parse_args(argv)

    from ratchet.evaluation.runner import CONCURRENCY
    from sandboxes.humaneval import build_suite

    policy_id = POLICIES[a.policy]
    embedded = a.policy == "embedded"
    suite = build_suite(seed=0)          # from the usual cache, before RATCHET_HOME moves
    load0 = os.getloadavg()[0]           # the machine is shared: say how busy it was
    t_start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    seeds = list(range(a.seeds))
    kw, ckpt, sampling = {"max_turns": a.max_turns}, None, None
    with tempfile.TemporaryDirectory(prefix="ratchet-bench-eval-") as tmp:
        os.environ["RATCHET_HOME"] = tmp
        wh, path, tasks = setup(Path(tmp), a.tasks, a.sample_seed, suite)
        if embedded:
            ckpt = Path(a.checkpoint).expanduser().resolve() if a.checkpoint else \
                base_policy(suite, {t.task_id for t in tasks})
            pk = {"path": str(ckpt)}
            if a.temperature is not None:
                sampling = {"temperature": a.temperature, "max_tokens": 256}
                pk["sampling"] = sampling
            kw = {**kw, "policy_kwargs": pk, "chunk": a.chunk, "concurrency": a.concurrency or CONCURRENCY}
        from ratchet.evaluation.runner import test_cache_file
        cache = None if a.no_test_cache else test_cache_file(tmp)     # starts empty: a cold run
        res, wall = run(wh, path, policy_id, seeds, a.workers, progress=True, test_cache=cache, **kw)
        rows = res.rows
        n = len(rows)
        b = max(1, a.baseline_episodes or (24 if embedded else 30))
        if embedded:
            # the same episodes (the first tasks' seeds) one at a time in the same pool, then batched
            # again on the same sample, back to back; nothing stored, nothing skipped
            limit = max(1, -(-b // a.seeds))
            bres, bwall = run(wh, path, policy_id, seeds, a.workers, task_limit=limit, store=False,
                              **{**kw, "batched": False})
            pres, pwall = run(wh, path, policy_id, seeds, a.workers, task_limit=limit, store=False, **kw)
        else:
            # one at a time in one process vs the pool on the same subset (fresh seeds, so nothing
            # is resumed; the SBFL harness does the same work per seed)
            bres, bwall = run(wh, path, policy_id, [a.seeds + 100], 1, task_limit=b, **kw)
            pres, pwall = run(wh, path, policy_id, [a.seeds + 101], a.workers, task_limit=b, **kw)
    full = 400 * 3
    measured_full = a.tasks >= 400 and a.seeds >= 3
    wall_full = wall if measured_full else wall / n * full
    lat = sorted(r["latency_s"] for r in rows)
    passed = sum(r["outcome"] == "pass" for r in rows)
    infra = sum(r["outcome"] == "infra_failure" for r in rows)
    worker_s = wall * res.workers
    out = {"bench": "eval", "policy": policy_id, "started": t_start,
           "tasks": len(tasks), "seeds": a.seeds, "episodes": n, "workers": res.workers, "cores": os.cpu_count(),
           "wall_s_400x3": round(wall_full, 1), "wall_s_measured": round(wall, 1),
           "wall_s_400x3_extrapolated": not measured_full,
           **({} if measured_full else {"extrapolated_from_episodes": n}),
           # CPU, not wall: on a shared machine the wall says as much about the neighbours
           "cpu_s_measured": round(res.timing["cpu_s"], 1),
           "machine_cpu_s_measured": round(res.timing["machine_cpu_s"], 1),
           "machine_cpu_s_per_episode": round(res.timing["machine_cpu_s"] / n, 3),
           "cpu_floor_wall_s_400x3": round(res.timing["machine_cpu_s"] / n * full / (os.cpu_count() or 1), 1),
           "cpu_definition": "cpu_s: this process tree's rusage (misses sandbox processes); machine_cpu_s: "
                             "/proc/stat busy time over the run (includes neighbours); floor = "
                             "machine CPU for 1,200 episodes / cores",
           "test_cache": None if cache is None else {
               "file": "empty at start (a cold run)", "hits": res.timing.get("test_cache_hits"),
               "misses": res.timing.get("test_cache_misses"), "stored": res.timing.get("test_cache_stored")}}
    if embedded:
        t = res.timing
        ckpt_meta = ckpt / "ratchet_checkpoint.json"
        meta = json.loads(ckpt_meta.read_text()) if ckpt_meta.exists() else {}
        inside = t.get("runner_s", 0.0)
        by_id = {r["eval_id"]: _repro(r) for r in rows}
        same = sum(by_id.get(r["eval_id"]) == _repro(r) for r in bres.rows)
        same_batched = sum(by_id.get(r["eval_id"]) == _repro(r) for r in pres.rows)
        # what differs where a sampled row is not the full run's (column: [full run, one at a time])
        diffs = [{"task_id": r["task_id"], "seed": r["seed"],
                  **{k: [by_id[r["eval_id"]][k], v] for k, v in _repro(r).items()
                     if k in by_id.get(r["eval_id"], {}) and by_id[r["eval_id"]][k] != v}}
                 for r in bres.rows if by_id.get(r["eval_id"]) != _repro(r)]
        base_full = bwall / len(bres.rows) * full
        out.update({
            "policy_note": "embedded learned policy, batched path (chunks through run_episodes)",
            "checkpoint": str(ckpt), "trained": bool(a.checkpoint),
            "checkpoint_stage": meta.get("stage") or ("sft" if meta else "untrained base_policy"),
            "sampling": sampling or "policy default (greedy, 256 new tokens a turn)",
            "chunk": res.chunk, "concurrency": kw["concurrency"], "chunks": t.get("chunks"),
            "overhead_fraction": round(1 - inside / worker_s, 4),
            "overhead_definition": "1 - sum(time inside run_episodes) / (wall x workers)",
            "generate_fraction": round(t.get("generate_s", 0.0) / worker_s, 4),
            "sandbox_wait_fraction": round((inside - t.get("generate_s", 0.0)) / worker_s, 4),
            "worker_other_fraction": round((t.get("job_s", 0.0) - inside) / worker_s, 4),
            "pool_idle_fraction": round(1 - t.get("job_s", 0.0) / worker_s, 4),
            "generate_calls": t.get("calls"), "mean_batch": round(t["requests"] / t["calls"], 2) if t.get("calls") else None,
            "baseline": "one episode per pool job (the path before batching), same pool, same episodes (first "
                        f"{limit} tasks x {a.seeds} seeds), extrapolated per episode to 1,200",
            "subset_episodes": len(bres.rows), "baseline_subset_wall_s": round(bwall, 1),
            "batched_subset_wall_s": round(pwall, 1),
            "baseline_wall_s_400x3": round(base_full, 1), "baseline_wall_s_400x3_extrapolated": True,
            "ratio": round(base_full / wall_full, 2), "subset_ratio": round(bwall / pwall, 2) if pwall else None,
            "sample_rows_identical": f"{same} / {len(bres.rows)}",
            "sample_batched_rows_identical": f"{same_batched} / {len(pres.rows)}",
            "sample_row_differences": diffs[:5]})
    else:
        work = sum(r["policy_s"] + r["sandbox_s"] for r in rows)
        in_episode = sum(r["latency_s"] for r in rows)
        speedup = bwall / pwall if pwall else None
        out.update({
            "policy_note": "SBFL-guided harness baseline",
            "overhead_fraction": round(1 - work / worker_s, 4),
            "overhead_definition": "1 - sum(policy_s + sandbox_s) / (wall x workers)",
            "episode_internal_overhead_fraction": round(1 - work / in_episode, 4),
            "baseline": "sequential one-at-a-time (1 process), same subset, back to back",
            "subset_episodes": len(bres.rows), "baseline_subset_wall_s": round(bwall, 1),
            "parallel_subset_wall_s": round(pwall, 1),
            "baseline_wall_s_400x3": round(wall_full * speedup, 1) if speedup else None,
            "baseline_wall_s_400x3_derived": True, "ratio": round(speedup, 2) if speedup else None})
    out.update({
        "passed_episodes": passed, "infra_failures": infra,
        "infra_errors": sorted({(r["error"] or "")[:160] for r in rows if r["outcome"] == "infra_failure"})[:3],
        "turns_per_episode": _mean(r["turns"] for r in rows),
        "tool_calls_per_episode": _mean(r["tool_calls"] for r in rows),
        "tokens_out_per_episode": _mean(r["tokens_out"] for r in rows),
        "latency_p50_s": round(lat[len(lat) // 2], 2), "latency_p95_s": round(lat[int(len(lat) * 0.95)], 2),
        "latency_max_s": round(lat[-1], 2), "episodes_over_5s": sum(x > 5 for x in lat),
        "test_cpu_s": tasks[0].limits.test_cpu_s, "wall_s_limit": tasks[0].limits.wall_s,
        "max_turns": min(a.max_turns or tasks[0].limits.max_turns, tasks[0].limits.max_turns),
        "environment": tasks[0].metadata.get("generator", {}).get("version"),
        "loadavg_1m_start": round(load0, 2), "loadavg_1m_end": round(os.getloadavg()[0], 2)})
    print(f"holdout evaluation: {policy_id} ({out['policy_note']}), {len(tasks)} tasks x {a.seeds} seeds = "
          f"{n} episodes, {res.workers} workers")
    print(f"{'run':<52}{'episodes':>9}{'wall s':>9}{'s/episode':>11}")
    print(f"{'full: ' + ('batched chunks' if res.batched else 'one per job') + ' (spawn pool, rows to DuckDB)':<52}"
          f"{n:>9}{wall:>9.1f}{wall / n:>11.3f}")
    print(f"{'subset: one at a time (baseline)':<52}{len(bres.rows):>9}{bwall:>9.1f}{bwall / len(bres.rows):>11.3f}")
    print(f"{'subset: ' + ('batched' if embedded else 'parallel'):<52}{len(pres.rows):>9}{pwall:>9.1f}"
          f"{pwall / len(pres.rows):>11.3f}")
    print(f"pass {passed}/{n} episodes, infra failures {infra}, {out['turns_per_episode']} turns/episode; "
          f"overhead {out['overhead_fraction']:.1%} ({out['overhead_definition']})")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
