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


@pytest.fixture(autouse=True)
def _dagster_state_storage_reset():
    """Dagster keeps the instance's defs-state storage in a context variable that a nested `with
    instance:` (an in-process run inside `with DagsterInstance.get()`) can leave pointing at a
    disposed instance; the next test's `materialize` then fails with "undefined DagsterInstance
    weakref". Each test starts clean."""
    yield
    try:
        from dagster._core.storage.defs_state.base import _current_storage
    except ImportError:      # another Dagster layout: nothing to reset
        return
    _current_storage.set(None)
