import pytest

# fixtures/ holds other projects' test suites (QuixBugs) as task data: never collect them here
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(scope="session")
def docker_runtime(tmp_path_factory):
    """A real Docker runtime: starts the engine and builds the base image when needed (root,
    offline: see sandboxes.docker_engine); skips with the exact reason where it cannot."""
    from sandboxes import docker_engine

    reason, _info = docker_engine.ensure()
    if reason:
        pytest.skip(f"Docker runtime unavailable: {reason}")
    from sandboxes.docker_runtime import DockerRuntime, SandboxUnavailable

    try:
        return DockerRuntime(root=tmp_path_factory.mktemp("docker-rt"))
    except SandboxUnavailable as e:
        pytest.skip(f"Docker runtime unavailable: {e}")
