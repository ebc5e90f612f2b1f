"""Plumbing of the Docker runtime (`sandboxes.docker_runtime`): container ownership labels, the
snapshot import, capped output capture, the `docker exec` runner the pytest worker client
drives, the client of the in-container file helper (`docker_ops.py`), path normalisation, and
the container's rlimits and environment. Split out so that the runtime module reads as the
protocol it implements.
"""
from __future__ import annotations

import io
import json
import math
import os
import socket
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

from sandboxes.runtime import PathEscape
from sandboxes.worktree import git

TOOLS = "/.ratchet"


def _owner_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _start_time(pid: int) -> str:
    try:
        s = Path(f"/proc/{pid}/stat").read_bytes()
        return s[s.rindex(b")") + 2:].split()[19].decode()
    except (OSError, ValueError, IndexError):
        return "?"


def _owner_alive(label: str) -> bool:
    try:
        host, pid, start = label.rsplit(":", 2)
    except ValueError:
        return False
    if host != socket.gethostname():
        return True                       # another machine's engine client: not ours to judge
    return _start_time(int(pid)) == start


def _import_tar(gitdir: Path, data: bytes) -> str:
    """Write the tar's files (first path component dropped, .git left out) as one commit."""
    ref = "refs/heads/snapshot"
    stream = bytearray(f"commit {ref}\ncommitter ratchet <sandbox@ratchet.local> 0 +0000\ndata 0\n".encode())
    if data:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf:
                parts = [p for p in m.name.split("/") if p not in ("", ".")][1:]
                if not parts or parts[0] == ".git" or ".." in parts or "__pycache__" in parts:
                    continue
                path = "/".join(parts)
                if "\n" in path or '"' in path:
                    continue
                if m.issym():
                    blob, mode = m.linkname.encode(), "120000"
                elif m.isfile() or m.islnk():
                    f = tf.extractfile(m)
                    if f is None:
                        continue
                    blob, mode = f.read(), ("100755" if m.mode & 0o111 else "100644")
                else:
                    continue
                stream += f"M {mode} inline {path}\ndata {len(blob)}\n".encode() + blob + b"\n"
    git("-C", str(gitdir), "fast-import", "--quiet", input=bytes(stream))
    return git("-C", str(gitdir), "rev-parse", f"{ref}^{{tree}}").strip()


class _Capped:
    """Drains a pipe on a thread, keeping at most `cap` bytes."""

    def __init__(self, stream, cap: int):
        self.buf, self.dropped = bytearray(), 0
        self._t = threading.Thread(target=self._pump, args=(stream, cap), daemon=True)
        self._t.start()

    def _pump(self, stream, cap):
        try:
            while chunk := stream.read1(65536):
                room = max(cap - len(self.buf), 0)
                self.buf += chunk[:room]
                self.dropped += len(chunk) - min(len(chunk), room)
        except (OSError, ValueError):
            pass

    def join(self, timeout: float = 2.0) -> bytes:
        self._t.join(timeout)
        return bytes(self.buf)


def _text(data: bytes, cap: int, dropped: int = 0) -> str:
    s = data.decode("utf-8", "replace")
    if len(s) > cap or dropped:
        s = s[:cap] + f"\n[... output truncated ({dropped} more bytes) ...]"
    return s


class _DockerRunner:
    """What `PytestWorkerClient` needs from an isolation runner: popen through `docker exec`."""
    name = "docker"

    def __init__(self, ep):
        self.ep = ep

    def tool_path(self, name: str) -> str:
        return f"{TOOLS}/{name}"

    def popen(self, cmd, *, stdin=None, stdout=None, stderr=None, env=None, **kw):
        cmd = list(cmd)
        if cmd and cmd[0] == sys.executable:      # the host interpreter means the image's
            cmd[0] = self.ep.python
        return subprocess.Popen(self.ep._exec_argv(cmd, env=env), stdin=stdin, stdout=stdout,
                                stderr=stderr, start_new_session=True)


class _Ops:
    """Host side of the persistent in-container file helper (`docker_ops.py`)."""

    def __init__(self, ep):
        self.ep, self.proc, self._buf = ep, None, b""

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            self.ep._exec_argv([self.ep.python, f"{TOOLS}/docker_ops.py", "--root", self.ep.workdir]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self._buf = b""
        first = self._readline(20)
        if not first or not first.get("ready"):
            self.close()
            raise OSError(f"the in-container file helper did not start ({first})")

    def _readline(self, timeout: float):
        from sandboxes.pytest_worker import read_json_line
        obj, self._buf = read_json_line(self.proc.stdout.fileno(), self._buf, timeout)
        return obj

    def call(self, req: dict, timeout: float = 60):
        resp = None
        for attempt in (0, 1):
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
                self.proc.stdin.write((json.dumps(req) + "\n").encode())
                self.proc.stdin.flush()
                resp = self._readline(timeout)
            except OSError:
                resp = None
            if resp is not None:
                break
            self.close()
            if attempt == 0:
                self.ep._reset_processes()       # e.g. the agent killed it, or filled the pids
        if resp is None:
            raise RuntimeError(f"sandbox file helper unavailable in episode {self.ep.id}")
        err = resp.get("error")
        if not err:
            return resp
        msg = resp.get("msg", "")
        if err == "PathEscape":
            raise PathEscape(msg)
        exc = {"FileNotFoundError": FileNotFoundError, "IsADirectoryError": IsADirectoryError,
               "NotADirectoryError": NotADirectoryError, "PermissionError": PermissionError}.get(err)
        if exc:
            raise exc(msg)
        if resp.get("errno"):
            raise OSError(resp["errno"], msg)
        raise RuntimeError(f"{err}: {msg}")

    def close(self) -> None:
        from sandboxes.attribution import stop_process
        stop_process(self.proc)
        self.proc = None


def _split(path: str, workdir: str) -> str:
    """A path relative to the workdir (`/repo/x` and `<workdir>/x` accepted), or PathEscape."""
    p = str(path)
    if "\x00" in p:
        raise PathEscape("NUL byte in path")
    for root in {workdir, "/repo"}:
        if p == root or p.startswith(root + "/"):
            p = p[len(root):]
            break
    else:
        if p.startswith("/"):
            raise PathEscape(f"absolute path outside the worktree: {path!r}")
    out: list[str] = []
    for part in p.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise PathEscape(f"path escapes the worktree: {path!r}")
            out.pop()
        else:
            out.append(part)
    return "/".join(out)


def _q(s: str) -> str:
    import shlex
    return shlex.quote(s)


def _largest_member(archive: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tf:
        return max((m.size for m in tf if m.isfile()), default=0)


def _ulimits(L, largest: int = 0) -> list:
    """RLIMIT_FSIZE is limits.max_file_mb (soft); the hard limit is raised to the task's own
    largest file only, so that unpacking the tree (which lifts its soft limit) cannot fail.
    RLIMIT_CPU is max(cpu_s, wall_s, verify_s), as under bwrap (`sandboxes.runtime`)."""
    from docker.types import Ulimit
    fsize = int(L.max_file_mb) * 1024 * 1024
    # a backstop above every wall clock, as bwrap's: the final test run may take up to verify_s
    cpu = int(max(getattr(L, "cpu_s", 0) or 0, math.ceil(max(L.wall_s, getattr(L, "verify_s", 0) or 0))))
    return [Ulimit(name="fsize", soft=fsize, hard=max(fsize, largest)), Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="cpu", soft=cpu, hard=cpu + 1), Ulimit(name="nofile", soft=4096, hard=4096)]


PYTEST_DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
SITE = f"{TOOLS}/site"


def pytest_site(into: Path) -> str:
    """A read-only copy of the host's pytest and its dependencies (pure Python), named by their
    versions, for the base image to run instead of its own (Debian's pytest 7.2.1): one pytest
    for both runtimes, so a test run reads the same options the same way under bwrap and Docker.
    Bytecode is copied with its sources' times, so the copy imports as fast as the host's."""
    import hashlib
    import importlib.metadata as md
    import shutil
    import uuid
    dists = [md.distribution(n) for n in PYTEST_DISTS]
    key = hashlib.sha256(" ".join(f"{d.metadata['Name']}=={d.version}" for d in dists).encode()).hexdigest()[:16]
    dest = Path(into) / f"pytest-site-{key}"
    if (dest / ".complete").exists():
        return str(dest)
    tmp = Path(into) / f".pytest-site-{uuid.uuid4().hex[:8]}"
    for d in dists:
        for f in d.files or ():
            if str(f).startswith(".."):            # console scripts live outside site-packages
                continue
            src, out = Path(d.locate_file(f)), tmp / str(f)
            if src.is_file():
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, out)
    (tmp / ".complete").write_text(key)
    for root, dirs, files in os.walk(tmp):
        for n in files:
            os.chmod(os.path.join(root, n), 0o444)
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o555)
    try:
        os.rename(tmp, dest)
    except OSError:                                 # another runtime made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(dest)


def _env() -> dict[str, str]:
    """The whole environment of every process in the container (nothing from the host)."""
    return {"HOME": "/tmp", "TMPDIR": "/tmp", "USER": "sandbox", "LOGNAME": "sandbox",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "TERM": "dumb",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
