"""The runtime contract every sandbox backend implements (local bubblewrap, Docker, ...).

Tools, verifiers and the pristine verification (`sandboxes.verify`) only use these methods, so
a backend that passes the same tests as the local one (`tests/sandboxes/test_runtime.py`,
`test_docker_runtime.py` for Docker, and the exploit replay of `test_reward_integrity.py`) is
interchangeable with it (inspect_ai's SandboxEnvironment: exec / read / write plus a
lifecycle, registered by name: `make_runtime("local" | "docker", ...)`).

Optional: `spawn_callee(module)` (a process in the sandbox with stdin/stdout pipes running
`verdict_worker.py --callee`), which the built-in tasks' data verdict needs (`sandboxes.verdict`);
an episode without it is judged by pytest instead.

Paths are relative to the episode's repository root; helpers refuse paths that escape it
(`PathEscape`). `run_tests` returns a `TestReport` whose `infra_error` is set only for faults of
the harness itself, decided outside the sandbox (see `sandboxes.attribution`).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Episode(Protocol):
    id: str
    bundle: object
    limits: object
    environment_digest: str
    commit: str                       # the pinned commit the worktree started from

    def run(self, cmd, timeout: float | None = None, *, stdin: str | None = None,
            env: dict | None = None, deterministic: bool = False):
        """Run a shell string or argv in the sandbox (cwd = repository root) -> ExecResult.
        `deterministic`: the caller vouches the effect depends only on the files and the command
        (a runtime with a test-result cache may then keep reusing results after it)."""

    def run_tests(self, test_ids=None, *, coverage: bool = False, timeout: float | None = None):
        """Run pytest node ids (all when None) -> TestReport."""

    def read_file(self, path: str, max_chars: int | None = None) -> str: ...

    def read_bytes(self, path: str) -> bytes: ...

    def write_file(self, path: str, text: str) -> str: ...

    def write_bytes(self, path: str, data: bytes) -> str: ...

    def delete_file(self, path: str) -> None: ...

    def list_files(self, path: str = ".") -> list[str]: ...

    def apply_patch(self, patch: str):
        """`git apply` a unified diff in the worktree -> ExecResult."""

    def diff(self) -> str:
        """Unified diff of the worktree against the pinned commit."""

    def changed_paths(self) -> list[str]: ...

    def pristine_bytes(self, path: str) -> bytes | None:
        """The file's content at the pinned commit (None when it does not exist there)."""

    def disk_usage(self) -> int:
        """Bytes the episode's worktree holds now (for the per-episode disk quota)."""

    def close(self) -> None: ...

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class Runtime(Protocol):
    name: str

    def episode(self, bundle, *, episode_id: str | None = None) -> Episode: ...


_RUNTIMES: dict[str, object] = {}


def register_runtime(name: str, factory) -> None:
    """Make a backend constructible by name (`make_runtime("docker", ...)`)."""
    _RUNTIMES[name] = factory


def make_runtime(name: str, **kwargs):
    if name not in _RUNTIMES:
        _load_builtin(name)
    try:
        return _RUNTIMES[name](**kwargs)
    except KeyError:
        raise ValueError(f"unknown sandbox runtime {name!r}; known: {sorted(_RUNTIMES)}") from None


def _load_builtin(name: str) -> None:
    if name == "local":
        from sandboxes.runtime import LocalRuntime
        register_runtime("local", LocalRuntime)
    elif name == "docker":
        from sandboxes.docker_runtime import DockerRuntime
        register_runtime("docker", DockerRuntime)
