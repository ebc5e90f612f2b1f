"""A task's own Docker image, built locally from its Dockerfile (Harbor's `environment/`).

    tag = prepare(bundle)          # builds `ratchet-task:<digest>` once; the bundle that runs in it
    rt.episode(prepare(bundle))    # LocalRuntime hands it to the Docker runtime

A bundle asks for its own image with `metadata["dockerfile"]` (the importer records the text).
`prepare` builds the image from that Dockerfile with the task's environment files as the build
context (the bundle's files outside `tests/`: the verifier's tests never enter the image) and
returns the bundle with `metadata["runtime"] = "docker"`, `image` (the tag), `workdir` (the
Dockerfile's last WORKDIR, else /app) and `python`. The tag is a digest of the Dockerfile and the
context, so a changed task gets a new image and an unchanged one is never rebuilt.

Builds are offline: `network_mode="none"` and no pull, so a FROM image must already be local
(`docker images`) and a RUN step that downloads fails. Such a build raises `ImageBuildError`
with the build log's tail; the tasks source records it as the task's rejection.

The episode itself is the Docker runtime's (`sandboxes.docker_runtime`): no network, read-only
root, the tree on a tmpfs at the workdir (whatever the image COPYed there is hidden by the
task's own tree), the pristine verification in a fresh container of the same image. The image
must hold `python` with pytest (the ratchet base image does).
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
from dataclasses import replace

IMAGE_REPO = "ratchet-task"
DEFAULT_WORKDIR = "/app"
RECIPE = "task-image/v1"       # bump when the build context changes: every tag changes with it
_LOCK = threading.Lock()


class ImageBuildError(ValueError):
    """The task's Dockerfile did not build here (the message says why)."""


def dockerfile(bundle) -> str | None:
    return (bundle.metadata or {}).get("dockerfile") or None


def wants_image(bundle) -> bool:
    """True for a bundle prepared to run in its own image (`prepare`)."""
    return (bundle.metadata or {}).get("runtime") == "docker"


def context_files(bundle) -> dict[str, str]:
    return {p: t for p, t in sorted((bundle.files or {}).items()) if not p.startswith("tests/")}


def workdir(text: str) -> str:
    """The Dockerfile's last WORKDIR (absolute), else /app (Harbor's convention)."""
    found = [m.group(1).strip().strip("\"'") for m in re.finditer(r"(?im)^\s*WORKDIR\s+(\S+)\s*$", text)]
    wd = found[-1] if found else DEFAULT_WORKDIR
    return wd if wd.startswith("/") else f"{DEFAULT_WORKDIR}/{wd}"


def image_tag(bundle) -> str:
    blob = json.dumps([RECIPE, dockerfile(bundle), context_files(bundle)], sort_keys=True).encode()
    return f"{IMAGE_REPO}:{hashlib.sha256(blob).hexdigest()[:16]}"


def _context_tar(text: str, files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {**files, "Dockerfile": text}.items():
            raw = data.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(raw), 0o644, 0
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def build(bundle, client=None) -> str:
    """The task's image tag, built when missing (offline). Raises ImageBuildError."""
    text = dockerfile(bundle)
    if not text:
        raise ImageBuildError(f"{bundle.task_id}: no Dockerfile")
    tag = image_tag(bundle)
    with _LOCK:            # one build of a tag at a time; an existing image is one API call
        if client is None:
            from sandboxes import docker_engine

            try:
                client = docker_engine.client(timeout=600)
                client.ping()
            except Exception as e:  # noqa: BLE001 - any failure to reach the engine
                raise ImageBuildError(f"no Docker engine answers ({e}); a task with its own Dockerfile "
                                      f"runs only in its image") from None
        try:
            import docker.errors
        except ImportError:
            raise ImageBuildError("the docker SDK is not installed (pip install 'docker>=7')") from None
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            try:
                client.images.build(fileobj=io.BytesIO(_context_tar(text, context_files(bundle))), custom_context=True,
                                    tag=tag, network_mode="none", pull=False, rm=True, forcerm=True,
                                    labels={"ratchet.task": str(bundle.task_id)[:200]})
            except docker.errors.BuildError as e:
                log = "".join(str(c.get("stream") or c.get("error") or "") for c in (e.build_log or []))
                raise ImageBuildError(f"the Dockerfile does not build offline: {e.msg}; {log.strip()[-600:]}") from None
            except docker.errors.APIError as e:
                # a FROM image that is not local: the engine would have to pull it
                raise ImageBuildError(f"the Dockerfile does not build offline: {e.explanation or e}") from None
        return tag


def prepare(bundle, client=None):
    """The bundle set to run in its own image (built here), or unchanged when it has no Dockerfile."""
    text = dockerfile(bundle)
    if not text:
        return bundle
    tag = build(bundle, client)
    meta = {**bundle.metadata, "runtime": "docker", "image": tag, "workdir": workdir(text),
            "python": bundle.metadata.get("python") or "python3"}
    return replace(bundle, metadata=meta)


_DOCKER = None


def docker_runtime():
    """One Docker runtime per process for the prepared bundles (its snapshot cache is shared)."""
    global _DOCKER
    with _LOCK:
        if _DOCKER is None:
            from sandboxes.docker_runtime import DockerRuntime

            _DOCKER = DockerRuntime()
        return _DOCKER


def episode(bundle, episode_id: str | None = None):
    """An episode of a prepared bundle in its image (built again from the bundle if it is gone)."""
    rt = docker_runtime()
    build(bundle, rt.client)
    return rt.episode(bundle, episode_id=episode_id)
