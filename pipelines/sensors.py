"""Sensors: the landing folder requests an ingest run for new files."""
from __future__ import annotations

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from .jobs import ingest_job


@sensor(job=ingest_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Requests an ingest run for files in $RATCHET_HOME/landing that the warehouse has not "
                    "ingested yet (so it starts where `make demo` or `ratchet ingest` left off).")
def landing_sensor(context: SensorEvaluationContext):
    from ratchet.home import get_home
    from ratchet.landing import INGESTED_SQL, scan
    from ratchet.warehouse import Warehouse, WarehouseLockTimeout

    home = get_home()
    ingested = []
    if home.warehouse.exists():
        wh = Warehouse(home.warehouse, lock_timeout_s=10)
        try:
            wh.ensure_schema()
            ingested = [tuple(r.values()) for r in wh.store().read(INGESTED_SQL)]
        except WarehouseLockTimeout:
            return SkipReason("the warehouse is busy (an ingest is running); next tick")
    files, cursor, key = scan(home.landing, context.cursor, ingested)
    if not files:
        context.update_cursor(cursor)
        return SkipReason(f"no new files in {home.landing}")
    context.update_cursor(cursor)
    return RunRequest(run_key=f"landing-{key}",
                      run_config={"ops": {"ingest": {"config": {"paths": files}}}},
                      tags={"ratchet/files": str(len(files)), "ratchet/trigger": "landing_sensor"})
