"""`ratchet ui` serves the Dagster UI and stops every child when it is stopped (SIGTERM)."""
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

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_to_ratchet_ui_stops_the_webserver(tmp_path):
    port = _free_port()
    env = {**os.environ, "RATCHET_HOME": str(tmp_path / "home")}
    env.pop("DAGSTER_HOME", None)
    p = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ui", "--port", str(port)], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert p.poll() is None, "ratchet ui exited before serving"
                assert time.monotonic() < deadline, "the Dagster UI did not come up in 120 s"
                time.sleep(1)
        children = psutil.Process(p.pid).children(recursive=True)
        assert children, "the webserver runs as a child process"
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running after SIGTERM: {[c.pid for c in alive]}"
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the port is still served"
    finally:
        if p.poll() is None:
            p.kill()
