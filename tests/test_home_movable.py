"""RATCHET_HOME can move: MLflow's recorded artifact locations follow it, nothing is written to
the folder the process runs in, the MLflow UI URL in metadata is configurable, and a moved or
copied home knows which landing files it already read."""
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


def _landed(home) -> None:
    """The landing folder as the agents and imports leave it: good records and bad lines (some
    quarantined), aged past the sensor's settling time."""
    import os
    import time

    from ratchet import samples

    samples.write_samples(home.landing, n_synthetic=10)
    (home.landing / "agent-logs").mkdir(exist_ok=True)
    (home.landing / "agent-logs" / "broken.jsonl").write_text('{"trajectory_id": "x", \n[1, 2]\n')
    old = time.time() - 120
    for f in home.landing.rglob("*"):
        os.utime(f, (old, old))


def _counts(home) -> dict:
    from ratchet.warehouse import Warehouse

    with Warehouse(home.warehouse).connect() as con:
        one = lambda sql: con.execute(sql).fetchall()[0][0]  # noqa: E731
        return {"trajectories": one("SELECT count(*) FROM trajectories"),
                "quarantine": one("SELECT count(*) FROM quarantine"), "batches": one("SELECT count(*) FROM ingest_batches")}


def _sensor_tick(root: Path, monkeypatch):
    from dagster import DagsterInstance, build_sensor_context

    from pipelines.sensors import landing_sensor

    monkeypatch.setenv("RATCHET_HOME", str(root))
    with DagsterInstance.ephemeral() as instance:
        return landing_sensor(build_sensor_context(instance=instance))


def test_a_copied_home_reads_no_landing_file_again(tmp_path, monkeypatch):
    """The landing bookkeeping names files by their path in the landing folder, not by where the
    home lies: a copy (or a move) of the home after an ingest requests nothing, and an ingest of
    the copy's landing folder adds neither trajectories nor quarantine rows."""
    from ratchet.home import get_home
    from ratchet.ingest import ingest
    from ratchet.warehouse import Warehouse

    a = get_home(tmp_path / "a").ensure()
    _landed(a)
    s = ingest([str(a.landing)], Warehouse(a.warehouse))
    assert s.accepted and s.quarantined
    before = _counts(a)
    assert "no new files" in _sensor_tick(a.root, monkeypatch).skip_message

    shutil.copytree(a.root, tmp_path / "b")              # keeps modification times, as cp -a / rsync -a do
    b = get_home(tmp_path / "b")
    tick = _sensor_tick(b.root, monkeypatch)
    assert "no new files" in tick.skip_message, tick     # nothing is read again
    again = ingest([str(b.landing)], Warehouse(b.warehouse))
    assert (again.accepted, again.quarantined) == (0, 0) and again.duplicates == again.read
    assert _counts(b) == {**before, "batches": before["batches"] + 1}


def test_a_copy_with_new_modification_times_reads_each_file_once_and_adds_nothing(tmp_path, monkeypatch):
    """`cp -r` gives every file a new mtime: the sensor cannot tell the file did not change, so it
    asks once; the ingest finds every record and every bad line already there."""
    import os
    import time

    from ratchet.home import get_home
    from ratchet.ingest import ingest
    from ratchet.warehouse import Warehouse

    a = get_home(tmp_path / "a").ensure()
    _landed(a)
    ingest([str(a.landing)], Warehouse(a.warehouse))
    before = _counts(a)
    shutil.copytree(a.root, tmp_path / "b")
    b = get_home(tmp_path / "b")
    newer = time.time() - 60
    for f in b.landing.rglob("*"):
        os.utime(f, (newer, newer))
    req = _sensor_tick(b.root, monkeypatch)
    paths = req.run_config["ops"]["ingest"]["config"]["paths"]
    assert paths and all(p.startswith(str(b.landing)) for p in paths)
    s = ingest(paths, Warehouse(b.warehouse))
    assert (s.accepted, s.quarantined) == (0, 0)
    assert _counts(b) == {**before, "batches": before["batches"] + 1}
    assert "no new files" in _sensor_tick(b.root, monkeypatch).skip_message


def test_mlflow_links_follow_the_env_then_the_served_url_then_the_default(tmp_path, monkeypatch):
    """Links in asset metadata go where `ratchet mlflow` serves this home (it records its URL in
    RATCHET_HOME/mlflow_ui_url), unless $RATCHET_MLFLOW_UI_URL says otherwise; before any server
    ran, to the default port."""
    from pipelines import cli
    from ratchet.home import get_home
    from ratchet.mlflow_store import DEFAULT_UI_URL, UI_URL_FILE, record_ui_url, ui_url

    monkeypatch.delenv("RATCHET_MLFLOW_UI_URL", raising=False)
    home = get_home(tmp_path / "h")
    assert ui_url(home) == DEFAULT_UI_URL == "http://127.0.0.1:5000"
    served = []
    monkeypatch.setenv("RATCHET_HOME", str(home.root))      # `ratchet --home` sets these for its process
    monkeypatch.setenv("DAGSTER_HOME", str(home.dagster))
    monkeypatch.setattr(cli, "serve", lambda cmd, env, cwd: served.append(cmd) or 0)
    assert cli.main(["--home", str(home.root), "mlflow", "--port", "5123"]) == 0
    assert "5123" in served[0] and (home.root / UI_URL_FILE).read_text().strip() == "http://127.0.0.1:5123"
    assert ui_url(home) == "http://127.0.0.1:5123"
    _, url = _run_with_artifact(home.root, tmp_path)
    assert url.startswith("http://127.0.0.1:5123/#/experiments/")
    monkeypatch.setenv("RATCHET_MLFLOW_UI_URL", "http://mlflow.internal:8080/")
    assert ui_url(home) == "http://mlflow.internal:8080"
    _, url = _run_with_artifact(home.root, tmp_path, ui_url="http://given:1/")   # the resource's own setting first
    assert url.startswith("http://given:1/#/experiments/")
    monkeypatch.delenv("RATCHET_MLFLOW_UI_URL")
    assert record_ui_url(home, "0.0.0.0", 8080) == "http://127.0.0.1:8080"   # a wildcard bind: the loopback
    assert record_ui_url(home, "::", 8080) == "http://[::1]:8080" == ui_url(home)
