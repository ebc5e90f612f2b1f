"""Run a policy over the locked holdout: verify the manifest, skip finished episodes, run the rest
concurrently (a spawn-context process pool, one sandbox runtime per worker), write rows as they
arrive (so a killed evaluation loses only the episodes in flight).

    plan = holdout_plan(con, manifest_path)          # ManifestError on any mismatch
    rows = evaluate(plan, "harness:sbfl", "", seeds=[0, 1, 2], sink=lambda rows: ...)

Two ways through the pool, the same rows: harness, scripted and HTTP policies go one episode per
job (`episodes.run_policy_episode`); policies whose engine batches generation (embedded, hf:
`episodes.BATCHED_ENGINES`) go a chunk of episodes per job (`episodes.run_policy_chunk`: the
chunk's episodes run together and the model generates for all waiting ones in one batch), and
each chunk's rows are stored as soon as it returns.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence


@dataclass
class HoldoutPlan:
    bundles: list                      # TaskBundles of the locked holdout, sorted by task_id
    holdout_sha256: str
    manifest_version: int
    missing: list[str] = field(default_factory=list)   # manifest ids absent from the tasks table
    max_turns: int | None = None       # the budget asked for, a ceiling (a task with a lower limit keeps it; None: own limits)

    def task_digests(self) -> dict[str, str]:
        """task_id -> the environment digest its episodes run under (the budget is part of it)."""
        return {b.task_id: b.environment_digest for b in self.bundles}


def with_turn_budget(bundle, max_turns: int | None):
    """The bundle with its turn limit lowered to `max_turns` (None / 0 / a larger budget: as it
    is). The limit is part of the environment digest, so episodes run under another budget are
    other episodes (their own eval ids) and never compared with these (the promotion gate compares
    per-task digests)."""
    from dataclasses import replace

    if not max_turns or max_turns >= bundle.limits.max_turns:
        return bundle
    return replace(bundle, limits=replace(bundle.limits, max_turns=int(max_turns)))


def holdout_plan(con, manifest_path: str | Path, *, task_limit: int | None = None,
                 max_turns: int | None = None) -> HoldoutPlan:
    """The locked holdout's bundles, after verifying the manifest file against the warehouse
    (`ratchet.governance.holdout.holdout_state`: a tampered, missing or unlocked manifest raises
    ManifestError). Refuses when a manifest task has no bundle in `tasks` (the holdout would be
    evaluated partially). `task_limit` takes the first N by task id (quick runs; recorded);
    `max_turns` lowers every task's turn budget (`with_turn_budget`)."""
    import json

    from ratchet.evaluation.tables import fetch
    from ratchet.governance.holdout import holdout_state
    from ratchet.governance.manifest import ManifestError, verify_manifest
    from sandboxes.bundle import TaskBundle

    state = holdout_state(con, manifest_path)
    m = state.manifest
    if m is None:
        raise ManifestError(f"no locked holdout (manifest {manifest_path} missing and none recorded): "
                            "materialise holdout_manifest first")
    if not state.locked:
        raise ManifestError(f"holdout manifest version {m.version} is unlocked: lock it before evaluating "
                            "(results on an unlocked holdout are not comparable)")
    if not state.recorded:
        raise ManifestError(f"holdout manifest {manifest_path} has no warehouse record: materialise "
                            "holdout_manifest to adopt it first")
    rows = fetch(con, "SELECT task_id, bundle FROM tasks WHERE task_id IN "
                            "(SELECT task_id FROM holdout_manifest WHERE version = ?)", [m.version])
    found = {r["task_id"]: r["bundle"] for r in rows}
    missing = sorted(set(m.task_ids) - set(found))
    if missing:
        raise ManifestError(f"{len(missing)} of {len(m.task_ids)} locked holdout tasks have no bundle in the "
                            f"tasks table (e.g. {missing[:3]}): refusing to evaluate part of the holdout")
    verify_manifest(m, expected_ids=sorted(found))
    ids = sorted(found)[:task_limit] if task_limit else sorted(found)
    if max_turns is not None and max_turns < 0:
        raise ValueError(f"max_turns must be positive (0 or None: each task's own limit), got {max_turns}")
    bundles = [with_turn_budget(TaskBundle.from_dict(json.loads(found[t]) if isinstance(found[t], str) else found[t]),
                                max_turns) for t in ids]
    return HoldoutPlan(bundles, m.sha256, m.version, missing, max_turns or None)


# ------------------------------------------------------------------------------- workers
_RUNTIME = None
# Batched policies: episodes per pool job, and how many of them are open at once (the most rows
# one generate call decodes). A kill loses at most `workers` chunks. The engine prefills each row
# alone, and with the greedy memo a task's 3 seeds are one row, so a chunk of 8 tasks x 3 seeds is
# opened whole: measured with bench/eval.py, fewer open episodes were no faster.
CHUNK = 24          # 8 tasks x 3 seeds
CONCURRENCY = 24    # all of a chunk open at once: with the greedy memo a task's seeds ask one batch row


def test_cache_file(home=None) -> Path:
    """The holdout evaluation's test-result cache (`sandboxes.result_cache`): shared by every
    worker, seed, policy and cycle; safe to delete (it only saves sandbox runs)."""
    from ratchet.home import get_home

    return Path(home or get_home().root) / "cache" / "test-results.sqlite"


_TEST_CACHE: str | None = None


def _init_worker(test_cache: str | None = None) -> None:
    global _RUNTIME, _TEST_CACHE
    from sandboxes.runtime import LocalRuntime

    # One torch thread per worker: the pool already runs one worker per core, and two workers with
    # torch's default threads each on 2 cores spin against each other. Measured on the demo's
    # trained candidate: 30-47 s per 30-turn episode in a 2-worker pool against 5.1 s alone.
    # Set before any engine imports torch (a spawned worker starts clean).
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")

    _RUNTIME, _TEST_CACHE = LocalRuntime(test_cache=test_cache), test_cache


def _init_pool_worker(test_cache: str | None = None) -> None:
    """A pool worker's start: it exits when the evaluating process dies (ratchet.pool_workers)."""
    from ratchet.pool_workers import exit_with_parent

    exit_with_parent()
    _init_worker(test_cache)


def _chunk_job(args) -> tuple[list[dict], dict]:
    from ratchet.evaluation.economics import RateCard
    from ratchet.evaluation.episodes import run_policy_chunk
    from sandboxes.bundle import TaskBundle
    from sandboxes.verifiers.judge import make_judge

    policy_id, version, pairs, run_id, sha, judge_cfg, card_d, kw, concurrency = args
    if _RUNTIME is None:
        _init_worker()
    t0 = time.monotonic()
    cache = _RUNTIME.test_cache
    before = cache.stats() if cache is not None else {}
    rows, timing = run_policy_chunk(
        policy_id, version, [(TaskBundle.from_dict(b), s) for b, s in pairs], runtime=_RUNTIME,
        judge=make_judge(judge_cfg) if judge_cfg else None, eval_run_id=run_id, holdout_sha256=sha,
        rate_card=RateCard.from_dict(card_d) if card_d else None, policy_kwargs=kw, concurrency=concurrency)
    timing["job_s"] = time.monotonic() - t0          # worker-side: bundle decoding and judge included
    timing.update({k: v - before[k] for k, v in cache.stats().items()} if cache is not None else {})
    return rows, timing


def _job(args) -> dict:
    from ratchet.evaluation.economics import RateCard
    from ratchet.evaluation.episodes import run_policy_episode
    from sandboxes.bundle import TaskBundle
    from sandboxes.verifiers.judge import make_judge

    policy_id, version, bundle_d, seed, run_id, sha, judge_cfg, card_d, kw = args
    if _RUNTIME is None:
        _init_worker()
    return run_policy_episode(policy_id, version, TaskBundle.from_dict(bundle_d), seed, runtime=_RUNTIME,
                              judge=make_judge(judge_cfg) if judge_cfg else None, eval_run_id=run_id,
                              holdout_sha256=sha, rate_card=RateCard.from_dict(card_d) if card_d else None,
                              policy_kwargs=kw)


@dataclass
class EvalRun:
    eval_run_id: str
    rows: list[dict]                  # rows produced by this call (skipped ones not included)
    skipped: int                      # episodes that already had a row (resume)
    planned: int
    wall_s: float
    workers: int
    batched: bool = False             # chunks through run_episodes (batched generation) or one per job
    chunk: int = 1                    # episodes per job
    timing: dict = field(default_factory=dict)   # batched: worker-side sums over chunks (run_policy_chunk)


def evaluate(plan: HoldoutPlan, policy_id: str, checkpoint_version: str = "", *, seeds: Sequence[int] = (0, 1, 2),
             done: Callable[[list[str]], set] | None = None, sink: Callable[[list[dict]], None] | None = None,
             workers: int | None = None, judge: dict | None = None, rate_card=None,
             policy_kwargs: dict | None = None, eval_run_id: str | None = None,
             flush_every: int = 16, flush_s: float = 2.0, batched: bool | None = None,
             chunk: int | None = None, concurrency: int = CONCURRENCY,
             test_cache: str | Path | None = None) -> EvalRun:
    """Every holdout task x seed for one policy. `done(eval_ids)` returns the ids that already
    have a row (skipped); `sink(rows)` stores rows in batches as they finish. A judge whose id is
    the policy's is refused before anything runs.

    `batched` (default: whether the policy's engine batches generation, `BATCHED_ENGINES`): run
    `chunk` episodes per job (default `CHUNK`, fewer when there are not enough to keep every worker
    busy), `concurrency` of them open at once; each chunk's rows are stored when it returns, so a
    kill loses at most the chunks in flight (`workers` x `chunk` episodes).

    `test_cache`: a file of sandbox test results reused when an episode repeats a run exactly
    (`sandboxes.result_cache`; `test_cache_file()` is the evaluation's); None: every run is made."""
    from ratchet.evaluation.episodes import batches_generation, check_judge, eval_id, judge_id
    from ratchet.policy.base import engine_names
    from sandboxes.verifiers.judge import make_judge

    made = make_judge(judge) if judge else None
    if made is not None:
        check_judge(made, policy_id)                              # before anything runs
    grader = judge_id(made)                                       # part of each episode's id
    if policy_id.partition(":")[0] not in engine_names():
        raise ValueError(f"unknown engine in policy id {policy_id!r}; engines: {engine_names()}")
    run_id = eval_run_id or uuid.uuid4().hex
    jobs, ids = [], []
    for b in plan.bundles:
        for s in seeds:
            ids.append(eval_id(policy_id, checkpoint_version, b.task_id, s, b.environment_digest, grader))
            jobs.append((policy_id, checkpoint_version, b.to_dict(), int(s), run_id, plan.holdout_sha256,
                         judge, rate_card.to_dict() if rate_card is not None else None, policy_kwargs))
    finished = done(ids) if done else set()
    todo = [j for j, i in zip(jobs, ids) if i not in finished]
    n = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
    cache = str(test_cache) if test_cache else None
    if batches_generation(policy_id) if batched is None else batched:
        return _evaluate_chunks(todo, n, run_id, len(jobs), sink, chunk, concurrency, cache)
    out, batch = [], []
    last = time.monotonic()
    t0 = time.monotonic()

    def take(row) -> None:
        nonlocal last, batch
        out.append(row)
        batch.append(row)
        if sink and (len(batch) >= flush_every or time.monotonic() - last >= flush_s):
            sink(batch)
            batch, last = [], time.monotonic()

    try:
        _each(_job, todo, n, take, cache)
    finally:
        if sink and batch:
            sink(batch)                 # what finished before an interruption is kept
    return EvalRun(run_id, out, len(jobs) - len(todo), len(jobs), time.monotonic() - t0, n)


def _each(fn, jobs: list, n: int, take: Callable, test_cache: str | None = None) -> None:
    """take(fn(job)) for every job exactly once: in this process when n == 1, else in a pool of n
    workers, results in completion order. Spawn, not fork: a forked pool inside Dagster / pytest
    can hang on terminate. ProcessPoolExecutor, not multiprocessing.Pool: when a worker
    dies mid-job, Pool.imap waits forever for the lost job (seen in full test runs);
    the executor raises BrokenProcessPool, and the jobs without a result run here instead."""
    if n == 1:
        _ensure_runtime(test_cache)
        for j in jobs:
            take(fn(j))
        return
    import multiprocessing as mp
    import warnings
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    left = dict(enumerate(jobs))
    pool = ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_init_pool_worker,
                               initargs=(test_cache,))
    try:
        futures = {pool.submit(fn, j): k for k, j in left.items()}
        for f in as_completed(futures):
            result = f.result()
            del left[futures[f]]
            take(result)
    except BrokenProcessPool as e:
        warnings.warn(f"evaluation: a worker process died ({e}); running its {len(left)} unfinished "
                      "jobs in this process")
    except BaseException:
        # Ctrl-C, a failing sink: stop the workers now (ratchet.pool_workers.terminate_pool).
        # Rows already stored stay; a re-run resumes from them.
        from ratchet.pool_workers import terminate_pool
        terminate_pool(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)    # an error here stops queued jobs too
    if left:
        _ensure_runtime(test_cache)
    for k in sorted(left):
        take(fn(left[k]))


def _ensure_runtime(test_cache: str | None) -> None:
    """This process's runtime, with the test cache this evaluation asked for."""
    if _RUNTIME is None or _TEST_CACHE != test_cache:
        _init_worker(test_cache)


def _chunks(todo: list, n: int, chunk: int | None) -> list[list]:
    """Consecutive jobs in chunks of about `chunk` (default: at most CHUNK, sized so that every one
    of the n workers gets the same number of chunks), cut only between tasks: a task's seeds share a chunk, hence a worker,
    whose engine decodes a greedy turn the seeds share once (its completion memo)."""
    per_worker = -(-len(todo) // (n * CHUNK))          # chunks per worker, so all finish together
    size = max(1, chunk or -(-len(todo) // (n * max(1, per_worker))))
    out: list[list] = []
    for j in todo:
        if out and (len(out[-1]) < size or out[-1][-1][2]["task_id"] == j[2]["task_id"]):
            out[-1].append(j)
        else:
            out.append([j])
    return out


def _evaluate_chunks(todo: list, n: int, run_id: str, planned: int, sink, chunk: int | None,
                     concurrency: int, test_cache: str | None = None) -> EvalRun:
    t0 = time.monotonic()
    chunks = _chunks(todo, n, chunk)
    args = [(c[0][0], c[0][1], [(j[2], j[3]) for j in c], run_id, *c[0][5:9], concurrency) for c in chunks]
    out, timing = [], {}

    def take(result) -> None:
        rows, t = result
        out.extend(rows)
        for k, v in t.items():
            timing[k] = timing.get(k, 0) + v
        if sink and rows:
            sink(rows)                      # one chunk = one write: finished rows survive a kill

    _each(_chunk_job, args, n, take, test_cache)
    timing["chunks"] = len(chunks)
    return EvalRun(run_id, out, planned - len(todo), planned, time.monotonic() - t0, n, True,
                   max(map(len, chunks), default=0), timing)


def warehouse_sink(wh) -> tuple[Callable, Callable]:
    """(done, sink) over a ratchet.warehouse.Warehouse: short connections, one per batch."""
    from ratchet.evaluation import tables

    def done(ids: Iterable[str]) -> set:
        with wh.connect() as con:
            tables.ensure(con)
            return tables.done_eval_ids(con, ids)

    def sink(rows: list[dict]) -> None:
        with wh.connect() as con:
            tables.write_episodes(con, rows)

    return done, sink
