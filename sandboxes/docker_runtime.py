"""The Docker runtime: one locked-down container per episode (same contract as `LocalRuntime`).

    rt = DockerRuntime()                       # raises SandboxUnavailable when no engine answers
    with rt.episode(bundle) as ep:             # inline files or repo_path+commit, base image
        ep.write_file("solution.py", fixed)
        ep.run("python3 -c 'import solution'")  # -> ExecResult
        ep.run_tests(bundle.fail_to_pass)       # -> TestReport (the warm pytest worker)
        ep.diff(); ep.changed_paths()
    rt.episode(bundle, image="sweb.eval.x86_64.astropy__astropy-12907")   # repo already in /testbed

Engine and image: `python -m sandboxes.docker_engine --ensure` (what `make test` runs) starts
dockerd when nothing answers and builds `ratchet-sandbox-base` (Debian bookworm minbase +
python3, python3-pytest, python-is-python3, git) offline with debootstrap. No registry is ever
contacted.

The tree: the bundle's pinned tree (inline files or `repo_path` + `commit`) becomes a
single-commit snapshot (`sandboxes.worktree.SnapshotStore`, no other history), which is
`git archive`d into the container's workdir; with `image=` and a bundle without a tree, the
snapshot is made once per image from the image's own workdir (its `.git` left out: no future
history). The snapshot's bare repository is mounted read-only at /.ratchet/git: `diff`,
`changed_paths` and `pristine_bytes` use it with a fresh scratch index each time, never
anything the sandbox can write. The workdir also gets a small `.git` of its own (objects
borrowed from the snapshot) so `git diff` / `git status` work for the agent; the harness never
reads it (its diff lists the files itself and stages them into a fresh scratch index).

The container: `network_mode="none"` (loopback only), read-only root filesystem, the workdir
a tmpfs of `limits.disk_mb` (the whole tree included: a write past it fails with ENOSPC inside
the sandbox), /tmp a 64 MiB tmpfs, memory (+swap) / pids / 1 CPU cgroup limits from
`bundle.limits`, RLIMIT_FSIZE / RLIMIT_CPU / no core dumps, every capability dropped,
no-new-privileges, the unprivileged uid 10001, an environment that holds nothing of the host's.
Nothing of the host is mounted except, read-only, the snapshot and the two helper scripts
(`pytest_worker.py`, `docker_ops.py`). All writable storage is tmpfs, charged to the
container's memory limit. Containers carry the `ratchet.sandbox` label and their owner's pid;
a runtime removes the ones whose owner died when it starts, and `close()` removes its own.

Processes: pid 1 is a tiny reaper; after every command and test run, everything the agent's
code left behind is killed (`docker_ops.op_sweep`); a command that times out is killed with its
whole tree; when even that fails (a fork bomb at the pids limit), pid 1 kills every process in
the container (`docker kill -s USR1`, no new process needed). File access goes through a
persistent in-container helper (`docker_ops.py`), commands through `docker exec`.

Other images: pass `python=` (the interpreter with pytest inside the image) and, so that the
pristine verification (`sandboxes.verify`, which calls `runtime.episode(bundle)`) runs in the
same image, give it as `DockerRuntime(image=...)` or `bundle.metadata["image"]` rather than
only per episode.

Size: ~560 lines, on purpose one module: `DockerRuntime` (images, snapshots, reaping) and
`DockerEpisode`, whose methods are the Episode protocol one by one; the plumbing they share
(exec runner, file-helper client, paths, rlimits) is `sandboxes.docker_io`.

Failure attribution follows `sandboxes.runtime`: a worker or command failure that looks like
the harness's is checked with a health probe in a fresh container; a healthy probe makes it
the agent's failure (`TestReport.agent_fault`), otherwise `infra_error`.
"""
from __future__ import annotations

import atexit
import base64
import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
import weakref
from pathlib import Path

from sandboxes import docker_engine
from sandboxes.docker_io import (
    SITE,
    TOOLS,
    _Capped,
    _DockerRunner,
    _env,
    _import_tar,
    _largest_member,
    _Ops,
    _owner_alive,
    _owner_label,
    _q,
    _split,
    _text,
    _ulimits,
    pytest_site,
)
from sandboxes.isolation import ExecResult, SandboxUnavailable
from sandboxes.runtime import PathEscape, TestReport, default_root, report_from_worker
from sandboxes.worktree import SnapshotStore, git

__all__ = ["DockerRuntime", "DockerEpisode", "ExecResult", "TestReport", "SandboxUnavailable"]

GITDIR = f"{TOOLS}/git"
SANDBOX_UID = docker_engine.SANDBOX_UID
TMP_MB = 64
_HERE = Path(__file__).resolve().parent
_WORKER = str(_HERE / "pytest_worker.py")
_OPS = str(_HERE / "docker_ops.py")
_VERDICT = str(_HERE / "verdict_worker.py")
_MARK = "\x1eratchet-exec "
_WRAP = 'printf "\\036ratchet-exec %s\\036" "$$" >&2; exec "$@"'
_OPEN: "weakref.WeakSet[DockerEpisode]" = weakref.WeakSet()
_GIT_SAFE = ["-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
             "-c", "core.quotePath=false", "-c", "diff.external=", "-c", "protocol.allow=never"]


class DockerRuntime:
    """Factory of Docker episodes. Reuse one per process (snapshot cache, one SDK client).

    image: default image (else `bundle.metadata["image"]`, else the ratchet base image);
    workdir: where the tree lives in the container (default /repo for the base image,
    /testbed for other images); python: the interpreter inside the image.
    """
    name = "docker"

    def __init__(self, client=None, *, image: str | None = None, workdir: str | None = None,
                 python: str = "python3", root: str | Path | None = None, reap_stale: bool = True):
        try:
            import docker  # noqa: F401
        except ImportError as e:
            raise SandboxUnavailable("the docker SDK is not installed (pip install 'docker>=7')") from e
        try:
            self.client = client or docker_engine.client(timeout=120)
            if client is not None:
                client.ping()
        except Exception as e:  # noqa: BLE001 - any failure to reach the engine
            raise SandboxUnavailable(f"no Docker engine answers: {e}") from e
        why = docker_engine.limits_reason(self.client)
        if why:
            raise SandboxUnavailable(f"{why}: refusing to run episodes without their limits")
        self.cli = docker_engine.docker_cli()
        if not self.cli:
            raise SandboxUnavailable("the docker CLI is not installed (apt-get install docker.io)")
        self.image, self.workdir, self.python = image, workdir, python
        self.root = Path(root or Path(default_root()) / "docker").resolve()
        (self.root / "episodes").mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        self.snapshots = SnapshotStore(self.root / "snapshots")
        # the scripts every container of this runtime runs: copies frozen now (sandboxes.frozen)
        from sandboxes.frozen import freeze
        self.worker, _ = freeze(_WORKER, self.root / "tools")
        self.ops, _ = freeze(_OPS, self.root / "tools")
        self.verdict_worker, _ = freeze(_VERDICT, self.root / "tools")     # `sandboxes.verdict`
        self.pytest_site = pytest_site(self.root / "tools")                # the host's pytest
        self._image_snaps: dict[tuple, object] = {}
        self._lock = threading.Lock()
        if reap_stale:
            self.reap()

    # ------------------------------------------------------------------ housekeeping
    def reap(self) -> list[str]:
        """Remove labelled containers whose owning process is gone (and their host dirs)."""
        removed = []
        try:
            stale = self.client.containers.list(all=True, filters={"label": docker_engine.LABEL})
        except Exception:  # noqa: BLE001 - best effort
            return removed
        for c in stale:
            if not _owner_alive(c.labels.get("ratchet.owner", "")):
                try:
                    c.remove(force=True)
                    removed.append(c.name)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        live = set()
        try:
            live = {c.labels.get("ratchet.episode") for c in self.client.containers.list(
                all=True, filters={"label": docker_engine.LABEL})}
        except Exception:  # noqa: BLE001
            pass
        for d in (self.root / "episodes").iterdir():
            try:
                young = time.time() - d.stat().st_mtime < 300     # may be starting right now
            except OSError:
                continue
            if d.name not in live and not young:
                shutil.rmtree(d, ignore_errors=True)
        return removed

    def resolve_image(self, bundle, image: str | None):
        name = image or self.image or (bundle.metadata or {}).get("image") or docker_engine.BASE_IMAGE
        import docker
        try:
            return self.client.images.get(name)
        except docker.errors.ImageNotFound as e:
            hint = (" (build it: python -m sandboxes.docker_engine --ensure)"
                    if name == docker_engine.BASE_IMAGE else " (no registry is used: build or load it locally)")
            raise SandboxUnavailable(f"No such image: {name}{hint}") from e

    def snapshot_of_image(self, image, workdir: str):
        """Single-commit snapshot of the tree an image holds at `workdir` (its .git left out)."""
        key = (image.id, workdir)
        with self._lock:
            if key in self._image_snaps:
                return self._image_snaps[key]
        c = self.client.containers.create(image.id, command=["true"], labels={
            docker_engine.LABEL: "1", "ratchet.owner": _owner_label(), "ratchet.episode": "image-export"})
        try:
            try:
                stream, _ = c.get_archive(workdir)
                data = b"".join(stream)
            except Exception as e:  # noqa: BLE001 - the image has no such folder: an empty tree
                if "Could not find" not in str(e) and "No such" not in str(e):
                    raise
                data = b""
        finally:
            c.remove(force=True)
        snap = self.snapshots._build(f"i-{hashlib.sha256(f'{image.id}:{workdir}'.encode()).hexdigest()[:40]}",
                                     lambda tmp: _import_tar(tmp, data),
                                     f"image:{image.tags[0] if image.tags else image.id}:{workdir}")
        with self._lock:
            self._image_snaps[key] = snap
        return snap

    # ------------------------------------------------------------------ episodes
    def episode(self, bundle, *, episode_id: str | None = None, image: str | None = None) -> "DockerEpisode":
        return DockerEpisode(self, bundle, episode_id or uuid.uuid4().hex[:16], image)

    def health_probe(self, image: str | None = None) -> str | None:
        """None when a fresh container with harness-owned files runs a command and a test."""
        from sandboxes.attribution import health_probe
        return health_probe(lambda b: self.episode(b, image=image),
                            lambda ep, argv: ep._exec([ep.python, *argv[1:]], timeout=30), "container")


class DockerEpisode:
    """One task attempt in its own container (see the module docstring)."""

    def __init__(self, rt: DockerRuntime, bundle, episode_id: str, image: str | None = None):
        self.runtime, self.bundle, self.id = rt, bundle, episode_id
        self.limits = L = bundle.limits
        self._closed, self._worker, self._ops, self.container = True, None, None, None
        self._pytest_config = None
        img = rt.resolve_image(bundle, image)
        self.image = img.tags[0] if img.tags else img.id
        self.image_id = img.id
        is_base = docker_engine.BASE_REPO in " ".join(img.tags)
        self.workdir = rt.workdir or (bundle.metadata or {}).get("workdir") or ("/repo" if is_base else "/testbed")
        self.python = (bundle.metadata or {}).get("python") or rt.python
        has_tree = bool(bundle.files) or bool(bundle.repo_path and bundle.commit)
        snap = rt.snapshots.for_bundle(bundle) if has_tree else rt.snapshot_of_image(img, self.workdir)
        self.snapshot, self.commit, self.source = snap, snap.commit, snap.source
        self.environment_digest = "sha256:" + hashlib.sha256(
            f"{bundle.environment_digest}|docker|{img.id}|{self.workdir}".encode()).hexdigest()
        self.disk_mb = int(getattr(L, "disk_mb", 256))
        archive = git(f"--git-dir={snap.gitdir}", "archive", "--format=tar", snap.commit, text=False)
        largest = _largest_member(archive)
        self.dir = rt.root / "episodes" / episode_id
        self.dir.mkdir(parents=True, exist_ok=False)
        from docker.types import Mount
        t0 = time.monotonic()
        try:
            self.container = rt.client.containers.run(
                img.id, command=[self.python, f"{TOOLS}/docker_ops.py", "--init"], detach=True, init=False,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}", working_dir=self.workdir, hostname="sandbox",
                network_mode="none", read_only=True, cap_drop=["ALL"],
                security_opt=["no-new-privileges"], ipc_mode="private",
                tmpfs={self.workdir: (f"size={self.disk_mb}m,nr_inodes={max(self.disk_mb * 256, 16384)},"
                                      f"uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755,exec"),
                       "/tmp": f"size={TMP_MB}m,mode=1777,exec"},
                mounts=[Mount(f"{TOOLS}/pytest_worker.py", rt.worker, type="bind", read_only=True),
                        Mount(f"{TOOLS}/docker_ops.py", rt.ops, type="bind", read_only=True),
                        Mount(f"{TOOLS}/verdict_worker.py", rt.verdict_worker, type="bind", read_only=True),
                        Mount(GITDIR, snap.gitdir, type="bind", read_only=True)]
                + ([Mount(SITE, rt.pytest_site, type="bind", read_only=True)] if is_base else []),
                mem_limit=f"{L.memory_mb}m", memswap_limit=f"{L.memory_mb}m",
                pids_limit=L.max_procs, nano_cpus=1_000_000_000, shm_size="16m",
                ulimits=_ulimits(L, largest), environment={**_env(), **({"PYTHONPATH": SITE} if is_base else {})},
                labels={docker_engine.LABEL: "1", "ratchet.owner": _owner_label(),
                        "ratchet.episode": episode_id, "ratchet.task": str(bundle.task_id)[:200]})
            self._closed = False
            _OPEN.add(self)
            self._runner, self._ops = _DockerRunner(self), _Ops(self)
            self._populate(archive)
        except BaseException as e:
            self._closed = False
            self.close()
            if isinstance(e, OSError) and "No space left" in str(e):
                raise ValueError(f"{bundle.task_id}: the task's repository does not fit in the "
                                 f"episode disk quota (disk_mb={self.disk_mb})") from e
            raise
        self.start_s = time.monotonic() - t0

    def _populate(self, archive: bytes) -> None:
        """Unpack the pinned tree into the workdir and give it a one-commit .git for the agent."""
        script = (f"set -e; ulimit -S -f $(ulimit -H -f); tar -x -m -f - -C {_q(self.workdir)}; cd {_q(self.workdir)}; "
                  "git init -q; "
                  f"echo {GITDIR}/objects > .git/objects/info/alternates; "
                  f"git -c safe.directory='*' reset -q {self.commit}")
        r = self._exec(["/bin/sh", "-c", script], timeout=120, stdin_bytes=archive)
        if r.infra_error or r.returncode != 0:
            if "No space left" in r.stderr:
                raise OSError(28, f"No space left on device: {r.stderr.strip()[:300]}")
            raise RuntimeError(f"could not unpack the tree into the container: "
                               f"{r.infra_error or r.stderr.strip()[:500]}")

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "DockerEpisode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the helpers, remove the container (its tmpfs go with it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for h in (self._worker, self._ops):
            if h is not None:
                h.close()
        self._worker = None
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
        _OPEN.discard(self)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"episode {self.id} is closed")

    # ------------------------------------------------------------------ processes
    def _exec_argv(self, cmd: list[str], env: dict | None = None) -> list[str]:
        a = [self.runtime.cli, "exec", "-i", "-w", self.workdir]
        for k, v in (env or {}).items():
            a += ["-e", f"{k}={v}"]
        return a + [self.container.id, *cmd]

    def _exec(self, argv: list[str], timeout: float, stdin_bytes: bytes | None = None,
              env: dict | None = None, cap: int | None = None) -> ExecResult:
        """One `docker exec`; on timeout the command's whole tree is killed."""
        cap = cap or self.limits.max_output_chars
        full = self._exec_argv(["/bin/sh", "-c", _WRAP, "sh", *argv], env)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(full, stdin=subprocess.PIPE if stdin_bytes is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            return ExecResult(None, "", "", False, time.monotonic() - t0, f"docker exec failed to spawn: {e}")
        out, err = _Capped(proc.stdout, cap * 4), _Capped(proc.stderr, cap * 4 + 64)
        if stdin_bytes is not None:
            def feed():
                try:
                    proc.stdin.write(stdin_bytes)
                    proc.stdin.close()
                except OSError:
                    pass
            threading.Thread(target=feed, daemon=True).start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        dt = time.monotonic() - t0
        so, se = out.join(), err.join()
        stderr = se.decode("utf-8", "replace")
        root_pid = None
        if stderr.startswith(_MARK):
            head, _, rest = stderr[len(_MARK):].partition("\x1e")
            root_pid, stderr = (int(head) if head.isdigit() else None), rest
        if timed_out:
            self._kill_tree(root_pid)
        infra = None
        if root_pid is None:      # the command never started (the engine, or no pid to start it)
            infra = (f"docker exec did not start the command ({'timed out' if timed_out else f'exit {proc.returncode}'}): "
                     f"{stderr.strip()[:500]}")
        stdout = _text(so, cap, out.dropped)
        stderr = _text(stderr.encode(), cap, max(err.dropped, 0))
        return ExecResult(None if timed_out else proc.returncode, stdout, stderr, timed_out, dt, infra)

    def _kill_tree(self, root_pid: int | None) -> None:
        try:
            self._ops.call({"op": "sweep", "roots": [root_pid] if root_pid else []}, timeout=10)
            if root_pid is not None:
                return
        except Exception:  # noqa: BLE001 - fall through to the full reset
            pass
        self._reset_processes()

    def _sweep(self) -> None:
        """Kill whatever the agent's code left running (orphans of finished commands/tests)."""
        try:
            self._ops.call({"op": "sweep", "roots": []}, timeout=10)
        except Exception:  # noqa: BLE001
            self._reset_processes()

    def _reset_processes(self) -> None:
        """Kill every process but pid 1 (even at the pids limit: pid 1 does it, on a signal)."""
        for h in (self._worker, self._ops):
            if h is not None and getattr(h, "proc", None) is not None:
                h.close()
        self._worker = None
        try:
            self.container.kill(signal="SIGUSR1")
        except Exception:  # noqa: BLE001 - the container is gone: the next call reports it
            return
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                if len(self.processes()) <= 1:
                    return
            except Exception:  # noqa: BLE001
                return
            time.sleep(0.02)

    def processes(self) -> list[str]:
        """Command lines of the processes in the container, seen from the engine (`docker top`)."""
        top = self.container.top(ps_args="-o pid,args")
        return [" ".join(p[1:]) for p in top.get("Processes") or []]

    def health(self) -> str | None:
        """None when the container is running, else why not (judged from outside it)."""
        try:
            self.container.reload()
        except Exception as e:  # noqa: BLE001
            return f"the container is gone: {e}"
        st = self.container.attrs.get("State", {})
        if st.get("Status") != "running":
            return f"the container is {st.get('Status')} (exit {st.get('ExitCode')}, OOMKilled={st.get('OOMKilled')})"
        return None

    def run(self, cmd: str | list[str], timeout: float | None = None, *, stdin: str | None = None,
            env: dict | None = None, deterministic: bool = False) -> ExecResult:
        """Run a shell string (`sh -c`) or an argv list in the container, cwd = the workdir.
        (`deterministic` matters only to a runtime with a test-result cache; this one has none.)"""
        self._check_open()
        t = min(timeout or self.limits.wall_s, self.limits.wall_s)
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        r = self._exec(argv, t, None if stdin is None else stdin.encode(), env)
        if not r.timed_out:
            self._sweep()
        if r.infra_error:
            bad = self.health() or self.runtime.health_probe(self.image)
            if bad is None:      # the engine is fine: this episode's own state broke the command
                self._reset_processes()
                return ExecResult(r.returncode if r.returncode is not None else 125, r.stdout,
                                  (r.stderr + "\n" if r.stderr else "") +
                                  f"[the sandbox could not run the command in this episode's state: "
                                  f"{r.infra_error[:300]}]", r.timed_out, r.duration_s, None)
            r.infra_error = f"{r.infra_error}; health probe: {bad}"
        return r

    def apply_patch(self, patch: str) -> ExecResult:
        """`git apply` a unified diff in the workdir (e.g. SWE-bench's test_patch)."""
        return self.run(["git", "apply", "--whitespace=nowarn", "-"], stdin=patch)

    def run_tests(self, test_ids=None, *, coverage: bool = False, timeout: float | None = None) -> TestReport:
        """Run pytest node ids (all when None) in the warm per-episode worker inside the container."""
        self._check_open()
        L = self.limits
        t = min(timeout or L.wall_s, max(L.wall_s, getattr(L, "verify_s", L.wall_s)))
        rep = self._run_tests_raw(test_ids, coverage, t)
        self._sweep()
        if rep.infra_error:
            from sandboxes.attribution import attribute
            rep = attribute(rep, test_ids, lambda: self.health() or self.runtime.health_probe(self.image))
        return rep

    def spawn_callee(self, module: str):
        """Start the data verdict's callee in the container (`sandboxes.verdict_worker --callee`)."""
        self._check_open()
        return self._runner.popen(
            [self.python, f"{TOOLS}/verdict_worker.py", "--callee", "--root", self.workdir, "--module", module],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def _run_tests_raw(self, test_ids, coverage: bool, timeout: float) -> TestReport:
        from sandboxes.pytest_worker import PytestWorkerClient
        if self._worker is None:
            self._worker = PytestWorkerClient(self._runner, self.workdir, str(self.dir / "worker.stderr"))
        t0 = time.monotonic()
        resp = self._worker.request(test_ids, coverage, timeout, self.limits.max_output_chars,
                                    test_cpu_s=self.limits.test_cpu_s, config=self.pytest_config())
        if resp.get("error"):
            self._reset_processes()        # closes the worker; the next call starts a fresh one
        return report_from_worker(resp, test_ids, time.monotonic() - t0)

    def pytest_config(self) -> dict:
        """The task's own pytest configuration as pinned: the only one a test run reads."""
        if self._pytest_config is None:
            from sandboxes.pytest_config import task_config
            self._pytest_config = task_config(self.bundle, self.pristine_bytes)
        return self._pytest_config

    # ------------------------------------------------------------------ files
    def _rel(self, path: str) -> str:
        return _split(path, self.workdir)

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_open()
        rel = self._rel(path)
        if not rel:
            raise IsADirectoryError(path)
        return base64.b64decode(self._ops.call({"op": "read", "path": rel, "max": max_bytes})["data"])

    def read_file(self, path: str, max_chars: int | None = None) -> str:
        data = self.read_bytes(path, None if max_chars is None else max_chars * 4)
        text = data.decode("utf-8", "replace")
        return text if max_chars is None else text[:max_chars]

    def write_bytes(self, path: str, data: bytes) -> str:
        """Write (create or replace) a file; returns its normalised relative path."""
        self._check_open()
        if len(data) > self.limits.max_file_mb * 1024 * 1024:
            raise ValueError(f"file too large for this episode: {len(data)} bytes")
        rel = self._rel(path)
        if not rel or rel.split("/")[0] == ".git":
            raise PathEscape(f"refusing to write {path!r}")
        return self._ops.call({"op": "write", "path": rel, "data": base64.b64encode(data).decode()})["path"]

    def write_file(self, path: str, text: str) -> str:
        return self.write_bytes(path, text.encode())

    def delete_file(self, path: str) -> None:
        self._check_open()
        rel = self._rel(path)
        if not rel or rel.split("/")[0] == ".git":
            raise PathEscape(f"refusing to delete {path!r}")
        self._ops.call({"op": "delete", "path": rel})

    def list_files(self, path: str = ".") -> list[str]:
        self._check_open()
        return self._ops.call({"op": "list", "path": self._rel(path)})["files"]

    def disk_usage(self) -> int:
        """Bytes the workdir tmpfs holds now (its size is the quota: limits.disk_mb)."""
        self._check_open()
        return int(self._ops.call({"op": "usage"})["bytes"])

    # ------------------------------------------------------------------ for verifiers
    def _staged_git(self, *args: str) -> str:
        """git over the workdir against the read-only snapshot, staged in a fresh scratch index."""
        self._check_open()
        g = " ".join(_q(a) for a in ["git", *_GIT_SAFE, f"--git-dir={GITDIR}", f"--work-tree={self.workdir}"])
        script = ("set -e; s=$(mktemp -d); trap 'rm -rf \"$s\"' EXIT; mkdir \"$s/objects\"; "
                  "export GIT_INDEX_FILE=\"$s/index\" GIT_OBJECT_DIRECTORY=\"$s/objects\" "
                  f"GIT_ALTERNATE_OBJECT_DIRECTORIES={GITDIR}/objects GIT_CONFIG_NOSYSTEM=1 "
                  "GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 HOME=/nonexistent LC_ALL=C; "
                  # every file and symlink, listed by find: a nested .git (an empty `git init`
                  # in a subfolder) must neither hide its folder as a gitlink nor fail the add
                  # (and nothing the agent made unreadable to its own uid fails the listing)
                  f"cd {_q(self.workdir)}; chmod -R u+rX . 2>/dev/null || true; find . \\( -name .git -o -name __pycache__ -o -name .pytest_cache \\) "
                  "-prune -o \\( -type f -o -type l \\) ! -name '*.pyc' -printf '%P\\0' | "
                  f"{g} update-index --add -z --stdin; "
                  f"{g} {' '.join(_q(a) for a in args)}")
        # the output is never capped below what the workdir can hold (a diff comes back whole)
        r = self._exec(["/bin/sh", "-c", script], timeout=max(self.limits.wall_s, 120),
                       cap=4 * self.disk_mb * 1024 * 1024 + 65536)
        if r.infra_error or r.returncode != 0 or r.stdout.endswith("more bytes) ...]"):
            raise RuntimeError(f"git in the container failed: {r.infra_error or r.stderr.strip()[:500] or 'output too large'}")
        return r.stdout

    def diff(self) -> str:
        """Unified diff (git, --binary) of the workdir against the pinned commit."""
        return self._staged_git("diff", "--cached", "--no-color", "--no-ext-diff", "--no-textconv",
                                "--no-renames", "--binary", self.commit)

    def changed_paths(self) -> list[str]:
        """Relative paths added, modified or deleted since the pinned commit (sorted)."""
        out = self._staged_git("diff", "--cached", "--name-only", "--no-renames", "-z", self.commit)
        return sorted(p for p in out.split("\0") if p)

    def pristine_bytes(self, path: str) -> bytes | None:
        """The file at the pinned commit, read on the host from the snapshot."""
        from sandboxes.worktree import GitError
        try:
            rel = self._rel(path)
        except PathEscape:
            return None
        if not rel:
            return None
        try:
            return git(f"--git-dir={self.snapshot.gitdir}", "cat-file", "blob", f"{self.commit}:{rel}", text=False)
        except GitError:
            return None


@atexit.register
def _close_open_episodes() -> None:
    for ep in list(_OPEN):
        try:
            ep.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
