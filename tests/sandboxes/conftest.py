import pytest


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """A real bubblewrap runtime; skips (with the reason) where isolation is unavailable."""
    from sandboxes.runtime import LocalRuntime, SandboxUnavailable

    try:
        return LocalRuntime(tmp_path_factory.mktemp("rt"))
    except SandboxUnavailable as e:
        pytest.skip(f"sandbox unavailable: {e}")
