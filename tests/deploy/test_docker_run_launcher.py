"""The production deployment, run for real: Postgres + Docker engine + the code location image,
and a run launched through `dagster_docker.DockerRunLauncher` that must succeed, with its
history in Postgres and its output in the host's warehouse (deploy/, docs/deploy.md)."""
import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
FIXTURE = Path(__file__).resolve().parents[1] / "ingest" / "fixtures" / "openai_finetune.jsonl"


def _needs_stack():
    pytest.importorskip("dagster_docker", reason="dagster-docker is not installed (pip install dagster-docker==0.29.27)")
    pytest.importorskip("dagster_postgres", reason="dagster-postgres is not installed (pip install dagster-postgres==0.29.27)")
    from deploy import postgres
    from sandboxes import docker_engine

    reason, _ = docker_engine.ensure()
    if reason:
        pytest.skip(f"Docker cannot run here: {reason}")
    why = postgres.unavailable_reason()
    if why:
        pytest.skip(f"PostgreSQL cannot run here: {why}")


def test_instance_config_is_valid_and_says_what_the_deployment_promises(tmp_path, monkeypatch):
    """deploy/dagster.yaml passes Dagster's own schema and names the launcher, storage, queue,
    pool granularity and env forwarding that the rest of the deployment relies on."""
    pytest.importorskip("dagster_postgres", reason="dagster-postgres is not installed")
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.instance.ref import InstanceRef

    for k in ("DAGSTER_PG_HOST", "DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB",
              "RATCHET_DEPLOY_IMAGE"):
        monkeypatch.setenv(k, "x")
    monkeypatch.setenv("DAGSTER_PG_PORT", "5432")
    shutil.copyfile(DEPLOY / "dagster.yaml", tmp_path / "dagster.yaml")
    cfg, _ = dagster_instance_config(str(tmp_path))
    launcher = cfg["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_docker", "DockerRunLauncher")
    assert launcher["config"]["network"] == "host"
    forwarded = {e.split("=")[0] for e in launcher["config"]["env_vars"]}
    assert {"RATCHET_HOME", "DAGSTER_PG_PASSWORD", "DAGSTER_HOME"} <= forwarded
    assert cfg["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert cfg["concurrency"]["pools"]["granularity"] == "op"
    assert cfg["telemetry"]["enabled"] is False
    ref = InstanceRef.from_dir(str(tmp_path))
    assert ref.storage_data.class_name == "DagsterPostgresStorage"
    assert ref.run_coordinator_data.class_name == "QueuedRunCoordinator"


def test_a_run_launched_through_the_docker_run_launcher_succeeds_with_history_in_postgres(tmp_path):
    _needs_stack()
    import docker
    import duckdb
    from dagster import deserialize_value

    from deploy import postgres, stack

    home = tmp_path / "home"
    inbox = home / "inbox"          # not the landing folder: the ingest sensor stays idle
    inbox.mkdir(parents=True)
    shutil.copyfile(FIXTURE, inbox / FIXTURE.name)
    state_dir = tmp_path / "state"
    st = stack.up(state_dir, home=home)
    client = docker.from_env()
    try:
        run_id = stack.launch(st, "ingest_job", {"ops": {"ingest": {"config": {"paths": [str(inbox)]}}}},
                              tags={"test": "deploy"})
        status = stack.wait_run(st, run_id, timeout=240)
        cluster = postgres.Cluster(**st["postgres"])
        with cluster.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT status, pipeline_name FROM runs WHERE run_id = %s", (run_id,))
            run_row = cur.fetchone()
            cur.execute("SELECT key, value FROM run_tags WHERE run_id = %s", (run_id,))
            tags = dict(cur.fetchall())
            cur.execute("SELECT dagster_event_type, event FROM event_logs WHERE run_id = %s ORDER BY id",
                        (run_id,))
            events = cur.fetchall()
            cur.execute("SELECT concurrency_key, \"limit\" FROM concurrency_limits")
            limits = dict(cur.fetchall())
        conn.close()
        kinds = [k for k, _ in events]
        failure = [deserialize_value(e).message for k, e in events if k in ("STEP_FAILURE", "PIPELINE_FAILURE")]
        assert status == "SUCCESS", f"run {run_id} ended {status}: {failure}"
        assert run_row == ("SUCCESS", "ingest_job")
        assert tags["test"] == "deploy"
        # Queued, then dequeued by the daemon, which launched it in its own container.
        assert kinds.index("PIPELINE_ENQUEUED") < kinds.index("PIPELINE_STARTING") < kinds.index("PIPELINE_SUCCESS")
        assert tags["dagster/image"] == st["image"]
        container = client.containers.get(tags["docker/container_id"])
        assert container.labels["dagster/run_id"] == run_id
        assert container.labels[stack.LABEL] == st["id"]
        assert container.attrs["HostConfig"]["NetworkMode"] == "host"
        assert container.attrs["State"]["ExitCode"] == 0
        assert container.attrs["Config"]["Cmd"][:5] == ["/usr/bin/python3", "-m", "dagster", "api", "execute_run"]
        assert limits == {"gpu": 1, "warehouse": 1}
        # The run container wrote the host's warehouse: the rows match what the run reported.
        mats = [deserialize_value(e) for k, e in events if k == "ASSET_MATERIALIZATION"]
        traj = next(m for m in mats if m.asset_materialization.asset_key.path == ["trajectories"])
        accepted = traj.asset_materialization.metadata["accepted"].value
        assert accepted > 0
        con = duckdb.connect(str(home / "warehouse.duckdb"), read_only=True)
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == accepted
        con.close()
        assert json.loads((state_dir / "state.json").read_text())["id"] == st["id"]
    finally:
        report = stack.down(state_dir)
    assert not client.containers.list(all=True, filters={"label": f"{stack.LABEL}={st['id']}"}), report
    assert not Path(st["postgres"]["root"]).exists()
    assert not state_dir.exists()
    client.close()
