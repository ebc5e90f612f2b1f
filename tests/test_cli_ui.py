"""`ratchet ui` and `ratchet mlflow` serve their UIs and, on SIGTERM, stop with every child by
themselves: the SIGKILL fallback (which says so on stderr) is never needed."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from pipelines.cli import KILLED_MSG

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A clean stop takes seconds (2-8 s measured on a quiet machine, more under a full test run's load);
# this bound only catches a server that hangs.
STOP_S = 120


def _ignore_stop_signals():
    """Start the command as a test runner or a pool worker may: SIGTERM and SIGINT ignored, which
    exec passes on. The server must stop on SIGTERM all the same."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _serve_then_sigterm(tmp_path, cmd: str, path: str, start_s: float, while_serving=None) -> None:
    port = _free_port()
    env = {**os.environ, "RATCHET_HOME": str(tmp_path / "home")}
    env.pop("DAGSTER_HOME", None)
    env.pop("RATCHET_MLFLOW_UI_URL", None)
    err = tmp_path / f"{cmd}.stderr"
    p = subprocess.Popen([sys.executable, "-m", "pipelines.cli", cmd, "--port", str(port)], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=err.open("wb"), preexec_fn=_ignore_stop_signals)
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert p.poll() is None, f"ratchet {cmd} exited before serving"
                assert time.monotonic() < deadline, f"ratchet {cmd} did not come up in {start_s:.0f} s"
                time.sleep(1)
        if while_serving is not None:
            while_serving(port)
        children = psutil.Process(p.pid).children(recursive=True)
        assert children, "the server runs as a child process"
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=STOP_S + 60) == 128 + signal.SIGTERM
        took = time.monotonic() - t0
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running after SIGTERM: {[c.pid for c in alive]}"
        assert KILLED_MSG not in err.read_text(errors="replace"), \
            f"ratchet {cmd} needed the SIGKILL fallback ({took:.1f} s): not a clean exit"
        assert took < STOP_S
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the port is still served"
    finally:
        if p.poll() is None:
            p.kill()


def test_sigterm_to_ratchet_ui_stops_the_webserver(tmp_path):
    _serve_then_sigterm(tmp_path, "ui", "/server_info", start_s=120)


@pytest.mark.slow   # ~65 s, mostly `mlflow ui` starting; the synthetic server below covers serve() in 2 s
def test_sigterm_to_ratchet_mlflow_stops_uvicorn_and_the_job_consumers(tmp_path, monkeypatch):
    monkeypatch.delenv("RATCHET_MLFLOW_UI_URL", raising=False)

    def links_name_this_server(port):
        # asset metadata links go where `ratchet mlflow` serves, whatever port it was given
        from ratchet.home import get_home
        from ratchet.mlflow_store import ui_url

        assert ui_url(get_home(tmp_path / "home")) == f"http://127.0.0.1:{port}"

    _serve_then_sigterm(tmp_path, "mlflow", "/health", start_s=180, while_serving=links_name_this_server)


# A server like `mlflow ui`: the leader exits on SIGTERM at once; its child (in the same process
# group, as uvicorn and the job consumers are) takes a moment to shut down cleanly, or ignores
# SIGTERM altogether.
_SERVER = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(0.1)
"""
_CHILD = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(*a):
    time.sleep(1)
    (out / "clean").write_text("1")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if (out / "ignore").exists() else stop)
(out / "child.pid").write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def _serve_synthetic(tmp_path, grace_s: float, leader_only: bool = False) -> tuple[int, float, int]:
    (tmp_path / "server.py").write_text(_SERVER)
    runner = ("import os, sys; from pipelines.cli import serve; "
              f"sys.exit(serve([sys.executable, {str(tmp_path / 'server.py')!r}, {_CHILD!r}, {str(tmp_path)!r}], "
              f"dict(os.environ), {str(tmp_path)!r}, grace_s={grace_s}, leader_only={leader_only}))")
    p = subprocess.Popen([sys.executable, "-c", runner], cwd=REPO, stderr=(tmp_path / "serve.stderr").open("wb"),
                         preexec_fn=_ignore_stop_signals)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "child.pid").exists():
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        child = int((tmp_path / "child.pid").read_text())
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
        return rc, time.monotonic() - t0, child
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize("leader_only", [False, True], ids=["group", "leader"])
def test_serve_forwards_sigterm_and_waits_for_a_clean_exit(tmp_path, leader_only):
    """To the group, or to the leader only (what `ratchet ui` does: dagster dev stops its own
    children); a child the leader leaves behind gets SIGTERM once the leader is gone."""
    rc, took, child = _serve_synthetic(tmp_path, grace_s=20, leader_only=leader_only)
    assert rc == 128 + signal.SIGTERM
    assert (tmp_path / "clean").exists(), "the child got the signal and shut down by itself"
    assert KILLED_MSG not in (tmp_path / "serve.stderr").read_text()
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert took < 10, f"{took:.1f} s: waited for the SIGKILL fallback instead of the child's exit"


def test_serve_kills_what_ignores_sigterm_after_the_grace_period(tmp_path):
    (tmp_path / "ignore").write_text("1")
    rc, took, child = _serve_synthetic(tmp_path, grace_s=2)
    assert rc == 128 + signal.SIGTERM and 2 <= took < 15
    assert not (tmp_path / "clean").exists()
    assert KILLED_MSG in (tmp_path / "serve.stderr").read_text(), "a forced stop says so"
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
