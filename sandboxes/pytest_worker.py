"""Warm pytest worker: one pre-imported pytest per episode, forking once per test run.

Inside the sandbox (`python pytest_worker.py --root /repo`) the worker imports pytest and its
built-in plugins once, prints `{"ready": true}` and then serves one JSON request per stdin line:

    {"test_ids": ["test_solution.py::test_a"] | null, "coverage": false, "timeout": 30,
     "test_cpu_s": 2.0 | null, "config": {"name": "pytest.ini", "text": "[pytest]\n"} | null}

Each request runs in a forked child (forked ahead of time: `_Runner`); the child runs
`pytest.main` (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 and no PYTEST_ADDOPTS / PYTEST_PLUGINS,
`-c <the request's config, written to a private folder>`, `--rootdir` and `--confcutdir` the
repository, `-p no:cacheprovider`, the hash seed fixed by the sandbox env; all builtin plugins
kept) with a small plugin that records
per-test outcomes (passed / failed / error / skipped) and, optionally, per-test line coverage
via sys.settrace; the child sends them back over a pipe. The worker answers one JSON line:

    {"outcomes": {...}, "coverage": {...} | null, "exit_code": 0, "timed_out": false,
     "test_timeouts": [...], "output": "<tail of pytest's output>",
     "scratch_changed": false}          # only when the request said "scratch": true

A run that exceeds its timeout has its process group killed (every requested test: error). With
`test_cpu_s` each test also has its own CPU limit (`_PerTestLimit`): the test that uses more
fails with TestTimeout, the pytest session stops there and the tests not run are errors, so a loop
costs one test's limit instead of the whole run's wall clock; after every run the worker also
kills any other process left in the namespace (daemons a test spawned). User code is imported
only in the forked child, so every run sees the current files.

What the worker does once so that each child starts hot (the per-run cost is what is left of
pytest itself: reading ini files and conftests, collecting, rewriting asserts, running):
* builds the next run's `Config` (plugin manager, builtin plugins registered, options
  declared: nothing that depends on the repo), which the child's `pytest.main` picks up;
* caches the fixture scan each pytest session makes of pytest's own plugins
  (`_install_fixture_scan_cache`);
* runs one small pytest session (pass, fail, skip, parametrize) to warm import, regex and inspect
  caches, then removes its module again and `gc.freeze()`s the heap.

As root with bwrap the host usually does not start this file inside the sandbox: a zygote
(`--zygote FD`, below; host side in `sandboxes.zygote`) runs the same warm-up once and forks each
worker into the sandbox's namespaces, where it serves exactly as above.

Size: ~700 lines, on purpose one self-contained file. It is what runs inside the sandbox: bwrap
read-only-binds this one file at /.ratchet/pytest_worker.py (`runtime.py`: `tool_files`) and
Docker mounts it alone (`docker_runtime.py`), and the sandbox's interpreter (in Docker, the
image's own python and pytest) runs it as a script, where the `sandboxes` package does not
exist. So it imports only the standard library and pytest, and cannot be split into modules
without mounting each of them too. The host half (`PytestWorkerClient`, `read_json_line`,
`NOT_STARTED`) lives in `sandboxes.worker_client`; the old import path still works.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

_RESULT_CAP = 64 * 1024 * 1024
_PREPARED = None
_KEEP: set[int] = set()     # processes of the namespace the worker found there (zygote mode)


# ----------------------------------------------------------------------------- in the sandbox
class _Collector:
    def __init__(self, root: str, coverage: bool):
        self.outcomes: dict[str, str] = {}
        self.root = root.rstrip("/") + "/"
        self.coverage: dict[str, dict[str, set]] | None = {} if coverage else None
        self._files: dict[str, str | bool] = {}
        self._cur: dict[str, set] | None = None

    def pytest_runtest_logreport(self, report):
        nid, prev = report.nodeid, self.outcomes.get(report.nodeid)
        if report.when == "call":
            o = "passed" if report.passed else "skipped" if report.skipped else "failed"
            if prev != "error":
                self.outcomes[nid] = o
        elif report.failed:
            self.outcomes[nid] = "error"
        elif report.skipped and report.when == "setup":
            self.outcomes[nid] = "skipped"

    def pytest_runtest_makereport(self, item, call):
        _note_new_modules()    # before pytest formats a failure (inspect.getmodule)

    def pytest_collectreport(self, report):
        if report.failed:
            self.outcomes.setdefault(report.nodeid or "<collection>", "error")

    # per-test line coverage (sys.monitoring needs 3.12; settrace is what 3.11 has)
    def _rel(self, code) -> str | bool:
        fn = code.co_filename
        r = self._files.get(fn)
        if r is None:
            r = self._files[fn] = fn[len(self.root):] if fn.startswith(self.root) else False
        return r

    def _trace(self, frame, event, arg):
        rel = self._rel(frame.f_code)
        if not rel or self._cur is None:
            return None
        lines = self._cur.setdefault(rel, set())
        lines.add(frame.f_lineno)

        def local(frame, event, arg):
            if event == "line":
                lines.add(frame.f_lineno)
            return local
        return local

    def _protocol_wrapper(self):
        import threading

        import pytest

        collector = self

        class _CovPlugin:
            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_protocol(self, item, nextitem):
                collector._cur = collector.coverage.setdefault(item.nodeid, {})
                sys.settrace(collector._trace)
                threading.settrace(collector._trace)
                try:
                    yield
                finally:
                    sys.settrace(None)
                    threading.settrace(None)
                    collector._cur = None
        return _CovPlugin()


class TestTimeout(BaseException):
    """Raised in a test that ran past the per-test limit. A BaseException, so `except Exception`
    in the code under test cannot swallow it (a bare `except:` can, once: the alarm repeats)."""
    __test__ = False


class _PerTestLimit:
    """The request's `test_cpu_s`: each test (setup + call + teardown together) gets that many
    CPU seconds of the run's process (ITIMER_PROF: user + system, so the limit does not move
    with the machine's load the way a wall clock does); past it SIGPROF raises TestTimeout inside
    the test, which pytest reports as that test's failure (error in setup). The first timeout
    stops the pytest session: tests not run are reported as errors, and a test that caught the signal
    and passed anyway counts as failed. Armed only while a test phase runs,
    never in pytest's own code. The signal repeats every REPEAT_S CPU seconds until disarmed, so
    code that swallows it once is hit again; code that sleeps, blocks signals (a long C call) or
    replaces the handler still ends at the run's wall limit (the worker kills the whole run)."""
    REPEAT_S = 0.05

    def __init__(self, limit: float, collector: "_Collector"):
        self.limit, self.collector = float(limit), collector
        self.items: list[str] = []
        self.timed_out: list[str] = []
        self.left = self.limit
        self.armed = self.fired = False
        self.session = None
        signal.signal(signal.SIGPROF, self._fire)

    def _fire(self, signum, frame):
        if self.armed:
            self.fired = True
            raise TestTimeout(f"the test used more than the per-test limit of {self.limit:g} CPU "
                              "seconds (it may loop forever)")

    def pytest_collection_finish(self, session):
        self.session = session
        self.items = [i.nodeid for i in session.items]

    def _phase(self):
        t0 = time.process_time()
        self.armed = True
        signal.setitimer(signal.ITIMER_PROF, max(self.left, 1e-3), self.REPEAT_S)
        try:
            yield
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_PROF, 0)
            self.left -= time.process_time() - t0

    def plugin(self):
        import pytest

        lim = self

        class _Plugin:
            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_protocol(self, item, nextitem):
                lim.left, lim.fired = lim.limit, False
                yield
                if lim.fired:
                    lim.timed_out.append(item.nodeid)
                    # past its limit is a failure even if the test caught the signal and passed
                    if lim.collector.outcomes.get(item.nodeid) != "error":
                        lim.collector.outcomes[item.nodeid] = "failed"
                    if lim.session is not None:
                        lim.session.shouldstop = f"{item.nodeid} ran past the per-test CPU limit"

            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_setup(self, item):
                yield from lim._phase()

            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_call(self, item):
                yield from lim._phase()

            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_teardown(self, item, nextitem):
                yield from lim._phase()

            def pytest_collection_finish(self, session):
                lim.pytest_collection_finish(session)
        return _Plugin()


def match_outcome(test_id: str, outcomes: dict[str, str], root: str = "") -> str:
    """The outcome of a requested id that names several collected items.

    `test_file.py::test_fn` asks for every `test_file.py::test_fn[...]` item of a parametrised
    test (and a class or file id for every item under it): passed when every item that ran
    passed (skips aside), failed / error when any did, skipped when all were skipped, error
    when nothing matched (not found, not collected). `./` and `<root>/` prefixes are ignored.
    """
    tid = test_id.removeprefix("./")
    if root and tid.startswith(root.rstrip("/") + "/"):
        tid = tid[len(root.rstrip("/")) + 1:]
    if tid in outcomes:
        return outcomes[tid]
    items = [o for nid, o in outcomes.items() if nid.startswith((tid + "[", tid + "::"))]
    if not items:
        return "error"
    for worst in ("error", "failed"):
        if worst in items:
            return worst
    return "skipped" if all(o == "skipped" for o in items) else "passed"


def _pytest_args(root: str, targets: list[str], config: str, cfg: dict | None = None) -> list[str]:
    """`-c`: pytest reads this one configuration file and looks for no other (what the agent
    writes is never read as configuration; `sandboxes.pytest_config` says which file it is).
    pytest resolves `pythonpath` against the folder of the file it reads, which for this copy is
    not the task's: the entries are passed resolved against the task's folder instead."""
    extra = []
    if cfg and cfg.get("pythonpath"):
        import shlex
        base = os.path.join(root, str(cfg.get("dir") or ""))
        extra = ["-o", "pythonpath=" + " ".join(shlex.quote(os.path.normpath(os.path.join(base, str(p))))
                                                for p in cfg["pythonpath"])]
    return ["-q", "-c", config, "--rootdir", root, "--confcutdir", root, "-p", "no:cacheprovider",
            "--tb=short", "-o", "console_output_style=classic"] + extra + targets


def _write_config(cfg: dict | None) -> str:
    """Write the request's configuration (name + text; an empty `[pytest]` section when none)
    into a fresh folder of this run's own and return its path (the run removes the folder
    again: a run that leaves /tmp as it found it can still be reused, `sandboxes.result_cache`)."""
    cfg = cfg or {"name": "pytest.ini", "text": "[pytest]\n"}
    name = os.path.basename(str(cfg.get("name") or "pytest.ini")) or "pytest.ini"
    import shutil
    folder = os.path.join(os.environ.get("TMPDIR") or "/tmp", f".ratchet-cfg-{os.getpid()}")
    if os.path.islink(folder) or os.path.isfile(folder):
        os.unlink(folder)                  # whatever was left under this name is not ours
    shutil.rmtree(folder, ignore_errors=True)
    os.mkdir(folder, 0o700)
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(cfg.get("text") or ""))
    return path


def _no_user_plugins() -> None:
    """No plugin or option reaches pytest from the environment or from installed entry points."""
    for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        os.environ.pop(var, None)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"


def _prepare_config() -> None:
    """Build the next run's pytest Config in the worker: plugin manager, builtin plugins
    imported and registered, options declared. None of that depends on the repo (its ini
    files, conftests and CLI args are all read later, by `pytest_cmdline_parse`, in the child),
    and each forked child gets its own copy-on-write instance."""
    global _PREPARED
    if os.environ.get("PYTEST_DEBUG"):     # its trace writer binds the worker's stderr
        return
    import _pytest.config as pc
    _PREPARED = pc.get_config(["-p", "no:cacheprovider"], prog="pytest.main()")


def _use_prepared_config() -> None:
    """In the child: let the next `pytest.main` start from the prepared Config (once only;
    a nested pytest.main, e.g. pytester's inline runs, builds its own as usual)."""
    if _PREPARED is None:
        return
    import pathlib

    import _pytest.config as pc
    orig, cfg = pc.get_config, _PREPARED

    def get_config(args=None, plugins=None, *, prog=None):
        pc.get_config = orig
        cfg.invocation_params = pc.Config.InvocationParams(args=args or (), plugins=plugins,
                                                           dir=pathlib.Path.cwd())
        if cfg.invocation_params.args:
            cfg.pluginmanager.consider_preparse(cfg.invocation_params.args, exclude_only=True)
        return cfg
    pc.get_config = get_config


_N_MODULES = 0     # len(sys.modules) when the child started


def _note_new_modules() -> None:
    """Enter the modules imported since the child started into inspect's file->module cache.

    Formatting a failure calls inspect.getmodule(), which for a file it has not seen yet (the
    test module: new in every child) walks all ~1100 entries of sys.modules, touching every
    module object and so copying hundreds of the worker's pages (~250 page faults per run).
    This does what that walk does, for the new modules only (the tail of sys.modules).
    """
    import inspect
    from itertools import islice
    n = len(sys.modules) - _N_MODULES
    by_name, by_file = getattr(inspect, "_filesbymodname", None), getattr(inspect, "modulesbyfile", None)
    if n <= 0 or not isinstance(by_name, dict) or not isinstance(by_file, dict):
        return
    try:
        for name, mod in islice(reversed(list(islice(reversed(sys.modules.items()), n))), n):
            if not inspect.ismodule(mod) or not hasattr(mod, "__file__"):
                continue
            f = mod.__file__
            if f == by_name.get(name):
                continue
            by_name[name] = f
            f = inspect.getabsfile(mod)
            by_file[f] = by_file[os.path.realpath(f)] = mod.__name__
    except Exception:  # noqa: BLE001, S110 - only a cache; inspect's own walk handles odd modules
        pass


def _child(root: str, req: dict) -> dict:
    import pytest

    sys.dont_write_bytecode = True
    os.chdir(root)
    sys.path.insert(0, root)       # what `python -m pytest` does: the repo root is importable
    col = _Collector(root, bool(req.get("coverage")))
    plugins = [col] + ([col._protocol_wrapper()] if col.coverage is not None else [])
    limit = _PerTestLimit(req["test_cpu_s"], col) if req.get("test_cpu_s") else None
    if limit is not None:
        plugins.append(limit.plugin())
    ids = req.get("test_ids")
    _no_user_plugins()
    cfg_path = _write_config(req.get("config"))
    args = _pytest_args(root, list(ids) if ids else [root], cfg_path, req.get("config"))
    _use_prepared_config()
    global _N_MODULES
    _N_MODULES = len(sys.modules)
    try:
        code = pytest.main(args, plugins=plugins)
    finally:
        import shutil
        shutil.rmtree(os.path.dirname(cfg_path), ignore_errors=True)
    outcomes = dict(col.outcomes)
    if limit is not None and limit.timed_out:
        for nid in limit.items:          # not run: the pytest session stopped at the first timeout
            outcomes.setdefault(nid, "error")
        col.outcomes = outcomes
    for tid in ids or ():
        if tid not in outcomes:      # a function-, class- or file-level id: its parametrised items
            outcomes[tid] = match_outcome(tid, col.outcomes, root)
    cov = None
    if col.coverage is not None:
        cov = {t: {f: sorted(ls) for f, ls in m.items()} for t, m in col.coverage.items()}
    return {"outcomes": outcomes, "coverage": cov, "exit_code": int(code),
            "test_timeouts": list(limit.timed_out) if limit is not None else []}


def _kill_strays(keep: set[int]) -> None:
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in keep:
            try:
                os.kill(int(name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _child_main(root: str, req_r: int, res_w: int, out_path: str) -> None:
    """A forked child: wait for the request, run it, write the result line; never returns."""
    status = 0
    try:
        data = b""
        while True:
            b = os.read(req_r, 1 << 16)
            if not b:
                break
            data += b
        os.close(req_r)
        if not data:            # the worker went away or discarded this spare
            os._exit(0)
        req = json.loads(data)
        os.setpgid(0, 0)
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        try:
            res = _child(root, req)
        except BaseException as e:  # noqa: BLE001 - report harness crashes, never hide them
            res = {"error": f"worker child crashed: {type(e).__name__}: {e}"}
        sys.stdout.flush()
        sys.stderr.flush()
        view = memoryview(json.dumps(res).encode() + b"\n")   # one line: JSON has no raw \n
        while view:
            n = os.write(res_w, view)
            view = view[n:]
    except BaseException:  # noqa: BLE001
        status = 1
    finally:
        os._exit(status)


class _Runner:
    """Runs requests in forked children, keeping one spare child forked ahead of time.

    The spare is forked right after an answer goes out (in bwrap: after the strays were
    killed), taking fork() off the next run's critical path; it waits on a pipe for its
    request and exits on EOF if the worker goes away. A finished child is reaped after the
    answer, not before: its address-space teardown (2-3 ms) overlaps with the host reading
    the answer. Strays are still killed before answering.
    """

    def __init__(self, root: str, out_path: str, kill_strays: bool):
        self.root, self.out_path, self.kill_strays = root, out_path, kill_strays
        self.spare: tuple[int, int, int] | None = None
        self.exited: list[int] = []

    def prefork(self) -> None:
        self.reap(block=False)
        if self.spare is not None:
            return
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(req_w)
            os.close(res_r)
            _child_main(self.root, req_r, res_w, self.out_path)
        os.close(req_r)
        os.close(res_w)
        self.spare = (pid, req_w, res_r)

    def reap(self, block: bool) -> None:
        for pid in list(self.exited):
            try:
                done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.exited.remove(pid)

    def run(self, req: dict) -> dict:
        t0 = time.monotonic()
        scratch = _scratch_state(self.out_path) if req.get("scratch") else None
        if self.spare is not None and os.waitpid(self.spare[0], os.WNOHANG)[0]:
            os.close(self.spare[1])         # the spare died (killed from outside): replace it
            os.close(self.spare[2])
            self.spare = None
        self.prefork()
        pid, req_w, r = self.spare
        self.spare = None
        try:
            os.write(req_w, json.dumps(req).encode())
        except OSError:
            pass                            # the child died; reported below as no result
        os.close(req_w)
        timeout = float(req.get("timeout") or 60)
        deadline = t0 + timeout
        chunks, size, timed_out, complete = [], 0, False, False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            b = os.read(r, 1 << 20)
            if not b:
                break
            size += len(b)
            if size <= _RESULT_CAP:
                chunks.append(b)
            if b.endswith(b"\n") and size <= _RESULT_CAP:
                complete = True
                break
        os.close(r)
        status = None
        if timed_out:
            for kill in (os.killpg, os.kill):   # os.kill: in case it had not set its group yet
                try:
                    kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if complete:
            self.exited.append(pid)         # exiting on its own; reaped after the answer
        else:
            _, status = os.waitpid(pid, 0)
        if self.kill_strays:
            _kill_strays({1, os.getpid()} | _KEEP)
        try:
            with open(self.out_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - int(req.get("max_output", 8000))))
                output = f.read().decode("utf-8", "replace")
        except OSError:
            output = ""
        resp: dict = {"timed_out": timed_out, "output": output}
        if not timed_out:
            try:
                resp.update(json.loads(b"".join(chunks)))
            except ValueError:
                if status is None:
                    _, status = os.waitpid(pid, 0)
                    self.exited.remove(pid)
                resp["error"] = f"worker child died without a result (wait status {status})"
        resp["duration_s"] = time.monotonic() - t0
        if scratch is not None:             # asked by a host that may reuse this answer
            resp["scratch_changed"] = _scratch_state(self.out_path) != scratch
        return resp


def _scratch_state(skip: str) -> list:
    """Names, sizes and times under this worker's /tmp, $HOME and /dev/shm (all live as long as
    the worker; /dev/shm is writable in bwrap when the sandbox runs as the caller's uid, on a
    host that is not root): a run that changed them left state a later run may read, so the
    host never reuses its result (`sandboxes.result_cache`). The worker's own output file is
    left out."""
    return file_states({os.environ.get("TMPDIR") or "/tmp", os.environ.get("HOME") or "/tmp", "/dev/shm"}, skip)


def file_states(tops, skip: str = "") -> list:
    """(path, size, mtime, ctime) of everything under the folders `tops`, sorted (the host's
    `result_cache.tree_state` uses it for the worktree). ctime too: a test can put a file's
    size and mtime back (os.utime), not its ctime.

    A read-only mount below a top is listed but not entered: no run can change what is in it;
    a writable mount inside it (a bwrap tmpfs over a hidden path) is walked on its own.
    Why: bwrap binds the interpreter's folders and the task's snapshot read-only at their host
    paths, so a venv under /tmp or $HOME (a clone in /tmp, ~/.venv) appears inside the
    sandbox's /tmp or $HOME. Walking a venv's ~60,000 files twice per test run made a 20-task
    harness evaluation with the test cache on take 48 s from a clone in /tmp (9 s once skipped;
    the test: test_result_cache.py, read-only mounts)."""
    out, todo, writable = [], list(tops), None
    while todo:
        top = todo.pop()
        try:
            devs = {top: os.stat(top).st_dev}
        except OSError:
            continue
        for root, dirs, files in os.walk(top):
            subdirs, keep = set(dirs), set()
            for name in dirs + files:
                path = os.path.join(root, name)
                if path == skip:
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out.append((path, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
                if name not in subdirs:
                    continue
                if st.st_dev != devs[root] and _read_only(path):
                    writable = _writable_mounts() if writable is None else writable
                    todo.extend(m for m in writable if m.startswith(path + "/"))
                else:
                    devs[path] = st.st_dev
                    keep.add(name)
            dirs[:] = [d for d in dirs if d in keep]
    return sorted(set(out))


def _read_only(path: str) -> bool:
    """Whether `path` (a mount point: its device differs from its parent's) is mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _writable_mounts() -> list:
    """Mount points mounted read-write (/proc/self/mountinfo: field 5 the path, octal-escaped;
    field 6 the mount's own options)."""
    import re

    try:
        with open("/proc/self/mountinfo") as f:
            rows = [line.split() for line in f]
    except OSError:
        return []

    def unescape(p: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p)

    return sorted({unescape(r[4]) for r in rows if len(r) > 5 and "rw" in r[5].split(",")})


def _install_fixture_scan_cache() -> None:
    """Make `FixtureManager.parsefactories` cheap for pytest's own plugins.

    Every pytest session scans each registered plugin with dir() for fixtures (~40 objects, ~8 ms).
    For pytest's builtin plugin modules the scan runs over a stand-in module holding only the
    entries the scan acts on (fixtures and wrapped fixtures: same names, same objects, same
    order); plugin instances of pytest's own classes (and our collector) whose class defines
    no fixture at all are skipped. Anything else (conftests, test modules, classes, user
    plugins) goes through pytest's scan unchanged.
    """
    import types

    from _pytest import fixtures as fx
    from _pytest.compat import safe_getattr
    probe = fx.FixtureManager.__new__(fx.FixtureManager)
    FFD = fx.FixtureFunctionDefinition

    def acts_on(raw, obj) -> bool:
        return type(obj) is FFD or probe._find_wrapped_fixture_def(raw) is not None

    slim: dict[int, tuple] = {}
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType) or not (
                name == "pytest" or name.startswith(("_pytest.", "pytest."))):
            continue
        d = vars(mod)
        if "__getattr__" in d or "__dir__" in d:
            continue
        m2 = types.ModuleType(mod.__name__)
        m2.__dict__.update({n: d[n] for n in dir(mod)
                            if n in d and acts_on(d[n], safe_getattr(mod, n, None))})
        slim[id(mod)] = (mod, m2)

    no_fixtures: dict[type, bool] = {}

    def has_no_fixtures(tp: type) -> bool:
        r = no_fixtures.get(tp)
        if r is None:
            r = not any(acts_on(probe._lookup_in_type_dict(tp, n), safe_getattr(tp, n, None))
                        for n in dir(tp))
            no_fixtures[tp] = r
        return r

    orig, NOTSET = fx.FixtureManager.parsefactories, fx.NOTSET

    def parsefactories(self, node_or_obj=NOTSET, nodeid=NOTSET, *, holder=NOTSET, node=NOTSET):
        if holder is NOTSET:
            if nodeid is NOTSET:
                return orig(self, node_or_obj)
            return orig(self, node_or_obj, nodeid)
        hit = slim.get(id(holder))
        if hit is not None and hit[0] is holder:
            holder = hit[1]
        else:
            tp = type(holder)
            if (tp is _Collector or tp.__module__.startswith("_pytest.")) and has_no_fixtures(tp):
                return None
        return orig(self, holder=holder, node=node)
    fx.FixtureManager.parsefactories = parsefactories


_WARM_TESTS = """\
import pytest


def test_pass(capsys, monkeypatch):
    print("out")
    monkeypatch.setenv("RATCHET_WARM", "1")
    assert [1, 2] == [1, 2]


def test_fail():
    x = {"a": 1}
    assert x == {"a": 2}


@pytest.mark.parametrize("v", [1, 2])
def test_param(v):
    if v == 2:
        pytest.skip("warm")
    with pytest.raises(ValueError):
        int("x")
"""


def _warm_up() -> None:
    """Import pytest's plugins, prepare the next run's config and run one small pytest session
    (pass, fail, skip, parametrize), so forked runs start hot.

    The warm-up's test module is imported under a name no task can use and is removed again;
    sys.path / sys.meta_path are restored. Then freeze the heap: pytest calls gc.collect()
    per pytest session, which would otherwise walk every pre-imported object in every child.
    """
    import gc
    import importlib
    import inspect
    import linecache
    import shutil
    import tempfile

    import pytest
    from _pytest.config import default_plugins
    for name in default_plugins:
        try:
            importlib.import_module(f"_pytest.{name}")
        except ImportError:
            pass
    try:
        _install_fixture_scan_cache()     # pytest-internal: an older pytest (a container's) lacks it
    except Exception:  # noqa: BLE001, S110 - an optimisation only
        pass
    tmp = tempfile.mkdtemp(prefix="ratchet-warm-")
    test_file = os.path.join(tmp, f"test_ratchet_warm_{os.getpid()}.py")
    with open(test_file, "w") as f:
        f.write(_WARM_TESTS)
    saved_path, saved_meta, saved_mods = list(sys.path), list(sys.meta_path), set(sys.modules)
    saved = os.dup(1)
    nul = os.open(os.devnull, os.O_WRONLY)
    os.dup2(nul, 1)
    try:
        cfg = os.path.join(tmp, "pytest.ini")
        with open(cfg, "w") as f:
            f.write("[pytest]\n")
        pytest.main(["--noconftest"] + _pytest_args(tmp, [test_file], cfg), plugins=[_Collector(tmp, False)])
    except Exception:  # noqa: BLE001, S110 - warming is an optimisation; the runs themselves report
        pass
    finally:
        os.dup2(saved, 1)
        os.close(nul)
        os.close(saved)
        sys.path[:], sys.meta_path[:] = saved_path, saved_meta
        for name in set(sys.modules) - saved_mods:
            if (getattr(sys.modules[name], "__file__", None) or "").startswith(tmp):
                del sys.modules[name]
        sys.path_importer_cache.pop(tmp, None)
        linecache.cache.pop(test_file, None)
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        _prepare_config()
    except Exception:  # noqa: BLE001 - an optimisation only: each run then builds its own config
        global _PREPARED
        _PREPARED = None
    inspect.getmodule(None, _filename="/nonexistent.py")   # fills inspect's module-file cache
    gc.collect()
    gc.freeze()


def serve(root: str, kill_strays: bool, warm: bool = True) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)          # stray prints must never corrupt the protocol stream
    if warm:
        _warm_up()         # pays off from the second run on; a one-run worker skips it
    out_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f".ratchet-pytest-{os.getpid()}.out")
    runner = _Runner(root, out_path, kill_strays)
    runner.prefork()
    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            resp = runner.run(json.loads(line))
        except Exception as e:  # noqa: BLE001
            resp = {"error": f"worker failed: {type(e).__name__}: {e}"}
        proto.write(json.dumps(resp) + "\n")
        try:
            runner.prefork()
        except Exception:  # noqa: BLE001, S110 - run() forks one itself if this failed
            pass


# ----------------------------------------------------------------------------- zygote (host side)
# `--zygote FD`: the host starts this file once per runtime, outside every sandbox, with the
# sandbox's clean environment. It imports pytest and warms up once (no repository code: the same
# state a fresh worker reaches), then forks one worker per request into a namespace that bwrap
# built (`sandboxes.zygote`: a placeholder process holds it). The forked worker joins that
# namespace, takes the sandbox's root, drops to the episode's uid exactly as bwrap + setpriv do,
# and serves like a worker started inside it. Why: `import pytest` in a fresh interpreter was
# ~0.25 of the ~0.4 CPU-s each sandbox start cost (docs/experiments/2026-12-01-sandbox-zygote.md).
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 38, 36


def _zygote_main(sock_fd: int) -> None:
    import ctypes
    import socket
    libc = ctypes.CDLL(None, use_errno=True)
    # No PR_SET_PDEATHSIG: it fires when the *thread* that started the zygote ends (a pool thread
    # of the policy runner), not the host process. The zygote exits on EOF of its socket instead,
    # which the kernel closes when the host process dies.
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)           # workers are reparented here: reap
    sock = socket.socket(fileno=sock_fd)
    _warm_up()
    wake_r, wake_w = os.pipe()          # SIGCHLD wakes the loop: a dead worker is reaped at once
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        ready = select.select([sock, wake_r], [], [], 5.0)[0]
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if sock not in ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 16)
        except OSError:
            return
        if not msg:
            return                      # the host went away
        try:
            reply = {"pid": _zygote_spawn(libc, json.loads(msg), fds)}
        except Exception as e:  # noqa: BLE001 - answered to the host, which falls back
            reply = {"error": f"{type(e).__name__}: {e}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


def _zygote_spawn(libc, req: dict, fds: list[int]) -> int:
    """Fork a worker into the namespace whose files are in `fds`; its host pid."""
    import ctypes
    names = req["ns"]
    n = len(names)
    if len(fds) != n + 4:
        raise ValueError(f"expected {n + 4} descriptors, got {len(fds)}")
    ns, root_fd, stdio = fds[:n], fds[n], fds[n + 1:n + 4]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                        # joins the namespaces; its child is the worker
        try:
            os.close(r)
            for name, fd in zip(names, ns):
                if libc.setns(fd, 0) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({name}) failed")
            os.fchdir(root_fd)          # the sandbox's root, as its placeholder process sees it
            os.chroot(".")
            os.chdir(req["root"])
            g = os.fork()               # in the sandbox's pid namespace (setns(pid) applies to children)
            if g == 0:
                os.close(w)
                _zygote_worker(libc, req, stdio)
            os.write(w, str(g).encode())
        except BaseException as e:  # noqa: BLE001
            try:
                os.write(w, f"{type(e).__name__}: {e}".encode()[:4000])
            except OSError:
                pass
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    text = data.decode("utf-8", "replace")
    if not text.isdigit():
        raise RuntimeError(text or "the namespace joiner died")
    return int(text)


def _zygote_worker(libc, req: dict, stdio: list[int]) -> None:
    """The worker: the episode's descriptors, limits, uid and environment, then `serve`; never
    returns (a failure exits before any request is read: the host sees a worker that did not start)."""
    import resource
    try:
        signal.set_wakeup_fd(-1)        # the zygote's SIGCHLD wake-up is not the worker's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))     # nothing of the zygote's reaches the agent
        os.setsid()
        for name, value in req["rlimits"]:
            res = getattr(resource, name)
            resource.setrlimit(res, (value, value))
        os.setgroups([])
        gid, uid = int(req["gid"]), int(req["uid"])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)                     # every capability goes with uid 0
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or uid == 0 or 0 in os.getresuid():
            raise PermissionError("could not drop privileges")
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ["PWD"] = os.getcwd()     # as bwrap's --chdir sets it
        sys.path[0] = os.path.dirname(req["argv0"])
        sys.argv = [req["argv0"], "--root", req["root"]]
        sys.stdin = open(0, closefd=False)     # noqa: SIM115 - the zygote's objects are not ours
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        _KEEP.update(int(p) for p in os.listdir("/proc") if p.isdigit())   # init, placeholder, self
        serve(req["root"], bool(req.get("kill_strays")), warm=False)
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(2, f"zygote worker failed: {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(0)


def __getattr__(name: str):
    """The host half moved to `sandboxes.worker_client`; its old import path keeps working (on the
    host only: nothing in the sandbox asks for these names)."""
    if name in ("NOT_STARTED", "PytestWorkerClient", "read_json_line"):
        from sandboxes import worker_client
        return getattr(worker_client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--root")
    ap.add_argument("--kill-strays", action="store_true")
    ap.add_argument("--no-warm", action="store_true", help="one run expected: skip the warm-up")
    ap.add_argument("--zygote", type=int, metavar="FD", help="host side: fork workers into sandboxes")
    a = ap.parse_args()
    if a.zygote is not None:
        _zygote_main(a.zygote)
    elif not a.root:
        ap.error("--root is required")
    else:
        serve(a.root, a.kill_strays, warm=not a.no_warm)
