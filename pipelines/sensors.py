"""Sensors: the landing folder requests an ingest run for new files."""
from __future__ import annotations

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from .jobs import ingest_job


@sensor(job=ingest_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Requests an ingest run for files that appear in $RATCHET_HOME/landing.")
def landing_sensor(context: SensorEvaluationContext):
    from ratchet.home import get_home
    from ratchet.landing import scan

    landing = get_home().landing
    files, cursor, key = scan(landing, context.cursor)
    if not files:
        return SkipReason(f"no new files in {landing}")
    context.update_cursor(cursor)
    return RunRequest(run_key=f"landing-{key}",
                      run_config={"ops": {"ingest": {"config": {"paths": files}}}},
                      tags={"ratchet/files": str(len(files))})
