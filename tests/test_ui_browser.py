"""The Dagster UI in a real browser: `ratchet ui` on loopback, headless Chromium renders the asset
catalog and the lifecycle's assets appear in it; a screenshot is saved (RATCHET_UI_SCREENSHOT, or
the test's tmp folder). Chromium is installed by `make test` (Debian `chromium`)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_cli_ui import REPO, _free_port

LIFECYCLE = ("trajectories", "quarantine", "tasks", "dedup_clusters", "split_assignments", "holdout_manifest",
             "training_set", "consent_audit", "checkpoint_flags")


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _browse(browser: str, url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--window-size=1600,1000", "--virtual-time-budget=20000", *args, url],
                          capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    port = _free_port()
    env = {**os.environ, "RATCHET_HOME": str(tmp_path_factory.mktemp("home"))}
    env.pop("DAGSTER_HOME", None)
    p = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ui", "--port", str(port)], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
                break
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                pytest.fail("ratchet ui did not come up")
            time.sleep(1)
    yield f"http://127.0.0.1:{port}"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)


def test_lifecycle_assets_render_in_chromium(ui, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on this machine: `make test` installs it (apt-get install chromium)")
    dom = _browse(browser, f"{ui}/assets", "--dump-dom").stdout
    missing = [k for k in LIFECYCLE if k not in dom]
    assert not missing, f"assets not rendered in the catalog: {missing}"
    shot = Path(os.environ.get("RATCHET_UI_SCREENSHOT") or tmp_path / "dagster-assets.png")
    _browse(browser, f"{ui}/asset-groups", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 20_000, "the screenshot is missing or blank"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
