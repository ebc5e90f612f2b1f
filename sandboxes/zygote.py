"""Warm pytest workers forked into bwrap namespaces instead of started inside them.

Every sandbox that runs tests (an episode's first `run_tests`/`localize`, every pristine
verification) used to start a fresh interpreter that imports pytest: ~0.25 of the ~0.4 CPU-s a
verification costs, and on 2 cores the largest share of an episode's sandbox work. With root,
the runtime keeps one zygote per process (`pytest_worker.py --zygote`): started outside every
sandbox with the sandbox's clean environment, it imports pytest and warms up once (no repository
code: the state a fresh worker reaches). A worker is then made in three steps:

1. bwrap builds the namespace exactly as before (the same argv, rlimits and episode uid) around
   a placeholder (`sleep infinity`) that holds it; its "started" marker says the mounts are done;
2. the host opens the placeholder's namespace files and root directory and passes them, with
   the worker's stdin/stdout/stderr, to the zygote over a unix socket (SCM_RIGHTS);
3. the zygote forks; the child joins those namespaces (setns), chroots to the sandbox root and
   forks the worker into the sandbox's pid namespace; the worker closes every other descriptor,
   starts its own session (setsid), sets the rlimits, drops to the episode uid (no groups, no
   capabilities, no_new_privs), takes the clean environment and serves as a worker started by
   bwrap would.

`tests/sandboxes/test_zygote.py` checks that a test sees the same thing both ways (uid, groups,
capabilities, limits, root directory, hostname, network, processes, descriptors, environment).
Killing the bwrap process still kills the worker (its pid namespace dies with it). Used only with
bwrap as root (setns needs it) and a per-episode uid; `RATCHET_ZYGOTE=0` turns it off; a spawn
that fails falls back to starting the worker inside the sandbox.
"""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading

NAMESPACES = ("ipc", "uts", "net", "cgroup", "pid", "mnt")    # mnt last: it changes what /proc is


def enabled(isolation: str) -> bool:
    return isolation == "bwrap" and os.geteuid() == 0 and os.environ.get("RATCHET_ZYGOTE", "1") != "0"


_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()


def shared(worker: str, digest: str, stderr_path) -> "Zygote":
    """The process's zygote for this worker code (one for every runtime that runs it; a forked
    child gets its own). `worker` and `stderr_path` are where a (re)start reads and writes."""
    with _SHARED_LOCK:
        z = _SHARED.get((os.getpid(), digest))
        if z is None:
            z = _SHARED[(os.getpid(), digest)] = Zygote(worker, str(stderr_path))
        else:                           # the first runtime's copy may be gone by the next restart
            z.worker, z.stderr_path = worker, str(stderr_path)
        return z


def live_cpu_s() -> list[float]:
    """CPU seconds (own + reaped workers') of this process's running zygotes (`sandboxes.cpu_meter`)."""
    with _SHARED_LOCK:
        mine = [z for (pid, _), z in _SHARED.items() if pid == os.getpid()]
    return [z.cpu_s() for z in mine]


class ZygoteProc:
    """What `PytestWorkerClient` needs of a worker process: its pipes, and a pid whose process
    group kills it (the bwrap that holds its namespace)."""

    def __init__(self, bwrap: subprocess.Popen, stdin, stdout, worker_pid: int, zygote_pid: int | None = None):
        self._bwrap, self.stdin, self.stdout, self.worker_pid = bwrap, stdin, stdout, worker_pid
        self.zygote_pid = zygote_pid    # the worker's parent (it reaps it), for sandboxes.cpu_meter
        self.pid = bwrap.pid

    def poll(self):
        return self._bwrap.poll()

    @property
    def returncode(self):
        return self._bwrap.returncode

    def wait(self, timeout: float | None = None):
        return self._bwrap.wait(timeout)


class Zygote:
    """The zygote process, started on first use and again if it died; thread-safe."""

    def __init__(self, worker: str, stderr_path: str, start_timeout: float = 60.0):
        self.worker, self.stderr_path, self.start_timeout = worker, stderr_path, start_timeout
        self._lock = threading.Lock()
        self._proc = self._sock = None
        self.spawned = self.failed = 0
        self.last_error: str | None = None

    # -- the zygote process ------------------------------------------------------------------
    def _ensure(self) -> bool:
        if self._proc is not None and self._proc.poll() is None:
            return True
        self._stop()
        from sandboxes.isolation import SANDBOX_HOME, clean_env
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(self.stderr_path, "ab") as err:
                self._proc = subprocess.Popen(
                    [sys.executable, self.worker, "--zygote", str(child.fileno())], pass_fds=(child.fileno(),),
                    env=clean_env(SANDBOX_HOME), cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err)
        except OSError as e:
            host.close()
            self.last_error = f"zygote did not start: {e}"
            return False
        finally:
            child.close()
        self._sock = host
        if not select.select([host], [], [], self.start_timeout)[0] or \
                not json.loads(host.recv(4096) or b"{}").get("ready"):
            self.last_error = "zygote did not become ready"
            self._stop()
            return False
        return True

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()          # the zygote exits on EOF
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def cpu_s(self) -> float:
        """The zygote's own CPU time and that of the workers it reaped; 0 once it is reaped
        here (then its time is in this process's RUSAGE_CHILDREN). Under the lock: never both."""
        from sandboxes.cpu_meter import _times
        with self._lock:
            p = self._proc
            return 0.0 if p is None or p.returncode is not None else (_times(p.pid) or 0.0)

    # -- workers -------------------------------------------------------------------------------
    def spawn(self, runner, root: str, *, kill_strays: bool, stderr) -> ZygoteProc | None:
        """A worker for `runner`'s sandbox (a `Bwrap`), or None (the caller starts one itself)."""
        from sandboxes.attribution import stop_process
        from sandboxes.isolation import SANDBOX_GID, rlimits

        bw = _placeholder(runner)
        if bw is None:
            return self._fail("the placeholder sandbox did not start")
        own, keep = [], []              # descriptors to close here / handed to the caller
        try:
            leaf = _leaf(bw.pid)
            if leaf is None:
                raise OSError("no placeholder process in the sandbox")
            for n in NAMESPACES:        # one at a time into `own`: a failed open closes the rest
                own.append(os.open(f"/proc/{leaf}/ns/{n}", os.O_RDONLY))
            own.append(os.open(f"/proc/{leaf}/root", os.O_RDONLY | os.O_DIRECTORY))
            if _leaf(bw.pid) != leaf:   # opened after a pid reuse: refuse
                raise OSError("the placeholder changed while its namespaces were opened")
            in_r, in_w = os.pipe()
            keep.append(in_w)
            own.append(in_r)
            out_r, out_w = os.pipe()
            keep.append(out_r)
            own.append(out_w)
            req = {"ns": list(NAMESPACES), "root": root, "uid": runner.spec.uid, "gid": SANDBOX_GID,
                   "rlimits": rlimits(runner.spec), "env": runner.env(),
                   "argv0": runner.tool_path("pytest_worker.py"), "kill_strays": kill_strays}
            with self._lock:
                if not self._ensure():
                    raise OSError(self.last_error)
                zygote_pid = self._proc.pid
                socket.send_fds(self._sock, [json.dumps(req).encode()], own + [stderr.fileno()])
                if not select.select([self._sock], [], [], 30)[0]:
                    self._stop()
                    raise OSError("the zygote did not answer")
                reply = json.loads(self._sock.recv(65536) or b'{"error": "the zygote exited"}')
            if "pid" not in reply:
                raise OSError(reply.get("error"))
        except (OSError, ValueError) as e:
            for fd in keep:
                os.close(fd)
            stop_process(bw)
            return self._fail(str(e))
        finally:
            for fd in own:
                os.close(fd)
        self.spawned += 1
        return ZygoteProc(bw, os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"), int(reply["pid"]), zygote_pid)

    def _fail(self, why: str) -> None:
        self.failed += 1
        self.last_error = why
        return None


def _placeholder(runner) -> subprocess.Popen | None:
    """bwrap holding the sandbox's namespaces around `sleep infinity`, once its mounts are done."""
    from sandboxes.attribution import stop_process
    r, w = os.pipe()
    os.fchmod(w, 0o622)                 # the sandbox uid writes the marker via /proc/self/fd
    try:
        bw = runner.popen(["sleep", "infinity"], status_fd=w, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        os.close(r)
        return None
    finally:
        os.close(w)
    got = b""
    while b"started" not in got and select.select([r], [], [], 10.0)[0]:
        chunk = os.read(r, 64)
        if not chunk:
            break
        got += chunk
    os.close(r)
    if b"started" not in got:
        stop_process(bw)
        return None
    return bw


def _leaf(pid: int, wait_s: float = 2.0) -> int | None:
    """The placeholder: the `sleep` at the end of bwrap's process chain (the marker is written
    just before the shell execs it, so give the exec a moment)."""
    import time
    deadline = time.monotonic() + wait_s
    while True:
        leaf = _chain_end(pid)
        try:
            with open(f"/proc/{leaf}/comm") as f:
                if f.read().strip() == "sleep":
                    return leaf
        except (OSError, TypeError):
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)


def _chain_end(pid: int) -> int | None:
    for _ in range(4):
        try:
            kids = [int(k) for t in os.listdir(f"/proc/{pid}/task")
                    for k in open(f"/proc/{pid}/task/{t}/children").read().split()]
        except OSError:
            return None
        if len(kids) != 1:
            break
        pid = kids[0]
    return pid
