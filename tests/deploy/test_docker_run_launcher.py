"""The production deployment, run for real: Postgres + Docker engine + the code location image,
and a run launched through `dagster_docker.DockerRunLauncher` that must succeed, with its
history in Postgres and its output in the host's warehouse (deploy/, docs/deploy.md)."""
import json
import shutil
import time
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
    assert cfg["concurrency"]["pools"]["default_limit"] == 1
    assert cfg["telemetry"]["enabled"] is False
    ref = InstanceRef.from_dir(str(tmp_path))
    assert ref.storage_data.class_name == "DagsterPostgresStorage"
    assert ref.run_coordinator_data.class_name == "QueuedRunCoordinator"


def test_the_deployment_limits_every_pool_the_assets_use():
    """Each pool named by an op of the code location (`pool=` on the assets and checks) gets a
    limit from `python -m deploy up`: a pool the deployment does not know is a config drift."""
    from deploy import stack
    from pipelines.definitions import defs

    used = {n.pool for j in defs.resolve_all_job_defs() for n in j.graph.node_defs if getattr(n, "pool", None)}
    assert used == {"sandbox", "training", "warehouse"}
    assert used <= set(stack.POOL_LIMITS)
    assert all(n == 1 for n in stack.POOL_LIMITS.values())


def _query(cluster, sql, args=()):
    with cluster.connect() as conn, conn.cursor() as cur:
        cur.execute(sql, args)
        rows = cur.fetchall()
    conn.close()
    return rows


def _wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_a_run_launched_through_the_docker_run_launcher_succeeds_with_history_in_postgres(tmp_path, monkeypatch):
    """One real run: queued behind a held `warehouse` pool slot (limit 1, enforced through
    Postgres), released, then launched by the daemon in its own container; it succeeds, its
    history is in Postgres and its rows are in the host's DuckDB warehouse."""
    _needs_stack()
    import docker
    from dagster import deserialize_value

    from deploy import postgres, stack
    from ratchet.warehouse import Warehouse

    home = tmp_path / "home"
    inbox = home / "inbox"          # not the landing folder: the ingest sensor stays idle
    inbox.mkdir(parents=True)
    shutil.copyfile(FIXTURE, inbox / FIXTURE.name)
    state_dir = tmp_path / "state"
    st = stack.up(state_dir, home=home)
    client = docker.from_env()
    instance = None
    try:
        for k, v in st["env"].items():
            monkeypatch.setenv(k, v)
        from dagster import DagsterInstance
        instance = DagsterInstance.get()
        cluster = postgres.Cluster(**st["postgres"])
        # Hold the only warehouse slot, as another run's step would: the run must wait.
        instance.event_log_storage.claim_concurrency_slot("warehouse", "deploy-test-holder", "hold")
        run_id = stack.launch(st, "ingest_job", {"ops": {"ingest": {"config": {"paths": [str(inbox)]}}}},
                              tags={"test": "deploy"})
        _wait_for(lambda: _query(cluster, "SELECT 1 FROM daemon_heartbeats WHERE daemon_type = %s",
                                 ("QUEUED_RUN_COORDINATOR",)), 120, "the daemon's run queue")
        time.sleep(12)  # > 2 dequeue intervals (5 s) with the daemon up
        assert _query(cluster, "SELECT status FROM runs WHERE run_id = %s", (run_id,)) == [("QUEUED",)]
        assert not _query(cluster, "SELECT 1 FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
                          (run_id, "STEP_START"))
        instance.event_log_storage.free_concurrency_slots_for_run("deploy-test-holder")
        status = stack.wait_run(st, run_id, timeout=240)
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
        # The instance ref on the command line names the env var, never the password itself.
        assert st["env"]["DAGSTER_PG_PASSWORD"] not in json.dumps(container.attrs["Config"]["Cmd"])
        assert limits == stack.POOL_LIMITS == {"sandbox": 1, "training": 1, "warehouse": 1}
        # The run container wrote the host's warehouse: the rows match what the run reported.
        mats = [deserialize_value(e) for k, e in events if k == "ASSET_MATERIALIZATION"]
        traj = next(m for m in mats if m.asset_materialization.asset_key.path == ["trajectories"])
        accepted = traj.asset_materialization.metadata["accepted"].value
        assert accepted > 0
        # Through the warehouse's own lock, as every reader and writer of the stack does: a raw
        # read-only connect failed now and then with DuckDB's lock conflict while one of the
        # stack's sensor ticks held the file.
        with Warehouse(home / "warehouse.duckdb").connect() as con:
            assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == accepted
        assert json.loads((state_dir / "state.json").read_text())["id"] == st["id"]
    finally:
        if instance is not None:
            instance.dispose()
        report = stack.down(state_dir)
    assert not client.containers.list(all=True, filters={"label": f"{stack.LABEL}={st['id']}"}), report
    assert not Path(st["postgres"]["root"]).exists()
    assert not state_dir.exists()
    client.close()
