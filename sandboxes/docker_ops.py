"""In-container helper of the Docker runtime: file access and process sweeps for one episode.

Bind-mounted read-only at /.ratchet/docker_ops.py. `--init` is the container's pid 1 (`init`).
The file helper is started once per episode with
`docker exec -i ... python3 /.ratchet/docker_ops.py --root /repo`; it serves one JSON request
per stdin line and answers one JSON line, so a file operation costs a pipe round trip instead of
a `docker exec` (~60 ms). It runs as the sandbox user, inside the sandbox: whatever a path
resolves to, it can only reach what the sandbox itself can (the container's own files).

    {"op": "read", "path": "a/b.py", "max": null}    -> {"data": "<base64>"}
    {"op": "write", "path": "a/b.py", "data": "<base64>"} -> {"path": "a/b.py"}
    {"op": "delete", "path": "a/b.py"}               -> {}
    {"op": "list", "path": "."}                      -> {"files": [...]}
    {"op": "usage"}                                  -> {"bytes": N}
    {"op": "sweep", "roots": [pid, ...]}             -> {"killed": N}
    errors                                           -> {"error": "FileNotFoundError", "msg": ...}

`sweep` kills every process left behind: the subtrees of `roots` (a command that timed out)
and every orphan (a process whose ancestry reaches pid 1, the container's reaper, instead of a
process that `docker exec` started: the harness's own processes are the only ones with parent
pid 0). Only the standard library; runs on any Python >= 3.6 an image may have.
"""
import base64
import json
import os
import signal
import stat
import sys
import time

ROOT = "/repo"


class PathEscape(Exception):
    pass


def _unlock(rel, write=False):
    """Give the owner back access along `rel`: every file here is the sandbox uid's, and code
    the agent ran may have chmod-ed its own files to 000 (that must not break the harness)."""
    cur = ROOT
    parts = [p for p in rel.split("/") if p] if rel else []
    for i, part in enumerate([""] + parts):
        if part:
            cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            return
        want = 0o700 if stat.S_ISDIR(st.st_mode) else (0o600 if write else 0o400)
        if st.st_mode & want != want:
            try:
                os.chmod(cur, stat.S_IMODE(st.st_mode) | want)
            except OSError:
                pass


def _real(rel, write=False):
    _unlock(rel, write)
    path = os.path.join(ROOT, rel) if rel else ROOT
    real = os.path.realpath(path)
    if real != ROOT and not real.startswith(ROOT + "/"):
        raise PathEscape("%r resolves outside the worktree (%s)" % (rel, real))
    return real


def _relpath(real):
    return "" if real == ROOT else real[len(ROOT) + 1:]


def op_read(req):
    real = _real(req["path"])
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(req["path"])
        if not stat.S_ISREG(st.st_mode):
            raise PathEscape("%r is not a regular file" % req["path"])
        limit = req.get("max")
        chunks, left = [], (limit if limit is not None else -1)
        while left != 0:
            b = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            if left > 0:
                left -= len(b)
    finally:
        os.close(fd)
    return {"data": base64.b64encode(b"".join(chunks)).decode()}


def op_write(req):
    real = _real(req["path"], write=True)
    rel = _relpath(real)
    if not rel or rel.split("/")[0] == ".git":
        raise PathEscape("refusing to write %r" % req["path"])
    parent = os.path.dirname(real)
    os.makedirs(parent, exist_ok=True)
    if os.path.realpath(parent) != parent:
        raise PathEscape("%r: a parent directory changed under us" % req["path"])
    fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(base64.b64decode(req["data"]))
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)
    return {"path": rel}


def op_delete(req):
    real = _real(req["path"], write=True)
    rel = _relpath(real)
    if not rel or rel.split("/")[0] == ".git":
        raise PathEscape("refusing to delete %r" % req["path"])
    os.unlink(real)
    return {}


def op_list(req):
    base = _real(req.get("path") or ".")
    if not os.path.isdir(base):
        raise NotADirectoryError(req.get("path"))
    out, stack, limit = [], [base], int(req.get("limit") or 10000)
    while stack:
        d = stack.pop()
        _unlock(_relpath(d))
        with os.scandir(d) as it:
            for e in it:
                rel = _relpath(e.path)
                if rel == ".git" or e.name == "__pycache__":
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    out.append(rel)
    return {"files": sorted(out)[:limit]}


def op_usage(req):
    if os.path.ismount(ROOT):
        st = os.statvfs(ROOT)
        return {"bytes": (st.f_blocks - st.f_bfree) * st.f_frsize}
    total = 0
    for d, dirs, files in os.walk(ROOT):
        for n in files:
            try:
                total += os.lstat(os.path.join(d, n)).st_size
            except OSError:
                pass
    return {"bytes": total}


def _procs():
    """pid -> (ppid, state) for every process in the container's pid namespace."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                s = f.read()
            rest = s[s.rindex(b")") + 2:].split()
            out[int(name)] = (int(rest[1]), rest[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def _victims(roots):
    procs, me, out = _procs(), os.getpid(), []
    for pid, (ppid, state) in procs.items():
        if pid in (1, me) or state == b"Z":
            continue
        cur, hops = pid, 0
        while hops < 100000:
            if cur in roots:
                out.append(pid)
                break
            parent = procs.get(cur, (None,))[0]
            if parent == 1:            # reparented to the reaper: left behind
                out.append(pid)
                break
            if parent in (0, None):    # started by `docker exec` (the harness) or gone
                break
            cur, hops = parent, hops + 1
    return out


def op_sweep(req):
    roots = set(int(p) for p in req.get("roots") or ())
    killed, deadline = 0, time.monotonic() + float(req.get("timeout") or 5)
    while time.monotonic() < deadline:
        victims = _victims(roots)
        if not victims:
            return {"killed": killed}
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)
    raise TimeoutError("processes left behind survived the sweep: %s" % _victims(roots)[:20])


def init():
    """pid 1 of the container: reap orphans (so zombies never hold pids) and, on SIGUSR1 from
    the engine (`docker kill -s USR1`), kill every other process in the container: it needs no
    new process, so it works even when a fork bomb holds every pid. Every other catchable signal
    is ignored; the kernel never delivers SIGKILL/SIGSTOP to a namespace's init from inside."""
    wanted = {signal.SIGCHLD, signal.SIGUSR1}
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2,
              signal.SIGPIPE, signal.SIGALRM, signal.SIGXCPU, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)

    def reap():
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return

    while True:
        if signal.sigwait(wanted) == signal.SIGUSR1:
            end = time.monotonic() + 5
            while time.monotonic() < end:
                try:
                    os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass
                reap()
                if not [n for n in os.listdir("/proc") if n.isdigit() and n != "1"]:
                    break
                time.sleep(0.002)
        reap()


OPS = {"read": op_read, "write": op_write, "delete": op_delete, "list": op_list,
       "usage": op_usage, "sweep": op_sweep}


def serve():
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            resp = OPS[req["op"]](req)
        except Exception as e:  # noqa: BLE001 - every failure goes back to the host
            resp = {"error": type(e).__name__, "msg": str(e)[:500],
                    "errno": getattr(e, "errno", None)}
        proto.write(json.dumps(resp) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--init"]:
        init()
    if len(sys.argv) == 3 and sys.argv[1] == "--root":
        ROOT = os.path.realpath(sys.argv[2])
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    serve()
