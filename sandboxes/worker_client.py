"""Host side of the warm pytest worker (`sandboxes.pytest_worker`, which runs inside the
sandbox): `PytestWorkerClient` starts it through an isolation runner, sends one JSON request a
line and reads the answers; `read_json_line` is shared by every host-side helper client."""
from __future__ import annotations

import json
import os
import select
import sys
import time

NOT_STARTED = "pytest worker failed to start"    # the prefix of every start failure (no agent code ran)


def read_json_line(fd: int, buf: bytes, timeout: float) -> tuple[dict | None, bytes]:
    """The next JSON line from a helper process's stdout within `timeout` (None on EOF, timeout
    or garbage), and what was read past it. Shared by every host-side helper client."""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None, buf
        b = os.read(fd, 1 << 20)
        if not b:
            return None, buf
        buf += b
    line, buf = buf.split(b"\n", 1)
    try:
        return json.loads(line), buf
    except ValueError:
        return None, buf


class PytestWorkerClient:
    """Host side: starts the worker through an isolation runner, sends requests, reads answers.

    Every failure of the worker itself (did not start, died, answered garbage, hung past the
    grace period) is returned as `{"error": ...}` so the runtime records an infra failure.
    """

    def __init__(self, runner, root: str, stderr_path: str, start_timeout: float = 30.0, *,
                 warm: bool = True, zygote=None):
        self.runner, self.root, self.stderr_path = runner, root, stderr_path
        self.warm = warm                  # False: one run expected (verification), no warm-up
        self.zygote = zygote              # sandboxes.zygote.Zygote: fork a warm worker in (bwrap only)
        self.start_timeout = start_timeout
        self.proc = None
        self._buf = b""

    def _start(self) -> str | None:
        import subprocess
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115 - the worker's stderr, open while it runs
        cmd = [sys.executable, self.runner.tool_path("pytest_worker.py"), "--root", self.root]
        if self.runner.name == "bwrap":
            cmd.append("--kill-strays")
        if not self.warm:
            cmd.append("--no-warm")
        try:
            self.proc = self.zygote.spawn(self.runner, self.root, kill_strays=True, stderr=self._err) \
                if self.zygote is not None else None
            if self.proc is None:       # no zygote, or it failed: a worker started in the sandbox
                self.proc = self.runner.popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=self._err)
        except OSError as e:
            self.close()
            return f"{NOT_STARTED}: spawn failed: {e}"
        self._buf = b""
        first = self._readline(self.start_timeout)
        if first is None or not first.get("ready"):
            err = self._stderr_tail()
            self.close()
            return f"{NOT_STARTED}: {err or first}"
        return None

    def _stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _readline(self, timeout: float) -> dict | None:
        obj, self._buf = read_json_line(self.proc.stdout.fileno(), self._buf, timeout)
        return obj

    def request(self, test_ids, coverage: bool, timeout: float, max_output: int,
                test_cpu_s: float | None = None, scratch: bool = False,
                config: dict | None = None) -> dict:
        """One test run: `timeout` (wall s) bounds the whole run, `test_cpu_s` (optional) each test.
        `scratch`: the worker also says whether the run changed its /tmp or $HOME. `config`: the
        one pytest configuration file the run reads (`sandboxes.pytest_config`; None: empty)."""
        if self.proc is None or self.proc.poll() is not None:
            err = self._start()
            if err:
                return {"error": err}
        req = {"test_ids": list(test_ids) if test_ids else None, "coverage": coverage,
               "timeout": timeout, "max_output": max_output}
        if test_cpu_s:
            req["test_cpu_s"] = test_cpu_s
        if scratch:
            req["scratch"] = True
        if config:
            req["config"] = config
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
        from sandboxes.attribution import stop_process
        stop_process(self.proc)
        self.proc = None
        if getattr(self, "_err", None):
            self._err.close()
            self._err = None
