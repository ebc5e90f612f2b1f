"""The local hermetic runtime: one pinned git worktree + one bubblewrap namespace per episode.

Typical use (tools, agents, verifiers):

    from sandboxes.runtime import LocalRuntime

    rt = LocalRuntime()                        # isolation="bwrap"; fails closed without it
    with rt.episode(bundle) as ep:             # worktree at the pinned commit, history-free
        ep.read_file("solution.py")            # helpers refuse paths that escape the worktree
        ep.write_file("solution.py", fixed)
        r = ep.run("python -c 'import solution'", timeout=10)   # -> ExecResult
        rep = ep.run_tests(bundle.fail_to_pass, coverage=True)  # -> TestReport
        ep.diff(); ep.changed_paths()          # for verifiers (forbidden paths, hygiene)

`ExecResult(returncode, stdout, stderr, timed_out, duration_s, infra_error)` and
`TestReport(outcomes, coverage, duration_s, infra_error, ...)`: `infra_error` is set only when
the sandbox or the harness failed (it must never be scored as the policy's zero reward).

Inside the sandbox the worktree is `/repo` (the cwd), HOME is an empty tmpfs, /tmp is an empty
tmpfs, there is no network, the process runs as an unprivileged per-episode uid with rlimits
from `bundle.limits`. What is hidden is listed in `sandboxes.isolation`.

Disk quota: when the harness runs as root, each worktree is its own tmpfs of `limits.disk_mb`
(writes past it fail with ENOSPC inside the sandbox: the agent's failure, visible); otherwise
`disk_usage()` is measured after every step and the environment ends an episode over quota.

Failure attribution (decided here, on the host, never from anything the sandbox reports):
* a test run whose worker dies, hangs, answers garbage or reports an error *while the agent's
  code runs in it* is the agent's failure (`TestReport.agent_fault`, the requested tests count
  as errors) -- unless the runtime's health probe (a fresh sandbox, harness-owned files only,
  the same worker code) fails too, which shows a fault of the harness: then `infra_error`;
* a sandbox or worker that does not come up (before any agent code runs) is retried once after
  killing everything left under the episode's uid (the only way an agent can stand in the way
  of a start is a full process table); a second failure is `infra_error`.

Tasks with their own image: a bundle that `sandboxes.docker_task_image.prepare` set to run in
the image built from its Dockerfile (`metadata["runtime"] == "docker"`) gets a Docker episode in
that image from `episode()`; every other bundle runs in bubblewrap here.

`isolation="none"` runs commands directly on the host (rlimits + clean env + timeout only) and
warns loudly; it exists for machines without bubblewrap and must be asked for explicitly.

Cleanup: `Episode.close()` (context manager), an atexit hook for episodes still open, and
`reap()` (run when a runtime starts) for episodes whose owner process died.
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import math
import os
import tempfile
import time
import uuid
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

from sandboxes import quota, safefs
from sandboxes.isolation import (SANDBOX_GID, SANDBOX_WORKDIR, ExecResult, SandboxSpec,
                                 SandboxUnavailable, bwrap_selftest, make_runner)
from sandboxes.frozen import freeze
from sandboxes.reaper import Lease, kill_uid, reap
from sandboxes.worktree import SnapshotStore, Worktree, chown_tree

__all__ = ["LocalRuntime", "Episode", "ExecResult", "TestReport", "SandboxUnavailable",
           "PathEscape", "default_root"]

PathEscape = safefs.PathEscape
log = logging.getLogger(__name__)
_UID_BASE, _UID_SPAN = 200_000, 800_000
_WORKER = str(Path(__file__).with_name("pytest_worker.py"))
_VERDICT = str(Path(__file__).with_name("verdict_worker.py"))
_OPEN: "weakref.WeakSet[Episode]" = weakref.WeakSet()


@dataclass
class TestReport:
    __test__ = False                                          # not a pytest class
    outcomes: dict[str, str]                                  # test id -> passed/failed/error/skipped
    coverage: dict[str, dict[str, set[int]]] | None = None    # test id -> file -> executed lines
    duration_s: float = 0.0
    infra_error: str | None = None                            # the harness failed (not scored)
    timed_out: bool = False
    exit_code: int | None = None
    output: str = ""                                          # tail of pytest's console output
    agent_fault: str | None = None                            # the run crashed because of the
                                                              # episode's own code (scored)
    test_timeouts: tuple[str, ...] = ()                       # tests past limits.test_cpu_s (failed;
                                                              # the run stopped there)

    def all_passed(self, test_ids) -> bool:
        return self.infra_error is None and all(self.outcomes.get(t) == "passed" for t in test_ids)


def report_from_worker(resp: dict, test_ids, duration_s: float) -> TestReport:
    """A TestReport from one pytest-worker answer (`sandboxes.pytest_worker`)."""
    if resp.get("error"):
        return TestReport({}, None, duration_s, resp["error"], output=resp.get("output", ""))
    cov = resp.get("coverage")
    if cov is not None:
        cov = {tid: {f: set(ls) for f, ls in files.items()} for tid, files in cov.items()}
    outcomes = resp.get("outcomes") or {}
    if resp.get("timed_out"):
        outcomes = {t: "error" for t in (test_ids or ())}   # the policy's code hung
    return TestReport(outcomes, cov, duration_s, None, bool(resp.get("timed_out")),
                      resp.get("exit_code"), resp.get("output", ""),
                      test_timeouts=tuple(resp.get("test_timeouts") or ()))


def default_root() -> str:
    if os.environ.get("RATCHET_SANDBOX_ROOT"):
        return os.environ["RATCHET_SANDBOX_ROOT"]
    if os.environ.get("RATCHET_HOME"):
        return str(Path(os.environ["RATCHET_HOME"]) / "sandbox")
    return str(Path(tempfile.gettempdir()) / f"ratchet-sandbox-{os.getuid()}")


class LocalRuntime:
    """Factory of episodes. Cheap to create; reuse one per process to share the snapshot cache.

    isolation: "bwrap" (default; raises SandboxUnavailable if bwrap fails its self-test) or
    "none" (explicit opt-out, loud warning). hide: extra host paths to hide from sandboxes.
    test_cache: a file of test results reused when an episode would repeat a run exactly
    (`sandboxes.result_cache`: what makes a reuse exact, and what it assumes); None: off.
    """

    def __init__(self, root: str | Path | None = None, *, isolation: str = "bwrap",
                 hide: tuple[str, ...] = (), reap_stale: bool = True, test_cache: str | Path | None = None):
        from sandboxes.result_cache import TestResultCache

        self.test_cache = TestResultCache(test_cache) if test_cache else None
        self.root = Path(root or default_root()).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        self.isolation = isolation
        self.hide = tuple(hide) + (str(self.root),)
        if isolation == "bwrap":
            reason = bwrap_selftest()
            if reason:
                raise SandboxUnavailable(
                    f"{reason}. Refusing to run episodes unsandboxed; pass isolation='none' to "
                    "opt out explicitly (no network or filesystem isolation).")
        elif isolation == "none":
            msg = ("sandbox isolation DISABLED (isolation='none'): commands run on the host with "
                   "network access and can read host files; use only for trusted code")
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning(msg)
        else:
            raise ValueError(f"unknown isolation {isolation!r}")
        self.snapshots = SnapshotStore(self.root / "snapshots")
        # the worker every episode of this runtime runs: a copy frozen now (sandboxes.frozen)
        self.worker, self._worker_digest = freeze(_WORKER, self.root / "tools")
        self.verdict_worker, _ = freeze(_VERDICT, self.root / "tools")     # `sandboxes.verdict`
        if reap_stale:
            self.reap()

    def reap(self) -> list[str]:
        """Clean up episodes whose owning process is gone."""
        return reap(self.root)

    name = "local"

    def episode(self, bundle, *, episode_id: str | None = None) -> "Episode":
        # a task prepared to run in its own image (a Harbor Dockerfile) runs there, whoever
        # opens it: the check, the agent's episode and the pristine verification alike
        if (bundle.metadata or {}).get("runtime") == "docker":
            from sandboxes import docker_task_image
            return docker_task_image.episode(bundle, episode_id)
        return Episode(self, bundle, episode_id or uuid.uuid4().hex[:16])

    def zygote(self):
        """This process's `sandboxes.zygote.Zygote` for this runtime (None where it is not used:
        no bwrap, no root, or RATCHET_ZYGOTE=0)."""
        from sandboxes import zygote
        if not zygote.enabled(self.isolation):
            return None
        return zygote.shared(self.worker, self._worker_digest, self.root / "zygote.stderr")

    def health_probe(self) -> str | None:
        """None when a fresh sandbox with harness-owned files runs a command and a test, else
        the reason (see `sandboxes.attribution`)."""
        from sandboxes.attribution import health_probe
        return health_probe(self.episode, _probe_command)


def _probe_command(ep: "Episode", argv: list[str]) -> ExecResult:
    ep._history = None              # the probe's test run is made, never a stored answer
    return ep._runner.run(argv, timeout=30)


class Episode:
    """One task attempt: a private worktree at the pinned commit and a sandbox to act in."""

    def __init__(self, runtime: LocalRuntime, bundle, episode_id: str):
        self.runtime, self.bundle, self.id = runtime, bundle, episode_id
        self.limits = bundle.limits
        self.environment_digest = bundle.environment_digest
        self._closed = True
        self._worker = None
        self._spawned = False
        self._pytest_config = None
        snap = runtime.snapshots.for_bundle(bundle)
        bwrap = runtime.isolation == "bwrap"
        self.uid = _UID_BASE + int(episode_id.encode().hex()[-12:], 16) % _UID_SPAN \
            if bwrap and os.geteuid() == 0 else 0
        self._lease = Lease(runtime.root, episode_id, {"uid": self.uid, "snapshot": snap.gitdir})
        self._quota_mount = None
        try:
            dest = self._lease.dir / "repo"
            dest.mkdir()
            if quota.mount_tmpfs(dest, self.limits.disk_mb):
                self._quota_mount = str(dest)
                self._lease.info["mounts"] = [str(dest)]
            self.worktree = Worktree.add(snap, dest)
            self._lease.info["admin"] = self.worktree.admin
            self._lease.write()
            os.chmod(self.worktree.path, 0o755)
            if self.uid:
                chown_tree(self.worktree.path, self.uid, SANDBOX_GID)
        except BaseException as e:
            if self._quota_mount:
                quota.unmount(self._quota_mount)
            self._lease.release()
            if isinstance(e, OSError) and e.errno == 28 and self._quota_mount:
                raise ValueError(f"{bundle.task_id}: the task's repository does not fit in the "
                                 f"episode disk quota (limits.disk_mb={self.limits.disk_mb})") from e
            raise
        self.workdir = self.worktree.path                  # host path
        self.sandbox_workdir = SANDBOX_WORKDIR if bwrap else self.workdir
        self.commit = snap.commit                          # the pinned (snapshot) commit
        self.source = snap.source
        L = self.limits
        self._runner = make_runner(runtime.isolation, SandboxSpec(
            workdir=self.workdir, uid=self.uid, ro_binds=(snap.gitdir,),
            tool_files={"pytest_worker.py": runtime.worker, "verdict_worker.py": runtime.verdict_worker},
            hide=runtime.hide,
            # a backstop above every wall clock: the final test run may take up to verify_s
            cpu_s=max(L.cpu_s, math.ceil(max(L.wall_s, L.verify_s))),
            memory_mb=L.memory_mb, max_procs=L.max_procs, max_file_mb=L.max_file_mb,
            max_output_chars=L.max_output_chars))
        self._history = None               # digest of what happened here (result_cache); None: no reuse
        self.reused_s = 0.0                # what the reused test runs took when they were made
        if runtime.test_cache is not None and bwrap:     # unsandboxed, /tmp is the host's: no reuse
            from sandboxes.result_cache import start
            self._history = start(bundle, self.commit, runtime.worker, runtime.isolation)
        self._closed = False
        _OPEN.add(self)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Episode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill everything the episode started and delete its worktree. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self.uid and self._spawned:
            kill_uid(self.uid)          # belt and braces: bwrap's pid namespace already died
        if self._quota_mount:
            quota.unmount(self._quota_mount)     # drops every file at once
        self._runner.close()
        self.worktree.remove()
        self._lease.release()
        _OPEN.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"episode {self.id} is closed")

    # ------------------------------------------------------------------ commands
    def run(self, cmd: str | list[str], timeout: float | None = None, *, stdin: str | None = None,
            env: dict | None = None, deterministic: bool = False) -> ExecResult:
        """Run a shell string (`sh -c`) or an argv list in the sandbox, cwd = the worktree.
        `deterministic`: the caller vouches that the command's effect is a function of the files,
        the command and its input (the harness's `git apply`, `grep`), so test results may still
        be reused after it (`sandboxes.result_cache`); any other command ends reuse here."""
        self._check_open()
        t = min(timeout or self.limits.wall_s, self.limits.wall_s)
        self._spawned = True
        r = self._runner.run(cmd, timeout=t, stdin=stdin, env=env)
        if r.infra_error:           # never started: clear the uid's leftovers and try once more
            self._clear_uid()
            r = self._runner.run(cmd, timeout=t, stdin=stdin, env=env)
        self._note("run", cmd, stdin, env, r.returncode, r.stdout, r.stderr, r.timed_out, r.infra_error,
                   keep=deterministic and not r.timed_out and not r.infra_error)
        return r

    def _note(self, *event, keep: bool = True) -> None:
        """Extend the history digest by one event (or end reuse for this episode)."""
        if self._history is not None:
            from sandboxes.result_cache import chain
            self._history = chain(self._history, *event) if keep else None

    def _clear_uid(self) -> None:
        if self.uid:
            from sandboxes.isolation import _wait_uid_gone
            _wait_uid_gone(self.uid)

    def apply_patch(self, patch: str) -> ExecResult:
        """`git apply` a unified diff inside the sandbox (e.g. SWE-bench's test_patch)."""
        return self.run(["git", "apply", "--whitespace=nowarn", "-"], stdin=patch, deterministic=True)

    def spawn_callee(self, module: str):
        """Start the data verdict's callee in the sandbox (`sandboxes.verdict_worker --callee`):
        a process with stdin/stdout pipes that imports `module` and answers calls with data."""
        import site
        import subprocess
        import sys
        self._check_open()
        self._spawned = True
        self._history = None            # code ran here that no test-result key describes
        # -S and the site folders by hand: the same packages importable, without the ~50 ms the
        # venv's .pth hooks cost at every start (they serve nothing inside a sandbox)
        sites = [a for p in site.getsitepackages() for a in ("--site", p)]
        return self._runner.popen(
            [sys.executable, "-S", self._runner.tool_path("verdict_worker.py"), "--callee", "--root",
             self.sandbox_workdir, "--module", module, *sites],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def run_tests(self, test_ids=None, *, coverage: bool = False,
                  timeout: float | None = None, warm: bool = True) -> TestReport:
        """Run pytest node ids (all tests when None) in the warm per-episode worker.
        `warm=False`: this episode runs its tests once (pristine verification), so a worker
        started for it skips the warm-up pytest session that only pays off from the second run on.

        A worker that dies, hangs or cannot start is restarted for the next call; whose fault
        it was is decided by the runtime's health probe (see the module docstring)."""
        self._check_open()
        t = min(timeout or self.limits.wall_s, max(self.limits.wall_s, self.limits.verify_s))
        rep = self._run_tests_raw(test_ids, coverage, t, warm)
        from sandboxes.pytest_worker import NOT_STARTED
        if rep.infra_error and rep.infra_error.startswith(NOT_STARTED):
            self._clear_uid()
            rep = self._run_tests_raw(test_ids, coverage, t, warm)
            return rep                  # a worker that cannot start twice: the harness's fault
        if rep.infra_error:             # it failed while the agent's code ran in it
            from sandboxes.attribution import attribute
            self._clear_uid()
            rep = attribute(rep, test_ids, self.runtime.health_probe)
        return rep

    def _run_tests_raw(self, test_ids, coverage: bool, timeout: float, warm: bool = True) -> TestReport:
        from sandboxes.pytest_worker import PytestWorkerClient
        from sandboxes.result_cache import chain, storable, tree_state
        cache, key, before = self.runtime.test_cache, None, None
        if cache is not None and self._history is not None:
            key = chain(self._history, "tests", list(test_ids) if test_ids else None, coverage, timeout,
                        self.limits.max_output_chars, self.limits.test_cpu_s)
            self._history = chain(key, "ran")
            t0 = time.monotonic()
            resp = cache.get(key, wait_s=timeout + 30)
            if resp is not None:        # the same run, made before: no sandbox is started
                self.reused_s += float(resp.get("made_s") or 0.0)
                return report_from_worker(resp, test_ids, time.monotonic() - t0)
            before = tree_state(self.workdir)
        keep = None
        try:
            self._spawned = True
            if self._worker is None:
                self._worker = PytestWorkerClient(self._runner, self.sandbox_workdir,
                                                  str(self._lease.dir / "worker.stderr"), warm=warm,
                                                  zygote=self.runtime.zygote() if self.uid else None)
            t0 = time.monotonic()
            resp = self._worker.request(test_ids, coverage, timeout, self.limits.max_output_chars,
                                        test_cpu_s=self.limits.test_cpu_s, scratch=key is not None,
                                        config=self.pytest_config())
            if resp.get("error"):
                self._worker.close()        # the next call starts a fresh worker
                self._worker = None
                self._history = None        # a restarted worker: what the dead one left is unknown
            elif key is not None and storable(resp) and tree_state(self.workdir) == before:
                keep = resp
        finally:
            if key is not None:             # stores it (with what it took), wakes episodes waiting for it
                cache.done(key, None if keep is None else {**keep, "made_s": time.monotonic() - t0})
        return report_from_worker(resp, test_ids, time.monotonic() - t0)

    def pytest_config(self) -> dict:
        """The task's own pytest configuration as pinned: the only one a test run reads."""
        if self._pytest_config is None:
            from sandboxes.pytest_config import task_config
            self._pytest_config = task_config(self.bundle, self.pristine_bytes)
        return self._pytest_config

    # ------------------------------------------------------------------ files
    def _owner(self):
        return (self.uid, SANDBOX_GID) if self.uid else None

    def read_file(self, path: str, max_chars: int | None = None) -> str:
        self._check_open()
        data = safefs.read_bytes(self.workdir, path, None if max_chars is None else max_chars * 4)
        text = data.decode("utf-8", "replace")
        return text if max_chars is None else text[:max_chars]

    def write_file(self, path: str, text: str) -> str:
        """Write (create or replace) a file; returns its normalised relative path."""
        self._check_open()
        return self.write_bytes(path, text.encode())

    def read_bytes(self, path: str) -> bytes:
        self._check_open()
        return safefs.read_bytes(self.workdir, path)

    def write_bytes(self, path: str, data: bytes) -> str:
        self._check_open()
        if len(data) > self.limits.max_file_mb * 1024 * 1024:
            raise ValueError(f"file too large for this episode: {len(data)} bytes")
        self._history, h = None, self._history      # a write that fails half way ends reuse
        rel = safefs.write_bytes(self.workdir, path, data, owner=self._owner())
        if h is not None:
            from sandboxes.result_cache import chain
            self._history = chain(h, "write", rel, hashlib.sha256(data).digest())
        return rel

    def pristine_bytes(self, path: str) -> bytes | None:
        """The file at the pinned commit, read from the snapshot (never from the worktree)."""
        from sandboxes.worktree import GitError, git
        rel = "/".join(safefs._split(path))
        try:
            return git(f"--git-dir={self.worktree.snapshot.gitdir}", "cat-file", "blob",
                       f"{self.commit}:{rel}", text=False)
        except GitError:
            return None

    def disk_usage(self) -> int:
        """Bytes held by the worktree (O(1) on the quota tmpfs, a walk otherwise)."""
        return quota.usage(self.workdir, mounted=self._quota_mount is not None)

    def delete_file(self, path: str) -> None:
        self._check_open()
        self._history, h = None, self._history
        safefs.delete(self.workdir, path)
        if h is not None:
            from sandboxes.result_cache import chain
            self._history = chain(h, "delete", "/".join(safefs._split(path)))

    def list_files(self, path: str = ".") -> list[str]:
        self._check_open()
        return safefs.list_files(self.workdir, path)

    # ------------------------------------------------------------------ for verifiers
    def diff(self) -> str:
        """Unified diff (git, --binary) of the worktree against the pinned commit."""
        self._check_open()
        return self.worktree.diff(self._lease.dir / f"stage-{uuid.uuid4().hex[:8]}")

    def changed_paths(self) -> list[str]:
        """Relative paths added, modified or deleted since the pinned commit (sorted)."""
        self._check_open()
        return self.worktree.changed_paths(self._lease.dir / f"stage-{uuid.uuid4().hex[:8]}")


@atexit.register
def _close_open_episodes() -> None:
    for ep in list(_OPEN):
        try:
            ep.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
