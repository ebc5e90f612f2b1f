"""The checkpoint registry: what each trained checkpoint was trained on, and flags for those whose
data came under a grant that was later revoked."""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Iterable

from ratchet.clock import now_utc
from ratchet.store import fetch, insert, replace, transaction

from .consent import checkpoints_to_flag

CHECKPOINT_COUNTS_SQL = "SELECT count(*) AS total, count(*) FILTER (WHERE flagged) AS flagged FROM checkpoints"


def register_checkpoint(con, checkpoint_id: str, tenant_id: str, record_ids: Iterable[str],
                        consent_ids: Iterable[str] | None = None, created_at: datetime | None = None) -> None:
    """Trainers call this after saving a checkpoint: which records (and grants) it was trained on.
    Consent ids default to those of the records. Re-registering an id replaces its row."""
    record_ids = sorted(set(record_ids))
    if consent_ids is None:
        consent_ids = [r[0] for r in con.execute(
            "SELECT DISTINCT consent_id FROM trajectories WHERE consent_id IS NOT NULL AND list_contains(?, record_id)",
            [record_ids]).fetchall()]
    replace(con, "checkpoints", [{"checkpoint_id": checkpoint_id, "tenant_id": tenant_id,
                                  "trained_record_ids": record_ids, "consent_ids": sorted(set(consent_ids)),
                                  "created_at": created_at or now_utc(), "flagged": False}],
            where="checkpoint_id = ?", params=[checkpoint_id])


def record_sft_coverage(con, checkpoint_id: str, tenant_id: str, entries: Iterable[dict], *, sft_data: str,
                        dagster_run_id: str | None = None) -> int:
    """Which of the rows an SFT checkpoint was offered trained, and why the others did not
    (`ratchet.training.recipe.coverage` entries); a re-run of the same checkpoint replaces them."""
    now = now_utc()
    rows = [{"checkpoint_id": checkpoint_id, "tenant_id": tenant_id, "record_id": e["record_id"],
             "source_format": e["source_format"], "trains": e["trains"], "reason": e["reason"] or None,
             "turns": e["turns"], "trainable_turns": e["trainable_turns"], "sft_data": sft_data,
             "created_at": now, "dagster_run_id": dagster_run_id} for e in entries]
    replace(con, "sft_coverage", rows, where="checkpoint_id = ?", params=[checkpoint_id])
    return len(rows)


def flag_checkpoints(con, now: datetime, run_id: str | None = None) -> tuple[list[dict], list[str]]:
    """Flag every checkpoint trained on data under a grant revoked at or before `now` (flags are
    sticky: a later un-revocation does not clear them). Returns (current flags, newly flagged ids)."""
    revoked = [r[0] for r in con.execute(
        "SELECT consent_id FROM consent_grants WHERE revoked_at IS NOT NULL AND revoked_at <= ?", [now]).fetchall()]
    cks = fetch(con, "SELECT checkpoint_id, trained_record_ids, consent_ids, flagged FROM checkpoints")
    registry = {c["checkpoint_id"]: {"record_ids": c["trained_record_ids"] or [], "consent_ids": c["consent_ids"] or []}
                for c in cks}
    used = sorted({r for c in cks for r in (c["trained_record_ids"] or [])})
    trajs = fetch(con, "SELECT record_id, consent_id FROM trajectories WHERE list_contains(?, record_id)", [used]) if used else []
    flags = checkpoints_to_flag(revoked, registry, trajs)
    for f in flags:
        f["flagged_at"], f["dagster_run_id"] = now, run_id
    already = {c["checkpoint_id"] for c in cks if c["flagged"]}
    reasons: dict[str, list[str]] = defaultdict(list)
    for f in flags:
        reasons[f["checkpoint_id"]].append(f"{f['consent_id']} ({f['n_records']} records)")
    new = sorted(set(reasons) - already)
    with transaction(con):
        for ck in new:
            con.execute("UPDATE checkpoints SET flagged = true, flagged_at = ?, flag_reason = ? WHERE checkpoint_id = ?",
                        [now, "trained_on_revoked_consent: " + ", ".join(reasons[ck]), ck])
        con.execute("DELETE FROM checkpoint_flags")
        insert(con, "checkpoint_flags", flags)
    return flags, new
