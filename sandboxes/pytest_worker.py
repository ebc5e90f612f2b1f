"""Warm pytest worker: one pre-imported pytest per episode, forking once per test run.

Inside the sandbox (`python pytest_worker.py --root /repo`) the worker imports pytest and its
built-in plugins once, prints `{"ready": true}` and then serves one JSON request per stdin line:

    {"test_ids": ["test_solution.py::test_a"] | null, "coverage": false, "timeout": 30}

For each request it forks; the child runs `pytest.main` (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1,
`-p no:cacheprovider`, the hash seed fixed by the sandbox env) with a small plugin that records
per-test outcomes (passed / failed / error / skipped) and, optionally, per-test line coverage
via sys.settrace; the child sends them back over a pipe. The worker answers one JSON line:

    {"outcomes": {...}, "coverage": {...} | null, "exit_code": 0, "timed_out": false,
     "output": "<tail of pytest's output>"}

A run that exceeds its timeout has its process group killed; after every run the worker also
kills any other process left in the namespace (daemons a test spawned). User code is imported
only in the forked child, so every run sees the current files.

This module is also imported on the host for `PytestWorkerClient`; the worker half uses only
the standard library and pytest.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

_RESULT_CAP = 64 * 1024 * 1024


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


def _child(root: str, req: dict) -> dict:
    import pytest

    sys.dont_write_bytecode = True
    os.chdir(root)
    sys.path.insert(0, root)       # what `python -m pytest` does: the repo root is importable
    col = _Collector(root, bool(req.get("coverage")))
    plugins = [col] + ([col._protocol_wrapper()] if col.coverage is not None else [])
    ids = req.get("test_ids")
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", root, "--tb=short", "-o",
            "console_output_style=classic"] + (list(ids) if ids else [root])
    code = pytest.main(args, plugins=plugins)
    outcomes = dict(col.outcomes)
    for tid in ids or ():
        outcomes.setdefault(tid, "error")     # asked for but never ran: not found / not collected
    cov = None
    if col.coverage is not None:
        cov = {t: {f: sorted(ls) for f, ls in m.items()} for t, m in col.coverage.items()}
    return {"outcomes": outcomes, "coverage": cov, "exit_code": int(code)}


def _kill_strays(keep: set[int]) -> None:
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in keep:
            try:
                os.kill(int(name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _run_once(root: str, req: dict, out_path: str, kill_strays: bool) -> dict:
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: never returns
        status = 0
        try:
            os.close(r)
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
            data = json.dumps(res).encode()
            view = memoryview(data)
            while view:
                n = os.write(w, view)
                view = view[n:]
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(w)
    timeout = float(req.get("timeout") or 60)
    deadline = t0 + timeout
    chunks, size, timed_out = [], 0, False
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
    os.close(r)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    if kill_strays:
        _kill_strays({1, os.getpid()})
    try:
        with open(out_path, "rb") as f:
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
            resp["error"] = f"worker child died without a result (wait status {status})"
    resp["duration_s"] = time.monotonic() - t0
    return resp


def _warm_up() -> None:
    """Import pytest's plugins and run one empty session, so forked runs start hot.

    Then freeze the heap: pytest calls gc.collect() per session, which would otherwise walk
    every pre-imported object in every child.
    """
    import gc
    import importlib
    import inspect
    import tempfile

    import pytest
    from _pytest.config import default_plugins
    for name in default_plugins:
        try:
            importlib.import_module(f"_pytest.{name}")
        except ImportError:
            pass
    empty = tempfile.mkdtemp(prefix="ratchet-warm-")
    saved = os.dup(1)
    nul = os.open(os.devnull, os.O_WRONLY)
    os.dup2(nul, 1)
    try:
        pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", empty, empty])
    finally:
        os.dup2(saved, 1)
        os.close(nul)
        os.close(saved)
        os.rmdir(empty)
    inspect.getmodule(None, _filename="/nonexistent.py")   # fills inspect's module-file cache
    gc.collect()
    gc.freeze()


def serve(root: str, kill_strays: bool) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)          # stray prints must never corrupt the protocol stream
    _warm_up()
    out_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f".ratchet-pytest-{os.getpid()}.out")
    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            resp = _run_once(root, json.loads(line), out_path, kill_strays)
        except Exception as e:  # noqa: BLE001
            resp = {"error": f"worker failed: {type(e).__name__}: {e}"}
        proto.write(json.dumps(resp) + "\n")


# ----------------------------------------------------------------------------- on the host
class PytestWorkerClient:
    """Host side: starts the worker through an isolation runner, sends requests, reads answers.

    Every failure of the worker itself (did not start, died, answered garbage, hung past the
    grace period) is returned as `{"error": ...}` so the runtime records an infra failure.
    """

    def __init__(self, runner, root: str, stderr_path: str, start_timeout: float = 30.0):
        self.runner, self.root, self.stderr_path = runner, root, stderr_path
        self.start_timeout = start_timeout
        self.proc = None
        self._buf = b""

    def _start(self) -> str | None:
        import subprocess
        self._err = open(self.stderr_path, "wb")
        cmd = [sys.executable, self.runner.tool_path("pytest_worker.py"), "--root", self.root]
        if self.runner.name == "bwrap":
            cmd.append("--kill-strays")
        self.proc = self.runner.popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._err)
        self._buf = b""
        first = self._readline(self.start_timeout)
        if first is None or not first.get("ready"):
            err = self._stderr_tail()
            self.close()
            return f"pytest worker failed to start: {err or first}"
        return None

    def _stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _readline(self, timeout: float) -> dict | None:
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                b = os.read(fd, 1 << 20)
                if not b:
                    return None
                self._buf += b
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def request(self, test_ids, coverage: bool, timeout: float, max_output: int) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            err = self._start()
            if err:
                return {"error": err}
        req = {"test_ids": list(test_ids) if test_ids else None, "coverage": coverage,
               "timeout": timeout, "max_output": max_output}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            self.close()
            return {"error": f"pytest worker pipe broken: {e}"}
        resp = self._readline(timeout + 10.0)     # the worker enforces `timeout` itself
        if resp is None:
            tail = self._stderr_tail()
            self.close()
            return {"error": f"pytest worker died or hung: {tail[-500:]}"}
        return resp

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            for s in (self.proc.stdin, self.proc.stdout):
                try:
                    s.close()
                except OSError:
                    pass
            self.proc = None
        if getattr(self, "_err", None):
            self._err.close()
            self._err = None


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--kill-strays", action="store_true")
    a = ap.parse_args()
    serve(a.root, a.kill_strays)
