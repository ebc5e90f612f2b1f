"""Docker runtime for SWE-bench-style images (optional extra: `pip install docker`).

    rt = DockerRuntime()                                   # raises SandboxUnavailable w/o engine
    with rt.episode(bundle, image="sweb.eval.x86_64.astropy__astropy-12907") as ep:
        ep.run("pytest -q tests/test_x.py")                 # -> ExecResult
        ep.diff(); ep.changed_paths()

The container runs with `network_mode="none"`, memory / CPU / pids limits from `bundle.limits`,
no capabilities, no-new-privileges, and is removed on close. The image must already hold the
repository at `workdir` (SWE-bench images: /testbed) at the bundle's commit. Files and diffs
go through `docker exec` of git/cat inside the container. Same ExecResult as the local runtime.
"""
from __future__ import annotations

import shlex
import time

from sandboxes.isolation import ExecResult, SandboxUnavailable


class DockerRuntime:
    def __init__(self, client=None, workdir: str = "/testbed"):
        try:
            import docker
        except ImportError as e:
            raise SandboxUnavailable("the docker SDK is not installed (pip install 'ratchet[docker]')") from e
        try:
            self.client = client or docker.from_env(timeout=5)
            self.client.ping()
        except Exception as e:  # noqa: BLE001 - any failure to reach the engine
            raise SandboxUnavailable(f"no Docker engine answers: {e}") from e
        self.workdir = workdir

    def episode(self, bundle, image: str | None = None) -> "DockerEpisode":
        image = image or bundle.metadata.get("image")
        if not image:
            raise ValueError(f"{bundle.task_id}: no image given and none in bundle.metadata['image']")
        return DockerEpisode(self, bundle, image)


class DockerEpisode:
    def __init__(self, rt: DockerRuntime, bundle, image: str):
        L = bundle.limits
        self.bundle, self.workdir, self.limits = bundle, rt.workdir, L
        self.container = rt.client.containers.run(
            image, command=["sleep", "infinity"], detach=True, network_mode="none",
            mem_limit=f"{L.memory_mb}m", memswap_limit=f"{L.memory_mb}m", nano_cpus=1_000_000_000,
            pids_limit=L.max_procs, cap_drop=["ALL"], security_opt=["no-new-privileges"],
            working_dir=rt.workdir, environment={"PYTHONHASHSEED": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                                                 "PYTHONDONTWRITEBYTECODE": "1"},
            labels={"ratchet.episode": bundle.task_id}, auto_remove=False)
        self.commit = self._sh("git rev-parse HEAD").stdout.strip()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _sh(self, cmd: str, timeout: float | None = None) -> ExecResult:
        t = timeout or self.limits.wall_s
        wrapped = ["timeout", "-s", "KILL", str(int(max(t, 1))), "sh", "-c", cmd]
        t0 = time.monotonic()
        try:
            r = self.container.exec_run(wrapped, workdir=self.workdir, demux=True)
        except Exception as e:  # noqa: BLE001
            return ExecResult(None, "", "", False, time.monotonic() - t0, f"docker exec failed: {e}")
        out, err = (r.output or (b"", b""))
        cap = self.limits.max_output_chars
        timed_out = r.exit_code == 137 and time.monotonic() - t0 >= t - 0.5
        return ExecResult(None if timed_out else r.exit_code, (out or b"").decode(errors="replace")[:cap],
                          (err or b"").decode(errors="replace")[:cap], timed_out, time.monotonic() - t0)

    def run(self, cmd: str | list[str], timeout: float | None = None) -> ExecResult:
        return self._sh(cmd if isinstance(cmd, str) else shlex.join(cmd), timeout)

    def read_file(self, path: str) -> str:
        r = self._sh(f"cat -- {shlex.quote(path)}")
        if r.returncode != 0:
            raise FileNotFoundError(path)
        return r.stdout

    def diff(self) -> str:
        return self._sh(f"git add -A && git diff --cached --no-color {self.commit}").stdout

    def changed_paths(self) -> list[str]:
        out = self._sh(f"git add -A && git diff --cached --name-only {self.commit}").stdout
        return sorted(p for p in out.splitlines() if p)

    def close(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
