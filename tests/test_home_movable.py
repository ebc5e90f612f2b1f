"""RATCHET_HOME can move: MLflow's recorded artifact locations follow it, nothing is written to
the folder the process runs in, and the MLflow UI URL in metadata is configurable."""
from __future__ import annotations

import shutil
from pathlib import Path


def _run_with_artifact(home_root: Path, tmp_path: Path, ui_url: str | None = None) -> tuple[str, str]:
    from resources import MlflowTracking

    f = tmp_path / "note.txt"
    f.write_text("hello")
    tr = MlflowTracking(home=str(home_root), ui_url=ui_url)
    with tr.run("ratchet/test", "one") as run:
        run.log_artifact(str(f))
    return run.run_id, run.url


def test_mlflow_store_moves_with_the_home(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from ratchet.home import get_home
    from ratchet.mlflow_store import tracking_uri

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    run_id, _ = _run_with_artifact(tmp_path / "a", tmp_path)
    shutil.move(tmp_path / "a", tmp_path / "b")
    client = MlflowClient(tracking_uri(get_home(tmp_path / "b")))
    run = client.get_run(run_id)
    assert run.info.artifact_uri.startswith((tmp_path / "b").as_uri())
    local = client.download_artifacts(run_id, "note.txt", str(tmp_path / "dl"))
    assert Path(local).read_text() == "hello"
    default = client.get_experiment("0")
    assert default.artifact_location.startswith((tmp_path / "b").as_uri()), default.artifact_location
    assert not list(cwd.iterdir()), "nothing (no mlruns/) is written where the process runs"


def test_mlflow_ui_url_is_configurable(tmp_path, monkeypatch):
    _, url = _run_with_artifact(tmp_path / "h1", tmp_path, ui_url="http://mlflow.internal:8080/")
    assert url.startswith("http://mlflow.internal:8080/#/experiments/")
    monkeypatch.setenv("RATCHET_MLFLOW_UI_URL", "http://127.0.0.1:5123")
    _, url = _run_with_artifact(tmp_path / "h2", tmp_path)
    assert url.startswith("http://127.0.0.1:5123/#/experiments/")
