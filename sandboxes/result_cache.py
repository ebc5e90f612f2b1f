"""Test results reused when a run would repeat one already made: same task, same files, same
history, same request.

    rt = LocalRuntime(test_cache=home / "cache" / "test-results.sqlite")

Why: under greedy decoding the 3 seeds of a holdout task are the same episode, and every policy
starts each task by localizing on the same pristine files. A sandbox test run costs ~0.2 CPU-s
(a bwrap sandbox, a Python with pytest, the run; measured: the first run of an episode 0.25,
the verification run 0.21, a later run 0.03), about two thirds of an evaluated episode's CPU.

What makes a reuse exact. An episode keeps a running digest of its history (`chain`): the task
(environment digest, commit), the limits, the worker's code and Python; then every file written or
deleted through the episode, every harness command it ran that is declared deterministic
(`Episode.run(..., deterministic=True)`: `git apply`, `grep`) with its outputs, and every test
run. Any other command ends reuse for the rest of the episode. A test run's key is that digest
plus the request. Only a result that says nothing about timing and left no state behind is
stored: no infra error, no timeout, no per-test CPU limit hit, the worktree's files unchanged by
the run and the worker's /tmp and $HOME unchanged (`scratch_changed`, reported by the worker).
So a reused result stands for a run that could not have changed what a later run sees.

What it assumes: the task's tests are deterministic given the files (a flaky test keeps the
outcome it had first). Verification at submit runs in a fresh sandbox on the pristine task plus
the carried files, so its key is a function of exactly those files. Off by default; the holdout
evaluation turns it on (`holdout_eval` config `test_cache`).
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from pathlib import Path


def chain(h: bytes, *parts) -> bytes:
    d = hashlib.sha256(h)
    for p in parts:
        b = p if isinstance(p, bytes) else json.dumps(p, sort_keys=True, default=str).encode()
        d.update(len(b).to_bytes(8, "little"))
        d.update(b)
    return d.digest()


def start(bundle, commit: str, worker_file: str, isolation: str) -> bytes:
    """The digest an episode's history starts from."""
    limits = asdict(bundle.limits) if is_dataclass(bundle.limits) else repr(bundle.limits)
    return chain(b"ratchet-test-results-v1", bundle.environment_digest, commit, limits, isolation,
                 sys.version, _file_digest(worker_file))


@lru_cache(maxsize=8)
def _file_digest(path: str) -> str:
    """The worker's code, read once per process (not once per episode)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_state(root: str) -> list:
    """Every path under the worktree with its size and mtime (the .git file included): a test run
    that changes it is never reused. (The walk is the worker's own, which checks its /tmp and
    $HOME the same way inside the sandbox.)"""
    from sandboxes.pytest_worker import file_states

    return file_states([root])


def storable(resp: dict) -> bool:
    return (not resp.get("error") and not resp.get("timed_out") and not resp.get("test_timeouts")
            and resp.get("scratch_changed") is False)


class TestResultCache:
    """Worker answers by key in a shared file (`sandboxes.kvfile`; an optimisation only)."""
    __test__ = False

    def __init__(self, path: str | Path, *, timeout: float = 60.0):
        import threading

        from sandboxes.kvfile import KVFile

        self.path = Path(path)
        self._file = KVFile(self.path, timeout=timeout, what="test-result cache")
        self.hits = self.misses = self.stored = 0
        self._lock = threading.Lock()
        self._running: dict[bytes, threading.Event] = {}

    def get(self, key: bytes, wait_s: float = 0.0) -> dict | None:
        """The stored answer, or None: then the caller runs it and must call `done(key)`.
        Episodes step in threads, and the seeds of a task ask the same run at the same moment:
        a caller that finds the same key running in this process waits for it (up to `wait_s`)
        instead of starting a second sandbox for it."""
        import threading

        while True:
            raw = self._file.get(key)
            if raw is not None:
                with self._lock:
                    self.hits += 1
                return json.loads(raw)
            with self._lock:
                running = self._running.get(key)
                if running is None:
                    self._running[key] = threading.Event()
                    self.misses += 1
                    return None
            if not running.wait(wait_s) or self._file.get(key) is None:
                with self._lock:            # not stored (or too slow): run it here, without waiting again
                    self.misses += 1
                    self._running.setdefault(key, threading.Event())
                return None

    def done(self, key: bytes, resp: dict | None) -> None:
        """After a run the caller made: store it (when `resp` is given) and wake the waiters."""
        if resp is not None:
            self._file.put_many([(key, json.dumps(resp))])
        with self._lock:
            if resp is not None:
                self.stored += 1
            event = self._running.pop(key, None)
        if event is not None:
            event.set()

    def stats(self) -> dict:
        return {"test_cache_hits": self.hits, "test_cache_misses": self.misses,
                "test_cache_stored": self.stored}
