"""The wiring of the whole graph as a snapshot: asset keys, dependencies, groups, kinds, owners,
checks (and whether they block), jobs, sensors and schedules. Any change to the graph shows as a
diff of tests/snapshots/definitions.json; accept an intended change with

    RATCHET_UPDATE_SNAPSHOT=1 .venv/bin/pytest tests/test_definitions_snapshot.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.json"


def graph_snapshot(defs) -> dict:
    g = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(g.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = g.get(key)
        assets[key.to_user_string()] = {
            "deps": sorted(p.to_user_string() for p in node.parent_keys),
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "owners": sorted(node.owners),
            "partitioned": node.partitions_def is not None,
        }
    checks = {}
    for ck in sorted(g.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        spec = g.get_check_spec(ck)
        checks[f"{ck.asset_key.to_user_string()}:{ck.name}"] = {"blocking": bool(spec.blocking)}
    jobs = {}
    for job in sorted(defs.jobs or [], key=lambda j: j.name):
        resolved = defs.resolve_job_def(job.name)
        jobs[job.name] = sorted(k.to_user_string() for k in resolved.asset_layer.selected_asset_keys)
    sensors = {s.name: {"status": s.default_status.value,
                        "targets": sorted(t.job_name for t in s.targets)} for s in (defs.sensors or [])}
    schedules = {s.name: {"cron": s.cron_schedule, "status": s.default_status.value,
                          "job": s.job_name} for s in (defs.schedules or [])}
    return {"assets": assets, "checks": checks, "jobs": jobs, "sensors": dict(sorted(sensors.items())),
            "schedules": dict(sorted(schedules.items()))}


def test_definitions_match_the_snapshot():
    from pipelines.definitions import defs

    got = graph_snapshot(defs)
    text = json.dumps(got, indent=1, sort_keys=True) + "\n"
    if os.environ.get("RATCHET_UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text(text)
    assert SNAPSHOT.exists(), f"no snapshot at {SNAPSHOT}: create it with RATCHET_UPDATE_SNAPSHOT=1"
    want = json.loads(SNAPSHOT.read_text())
    assert got == want, ("the asset graph changed; if intended, re-run with RATCHET_UPDATE_SNAPSHOT=1 and commit "
                         "tests/snapshots/definitions.json")


def test_every_layer_exports_definitions():
    """Each assets/ module exports its own `defs`, and definitions.py merges all of them."""
    import importlib
    import pkgutil

    import assets
    from pipelines import definitions

    mods = [importlib.import_module(f"assets.{m.name}") for m in pkgutil.iter_modules(assets.__path__)]
    exported = [m for m in mods if hasattr(m, "defs")]
    assert exported == mods, f"assets modules without `defs`: {[m.__name__ for m in mods if m not in exported]}"
    merged = {id(d) for d in definitions.LAYERS}
    assert all(id(m.defs) in merged for m in mods), "an assets module's defs is not merged in pipelines/definitions.py"
