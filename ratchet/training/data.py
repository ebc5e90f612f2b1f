"""Training data for one policy tenant, read only through the governed `training_set` table
(consent gate + split gate already applied by governance, re-checked there in SQL).

    rows = tenant_training_rows(con, "acme")            # accepted, consented, train split
    manifest = data_manifest(rows)                       # which trajectories, which grants, a hash

The trainer never reads `trajectories` directly: a trajectory enters a batch only if
`training_set` lists it for this tenant. Another tenant's rows (unless its grant shares them and
governance put them in this tenant's view) and rows under a revoked or expired grant are not
there, so they cannot reach a batch.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

# The base policy's corpus: train-split tasks only (never holdout or validation problems).
TRAIN_TASKS_SQL = """
    SELECT t.*, s.split FROM tasks t
    JOIN split_assignments s ON s.kind = 'task' AND s.source_id = t.task_id
    WHERE s.split = 'train' ORDER BY t.task_id"""
# RL's validation tasks: the val split (never trained on, never the holdout), which picks the
# step of a GRPO run to register
VAL_TASKS_SQL = TRAIN_TASKS_SQL.replace("s.split = 'train'", "s.split = 'val'")
ROWS_SQL = """
    SELECT ts.record_id, ts.trajectory_id, ts.task_id, ts.consent_id, ts.owner_tenant_id,
           t.accepted, t.tests_passed, t.messages, t.tools, t.source_format
    FROM training_set ts JOIN trajectories t USING (record_id)
    WHERE ts.tenant_id = ? AND ts.split = 'train' {accepted}
    ORDER BY ts.task_id, ts.trajectory_id, ts.record_id"""


def tenant_training_rows(con, tenant: str, *, accepted_only: bool = True) -> list[dict]:
    """The tenant's training rows in (task_id, trajectory_id) order, so a run's data order is
    reproducible: not record_id order, which hashes timestamps and measured latencies (the same
    trajectories logged by another run of the same agents have other record ids, and SFT's seeded
    shuffle would then see them in another order)."""
    sql = ROWS_SQL.format(accepted="AND t.accepted" if accepted_only else "")
    cur = con.cursor()
    try:
        res = cur.execute(sql, [tenant])
        cols = [d[0] for d in res.description]
        return [dict(zip(cols, r)) for r in res.fetchall()]
    finally:
        cur.close()


def data_manifest(rows: Iterable[Mapping]) -> dict:
    """What a checkpoint was trained on: record ids, grants, and a sha256 over the sorted ids."""
    rows = list(rows)
    ids = sorted({r["record_id"] for r in rows})
    return {"record_ids": ids, "consent_ids": sorted({r["consent_id"] for r in rows if r.get("consent_id")}),
            "task_ids": sorted({r["task_id"] for r in rows if r.get("task_id")}),
            "manifest_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(), "n": len(ids)}
