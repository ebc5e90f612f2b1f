"""`ratchet demo`: the whole lifecycle on the embedded default, in-process, on the persistent
Dagster instance under RATCHET_HOME (so `ratchet ui` shows the runs afterwards)."""
from __future__ import annotations

import json
import sys
import time


def _say(msg: str) -> None:
    print(f"[ratchet demo] {msg}", file=sys.stderr, flush=True)


def prepare_landing(home, quick: bool) -> dict:
    """Fill the landing folder the way production logs arrive (idempotent: same files each run)."""
    from ratchet.samples import write_samples

    return write_samples(home.landing, n_synthetic=200 if quick else 2000)


def run_demo(home, quick: bool = False) -> int:
    from dagster import DagsterInstance

    from pipelines.definitions import defs

    t0 = time.perf_counter()
    _say(f"RATCHET_HOME={home.root}")
    written = prepare_landing(home, quick)
    _say(f"landing folder ready: {written}")
    job = defs.resolve_implicit_global_asset_job_def()
    with DagsterInstance.get() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config={
            "loggers": {"console": {"config": {"log_level": "INFO"}}}})
    for ev in result.get_asset_check_evaluations():
        _say(f"check {ev.asset_key.to_user_string()}:{ev.check_name} -> {'passed' if ev.passed else 'FAILED'}")
    if not result.success:
        _say("the lifecycle run failed; see `ratchet ui` for the step logs")
        return 1
    from ratchet.warehouse import Warehouse

    wh = Warehouse(home.warehouse)
    with wh.connect() as con:
        summary = {
            "trajectories": con.execute("SELECT count(*) FROM trajectories").fetchone()[0],
            "quarantine": con.execute("SELECT count(*) FROM quarantine").fetchone()[0],
            "by_format": dict(con.execute("SELECT source_format, count(*) FROM trajectories GROUP BY 1 ORDER BY 1").fetchall()),
            "quarantine_reasons": dict(con.execute(
                "SELECT reason_code, count(*) FROM quarantine GROUP BY 1 ORDER BY 2 DESC").fetchall()),
            "tenants": dict(con.execute(
                "SELECT coalesce(tenant_id, '(none)'), count(*) FROM trajectories GROUP BY 1 ORDER BY 1").fetchall()),
        }
    _say(f"done in {time.perf_counter() - t0:.1f} s. Try: ratchet query \"SELECT * FROM v_quarantine_reasons\"")
    print(json.dumps({"demo": "ok", "warehouse": str(home.warehouse), **summary}))
    return 0
