"""The ingest assets in Dagster: materialised in-process on an ephemeral instance."""
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context, materialize

from assets.ingest import ingest_assets, quarantine_rate, trajectories_contract
from ratchet import samples
from resources import MlflowTracking, WarehouseResource

REPO = Path(__file__).resolve().parents[2]


def _resources(home):
    return {"warehouse": WarehouseResource(home=str(home.root)), "tracking": MlflowTracking(home=str(home.root))}


def test_materialize_ingest_with_checks(home):
    samples.write_samples(home.landing, n_synthetic=100)
    res = materialize([ingest_assets, trajectories_contract, quarantine_rate], resources=_resources(home),
                      instance=DagsterInstance.ephemeral())
    assert res.success
    mats = {e.asset_key.to_user_string(): e.event_specific_data.materialization.metadata
            for e in res.get_asset_materialization_events()}
    assert mats["trajectories"]["accepted"].value == 106
    assert mats["quarantine"]["quarantined"].value == len(samples.bad_lines())
    assert mats["trajectories"]["mlflow_run"].value.startswith("http")
    assert mats["trajectories"]["chart"].value.startswith("![ingest outcome](data:image/png;base64,iVBOR")
    assert (home.root / mats["trajectories"]["chart_file"].value).exists()
    assert mats["trajectories"]["chart_file"].value.startswith("artifacts/")
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    assert checks["trajectories_contract"].passed and checks["quarantine_rate"].passed
    assert checks["trajectories_contract"].metadata["failed"].value == 0
    assert checks["quarantine_rate"].metadata["rate"].value == pytest.approx(8 / 114)
    # the MLflow run exists, is finished and is tagged with the Dagster run id
    from mlflow.tracking import MlflowClient
    run_id = mats["trajectories"]["mlflow_run_id"].value          # recorded: the link's host may change
    assert mats["trajectories"]["mlflow_run"].value.endswith("/runs/" + run_id)
    r = MlflowClient(tracking_uri=f"sqlite:///{home.mlflow_db}").get_run(run_id)
    assert r.info.status == "FINISHED" and r.data.tags["ratchet.dagster_run_id"] == res.run_id
    assert r.data.metrics["accepted"] == 106


def test_contract_check_fails_and_blocks_on_bad_rows(home, wh):
    """A row that bypassed ingest (negative cost, written straight into the lake) fails the check."""
    import pyarrow as pa

    from ratchet.contract import normalise
    from ratchet.synth import trajectory
    from ratchet.warehouse import STORED_SCHEMA
    import random

    row = normalise(trajectory(1, random.Random(0)))
    row.update(cost_usd=-5.0, source_file="x", source_line=1, batch_id="b", ingested_at=None)
    wh.write_trajectories(pa.Table.from_pylist([row], schema=STORED_SCHEMA), "tampered")
    res = materialize([ingest_assets, trajectories_contract, quarantine_rate], resources=_resources(home),
                      instance=DagsterInstance.ephemeral(), raise_on_error=False)
    ev = {c.check_name: c for c in res.get_asset_check_evaluations()}["trajectories_contract"]
    assert not ev.passed
    failed = [r for r in ev.metadata["results"].value if not r["success"]]
    assert [(r["column"], r["unexpected_count"]) for r in failed] == [("cost_usd", 1)]


def test_landing_sensor_requests_each_file_once(home, monkeypatch):
    import os
    import time

    from pipelines.sensors import landing_sensor

    (home.landing / "a.jsonl").write_text("{}\n")
    old = time.time() - 60
    os.utime(home.landing / "a.jsonl", (old, old))
    with DagsterInstance.ephemeral() as instance:
        ctx = build_sensor_context(instance=instance)
        req = landing_sensor(ctx)
        assert req.run_config["ops"]["ingest"]["config"]["paths"] == [str(home.landing / "a.jsonl")]
        cursor = ctx.cursor
        ctx2 = build_sensor_context(instance=instance, cursor=cursor)
        assert "no new files" in landing_sensor(ctx2).skip_message
        (home.landing / "b.jsonl").write_text("{}\n")
        os.utime(home.landing / "b.jsonl", (old, old))
        (home.landing / "fresh.jsonl").write_text("{}\n")  # still being written: left for the next tick
        (home.landing / "_batch.yaml").write_text("tenant_id: x\n")
        ctx3 = build_sensor_context(instance=instance, cursor=cursor)
        req3 = landing_sensor(ctx3)
        assert req3.run_config["ops"]["ingest"]["config"]["paths"] == [str(home.landing / "b.jsonl")]
        assert req3.run_key != req.run_key
        assert str(home.landing) not in ctx3.cursor          # compact: relative paths of pending files only


def test_landing_sensor_starts_where_an_in_process_ingest_left_off(home):
    """Files ingested outside the sensor (make demo, ratchet ingest) are not requested again, and
    the cursor forgets files once the warehouse has recorded them."""
    import os
    import time

    from pipelines.sensors import landing_sensor
    from ratchet.ingest import ingest
    from ratchet.warehouse import Warehouse

    samples.write_samples(home.landing, n_synthetic=20)
    old = time.time() - 60
    for f in home.landing.rglob("*"):
        os.utime(f, (old, old))
    ingest([str(home.landing)], Warehouse(home.warehouse))
    with DagsterInstance.ephemeral() as instance:
        ctx = build_sensor_context(instance=instance)
        assert "no new files" in landing_sensor(ctx).skip_message
        (home.landing / "late.jsonl").write_text("{}\n")
        os.utime(home.landing / "late.jsonl", (old, old))
        ctx2 = build_sensor_context(instance=instance, cursor=ctx.cursor)
        req = landing_sensor(ctx2)
        assert req.run_config["ops"]["ingest"]["config"]["paths"] == [str(home.landing / "late.jsonl")]
        assert '"late.jsonl"' in ctx2.cursor and len(ctx2.cursor) < 200
        ingest([str(home.landing / "late.jsonl")], Warehouse(home.warehouse))
        ctx3 = build_sensor_context(instance=instance, cursor=ctx2.cursor)
        assert "no new files" in landing_sensor(ctx3).skip_message
        assert "late.jsonl" not in ctx3.cursor                # recorded by the warehouse: dropped from the cursor


def test_definitions_load_and_validate(home):
    from pipelines.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"trajectories", "quarantine"} <= keys
    out = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w",
                          str(REPO / "workspace.yaml")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful" in out.stdout + out.stderr


def test_definitions_import_stays_light():
    """Heavy libraries are imported inside the functions that use them, never at load time."""
    code = ("import sys, pipelines.definitions; "
            "print(sorted(m for m in ('torch','transformers','trl','mlflow','great_expectations','peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
