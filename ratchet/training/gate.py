"""The governance evidence a training run needs, read from the warehouse before any weights change.

Dagster's blocking checks (`contamination` on split_assignments, `training_set_clean` on
training_set) stop the downstream steps of *their own run* only: `train_candidate`, a
cycle with `lifecycle: false` or a click on `sft_checkpoint` in the UI would train on whatever the
warehouse holds, checked or not. So every training asset calls `require_training_gate` first:

    gate = training_gate(con, "acme", now)      # {"passed": bool, "problems": [...], "evidence": {...}}
    require_training_gate(con, "acme", now)     # raises TrainingGateError naming every problem

It refuses when
- no contamination report exists, the newest one failed, or the split assignments were written
  after it (the current splits were never checked);
- training_set fails the `training_set_clean` SQL re-check (the same query);
- a row of the tenant's training_set is no longer trainable *now* (`consent.decide`: a grant revoked
  or expired since training_set was evaluated), so a revocation reaches the next batch even when
  nobody re-materialised training_set.
"""
from __future__ import annotations

from collections import Counter
from datetime import datetime

CONTAMINATION_SQL = """SELECT passed, overlap_fraction, n_items, checked_at FROM contamination_report
                       ORDER BY checked_at DESC LIMIT 1"""
SPLITS_WRITTEN_SQL = "SELECT max(assigned_at) AS at FROM split_assignments"
TENANT_ROWS_SQL = """
    SELECT ts.record_id, t.tenant_id, t.consent_id, t.started_at, t.ended_at
    FROM training_set ts JOIN trajectories t USING (record_id)
    WHERE ts.tenant_id = ? ORDER BY ts.record_id"""


class TrainingGateError(ValueError):
    """Training refused: the governance evidence is missing, failed or stale."""


def _has(con, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                            [table]).fetchall()[0][0])


def _fetch(con, sql: str, params=None) -> list[dict]:
    from ratchet.store import fetch

    return fetch(con, sql, params or [])


def training_gate(con, tenant: str, now: datetime) -> dict:
    """{"passed", "problems" (one sentence each, with the fix), "evidence"} for training `tenant`'s
    policy at `now`."""
    from ratchet.contract import utc_from_iso
    from ratchet.governance.consent import decide, grants_from_rows
    from ratchet.governance.training_views import GRANTS_SQL, TRAINING_VIOLATIONS_SQL

    problems, evidence = [], {}
    # 1. the contamination check's newest verdict, and that it covers the current splits
    rep = _fetch(con, CONTAMINATION_SQL) if _has(con, "contamination_report") else []
    if not rep:
        problems.append("no contamination report: run the `contamination` check on split_assignments")
    else:
        r = rep[0]
        evidence["contamination"] = {"passed": bool(r["passed"]), "overlap_fraction": r["overlap_fraction"],
                                     "items": r["n_items"], "checked_at": str(r["checked_at"])}
        if not r["passed"]:
            problems.append(f"the newest contamination report ({r['checked_at']}) failed: "
                            f"{100 * (r['overlap_fraction'] or 0):.2f}% of {r['n_items']} items overlap across splits")
        written = _fetch(con, SPLITS_WRITTEN_SQL)[0]["at"] if _has(con, "split_assignments") else None
        if written is not None and utc_from_iso(written) > utc_from_iso(r["checked_at"]):
            problems.append(f"split_assignments were written at {written}, after the newest contamination "
                            f"check ({r['checked_at']}): run the `contamination` check on them")
    # 2. training_set as the `training_set_clean` check re-verifies it
    if not _has(con, "training_set"):
        problems.append("no training_set: materialise the consent stage (training_set)")
        return {"passed": False, "problems": problems, "evidence": evidence}
    bad = _fetch(con, TRAINING_VIOLATIONS_SQL)
    evidence["training_set_violations"] = sum(b["n"] for b in bad)
    if bad:
        problems.append("training_set fails the training_set_clean re-check: " + ", ".join(
            f"{b['n']} {b['violation']} (e.g. {b['example_record']} for {b['example_tenant']})" for b in bad))
    # 3. consent now, not when training_set was evaluated
    grants = grants_from_rows(_fetch(con, GRANTS_SQL)) if _has(con, "consent_grants") else {}
    late = Counter()
    example = {}
    rows = _fetch(con, TENANT_ROWS_SQL, [tenant])
    for t in rows:
        reason, detail = decide(t, grants, now, tenant)
        if reason:
            late[reason] += 1
            example.setdefault(reason, f"{t['record_id']}: {detail}")
    evidence["tenant_rows"] = len(rows)
    if late:
        problems.append(f"{sum(late.values())} of tenant {tenant!r}'s training_set rows may no longer train at "
                        f"{now.isoformat()} (" + "; ".join(f"{n} {k}, e.g. {example[k]}" for k, n in late.items())
                        + "): re-materialise training_set (the consent gate) before training")
    return {"passed": not problems, "problems": problems, "evidence": evidence}


def require_training_gate(con, tenant: str, now: datetime) -> dict:
    """`training_gate`, raising TrainingGateError (every problem, one per line) when it did not pass."""
    gate = training_gate(con, tenant, now)
    if not gate["passed"]:
        raise TrainingGateError(f"training refused for tenant {tenant!r}:\n- " + "\n- ".join(gate["problems"]))
    return gate
