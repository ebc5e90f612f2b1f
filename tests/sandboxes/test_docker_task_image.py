"""A Harbor task whose environment/ has a Dockerfile runs in its own image, built here from that
Dockerfile (offline: FROM an image already local), through the real Docker runtime; a task
without one stays in bubblewrap, and a Dockerfile that cannot build offline is a rejection."""
import pytest

from sandboxes import docker_engine

BUGGY = "from tasklib import GREETING\n\n\ndef greet():\n    return GREETING.upper()\n"
FIXED = "from tasklib import GREETING\n\n\ndef greet():\n    return GREETING\n"


def _task(root, name, dockerfile):
    """`tasklib` exists only in the task's image (its Dockerfile writes it): the tests pass with
    the fix only where the task runs in that image."""
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "environment" / "app.py").write_text(BUGGY)
    if dockerfile:
        (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "tests" / "test_app.py").write_text("from app import greet\n\n\ndef test_greet():\n"
                                             "    assert greet() == 'hi'\n")
    (d / "instruction.md").write_text("# greet() shouts\n\nIt should return the greeting as it is.\n")
    (d / "task.toml").write_text("[agent]\ntimeout_sec = 20.0\n")
    (d / "solution" / "solve.sh").write_text(f"cat > app.py <<'PY'\n{FIXED}PY\n")
    return d


OWN = (f"FROM {docker_engine.BASE_IMAGE}\n"
       "RUN echo 'GREETING = \"hi\"' > /usr/lib/python3/dist-packages/tasklib.py\nWORKDIR /srv/app\n")


def test_a_task_with_a_dockerfile_runs_in_its_own_image(tmp_path, docker_runtime, runtime):
    from ratchet.task_sources import load_source, parse_sources
    from sandboxes.docker_task_image import image_tag
    from sandboxes.importers import from_harbor
    from sandboxes.verify import verify

    _task(tmp_path / "tasks", "own-image", OWN)
    spec, = parse_sources([{"kind": "harbor", "path": str(tmp_path / "tasks")}])
    loaded = load_source(spec, lambda: runtime)
    assert [(r.task, r.reason, r.detail) for r in loaded.rejections] == []
    b, = loaded.bundles
    assert b.metadata["runtime"] == "docker" and b.metadata["workdir"] == "/srv/app"
    assert b.metadata["image"] == image_tag(from_harbor(tmp_path / "tasks" / "own-image"))
    assert docker_runtime.client.images.get(b.metadata["image"])
    # whoever opens an episode of the stored bundle (the evaluation's LocalRuntime) gets its image
    with runtime.episode(b) as ep:
        assert type(ep).__name__ == "DockerEpisode" and ep.image == b.metadata["image"]
        assert ep.run(["pwd"]).stdout.strip() == "/srv/app"
        v = verify(runtime, b, ep)
    assert v.infra_error is None and v.outcomes == {"tests/test_app.py::test_greet": "failed"}


def test_without_a_dockerfile_the_task_stays_in_bubblewrap(tmp_path, runtime):
    from ratchet.task_sources import load_source, parse_sources

    _task(tmp_path / "tasks", "no-image", None)
    spec, = parse_sources([{"kind": "harbor", "path": str(tmp_path / "tasks")}])
    loaded = load_source(spec, lambda: runtime)
    # tasklib is nowhere outside the image: in bubblewrap the fix cannot pass
    assert [(r.task, r.reason) for r in loaded.rejections] == [("harbor/no-image", "tests_fail_after_fix")]


def test_a_dockerfile_that_needs_the_network_is_rejected_with_the_reason(tmp_path, docker_runtime, runtime):
    from ratchet.task_sources import load_source, parse_sources

    _task(tmp_path / "tasks", "pulls", "FROM ratchet-no-such-image:0\nWORKDIR /app\n")
    _task(tmp_path / "tasks", "downloads", f"FROM {docker_engine.BASE_IMAGE}\nRUN python3 -c "
                                           "\"import urllib.request; urllib.request.urlopen('http://example.com')\"\n")
    spec, = parse_sources([{"kind": "harbor", "path": str(tmp_path / "tasks")}])
    loaded = load_source(spec, lambda: runtime)
    assert loaded.bundles == []
    why = {r.task: (r.reason, r.detail) for r in loaded.rejections}
    assert {t: r for t, (r, _) in why.items()} == {"harbor/pulls": "image_build_failed",
                                                   "harbor/downloads": "image_build_failed"}
    assert all("does not build offline" in d for _, d in why.values()), why
