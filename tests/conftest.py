import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "true")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh RATCHET_HOME for one test."""
    from ratchet.home import get_home

    root = tmp_path / "rh"
    monkeypatch.setenv("RATCHET_HOME", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster"))
    return get_home(root).ensure()


@pytest.fixture
def wh(home):
    from ratchet.warehouse import Warehouse

    w = Warehouse(home.warehouse)
    w.ensure_schema()
    return w


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """A real bubblewrap runtime; skips (with the reason) where isolation is unavailable."""
    from sandboxes.runtime import LocalRuntime, SandboxUnavailable

    try:
        return LocalRuntime(tmp_path_factory.mktemp("rt"))
    except SandboxUnavailable as e:
        pytest.skip(f"sandbox unavailable: {e}")
