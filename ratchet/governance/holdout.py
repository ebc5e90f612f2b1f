"""The locked holdout's lifecycle in the warehouse: its verified state, lock / adopt / unlock with
an append-only audit log, and the one check that a split leaves it where it was."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable

from ratchet.clock import now_utc, parse_now
from ratchet.store import fetch, insert, transaction

from .manifest import (
    HoldoutManifest,
    ManifestError,
    create_manifest,
    load_manifest,
    manifest_from_rows,
    manifest_rows,
    save_manifest,
    unlock,
)

HOLDOUT_TASKS_SQL = "SELECT source_id FROM split_assignments WHERE kind = 'task' AND split = 'holdout' ORDER BY 1"
TASK_IDS_SQL = "SELECT task_id FROM tasks"
LOG_SQL = """SELECT seq, event_at, event, version, manifest_sha256, n_tasks, actor, reason
             FROM holdout_manifest_log ORDER BY seq DESC LIMIT ?"""


@dataclass
class HoldoutState:
    """What the warehouse and the manifest file say about the holdout, cross-checked."""
    path: Path
    manifest: HoldoutManifest | None     # verified; None when no holdout was ever locked
    recorded: bool                        # the warehouse holds a lock record

    @property
    def locked(self) -> bool:
        return self.manifest is not None and self.manifest.locked

    @property
    def needs_adoption(self) -> bool:
        return self.manifest is not None and not self.recorded


def holdout_state(con, path: str | Path) -> HoldoutState:
    """Load the manifest file and verify it against the warehouse (ManifestError when they
    disagree). The sha256 recorded in holdout_manifest_log at lock time is the authority: a file
    whose ids and hash were both rewritten, a deleted file, a hand-flipped `locked` flag or edited
    holdout_manifest rows all raise. A file with no warehouse record at all (a fresh warehouse)
    is returned for adoption, verified only against itself."""
    path = Path(path)
    events = fetch(con, "SELECT * FROM holdout_manifest_log ORDER BY seq")
    locks = [e for e in events if e["event"] in ("lock", "adopt")]
    table_rows = fetch(con, "SELECT * FROM holdout_manifest")
    if not locks and not table_rows:
        m = load_manifest(path, required=False)
        return HoldoutState(path, m, recorded=False)
    if not locks:
        raise ManifestError("holdout_manifest has rows but holdout_manifest_log has no lock record (log edited?)")
    if not table_rows:
        raise ManifestError(f"holdout_manifest_log records a locked holdout (version {locks[-1]['version']}) "
                            f"but the holdout_manifest table is empty (rows deleted?)")
    lock = locks[-1]
    try:
        m = load_manifest(path, required=True, expected_sha256=lock["manifest_sha256"])
    except ManifestError as e:
        raise ManifestError(f"{e} -- the warehouse recorded holdout version {lock['version']} "
                            f"(sha256 {lock['manifest_sha256'][:12]}..., {lock['n_tasks']} tasks) at {lock['event_at']}; "
                            f"rewrite the file from the warehouse's recorded rows with "
                            f"`ratchet holdout restore --reason R --actor A`"
                            ) from None
    if m.version != lock["version"]:
        raise ManifestError(f"holdout manifest at {path} is version {m.version}, the warehouse recorded {lock['version']}")
    stored = manifest_from_rows(table_rows)
    if stored.sha256 != lock["manifest_sha256"] or stored.version != lock["version"]:
        raise ManifestError("holdout_manifest table rows differ from the sha256 recorded in holdout_manifest_log "
                            "(rows edited?)")
    state = [e for e in events if e["version"] == m.version and e["event"] in ("lock", "adopt", "unlock")][-1]
    unlocked = state["event"] == "unlock"
    if m.locked == unlocked or stored.locked == unlocked:
        raise ManifestError(f"holdout manifest at {path} says locked={m.locked} but the warehouse says "
                            f"locked={not unlocked} (last event: {state['event']} by {state['actor']} at {state['event_at']}); "
                            f"the lock flag can only change through `ratchet holdout unlock`")
    return HoldoutState(path, m, recorded=True)


def log_event(con, event: str, m: HoldoutManifest, path: str | Path, actor: str | None = None,
              reason: str | None = None, run_id: str | None = None, at: datetime | None = None) -> dict:
    seq, = con.execute("SELECT coalesce(max(seq), 0) + 1 FROM holdout_manifest_log").fetchall()[0]
    row = {"seq": seq, "event_at": at or now_utc(), "event": event, "version": m.version, "manifest_sha256": m.sha256,
           "n_tasks": len(m.task_ids), "actor": actor, "reason": reason, "path": str(path), "dagster_run_id": run_id}
    insert(con, "holdout_manifest_log", [row])
    return row


def lock_holdout(con, path: str | Path, task_ids: Iterable[str], locked_by: str, previous: HoldoutManifest | None = None,
                 run_id: str | None = None) -> HoldoutManifest:
    """Lock a new manifest (version = previous + 1): file, table rows and a `lock` log event,
    written in one warehouse transaction (the file is written before the commit)."""
    version = previous.version + 1 if previous is not None else 1
    m = create_manifest(task_ids, locked_by=locked_by, version=version)
    if previous is not None:
        from dataclasses import replace as dc_replace

        m = dc_replace(m, audit=previous.audit)
    with transaction(con):
        con.execute("DELETE FROM holdout_manifest WHERE version = ?", [m.version])
        insert(con, "holdout_manifest", manifest_rows(m))
        log_event(con, "lock", m, path, actor=locked_by, run_id=run_id)
        save_manifest(m, path)
    return m


def adopt_holdout(con, state: HoldoutState, actor: str, run_id: str | None = None) -> HoldoutManifest:
    """Record a manifest file found without any warehouse record (e.g. a rebuilt warehouse)."""
    m = state.manifest
    with transaction(con):
        insert(con, "holdout_manifest", manifest_rows(m))
        log_event(con, "adopt", m, state.path, actor=actor, reason="manifest file found without a warehouse record",
                  run_id=run_id)
        if not m.locked:  # an unlocked file stays unlocked, and the log says so
            log_event(con, "unlock", m, state.path, actor=actor, reason="adopted unlocked", run_id=run_id)
    return m


def unlock_holdout(con, path: str | Path, reason: str, actor: str, now: datetime | None = None) -> tuple[HoldoutManifest, dict]:
    """`ratchet holdout unlock`: verify, then flip the manifest to unlocked with an audit row in
    the file, the table and holdout_manifest_log. The next split run may then re-draw the holdout
    and locks a new version."""
    if not (reason and reason.strip()) or not (actor and actor.strip()):
        raise ManifestError("unlocking the holdout needs a non-empty --reason and --actor")
    state = holdout_state(con, path)
    if state.manifest is None:
        raise ManifestError(f"no holdout manifest at {path}: nothing to unlock")
    if state.needs_adoption:
        adopt_holdout(con, state, actor=actor)
    m, audit = unlock(state.manifest, reason.strip(), actor.strip(), now=now)
    with transaction(con):
        con.execute("UPDATE holdout_manifest SET locked = false WHERE version = ?", [m.version])
        row = log_event(con, "unlock", m, path, actor=audit["actor"], reason=audit["reason"], at=parse_now(audit["at"]))
        save_manifest(m, path)
    return m, row


def restore_holdout(con, path: str | Path, reason: str, actor: str, now: datetime | None = None) -> tuple[HoldoutManifest, dict]:
    """`ratchet holdout restore`: rewrite a deleted or edited manifest file from the warehouse's
    rows of the recorded version. The rows must hash to the sha256 the log recorded at lock time
    (the authority), so a restore can only bring back the holdout that was locked, never a new one;
    the unlock audit is rebuilt from the log. Audited as a `restore` event."""
    if not (reason and reason.strip()) or not (actor and actor.strip()):
        raise ManifestError("restoring the holdout manifest needs a non-empty --reason and --actor")
    path = Path(path)
    events = fetch(con, "SELECT * FROM holdout_manifest_log ORDER BY seq")
    locks = [e for e in events if e["event"] in ("lock", "adopt")]
    if not locks:
        raise ManifestError("the warehouse records no locked holdout: nothing to restore")
    lock = locks[-1]
    rows = fetch(con, "SELECT * FROM holdout_manifest WHERE version = ?", [lock["version"]])
    if not rows:
        raise ManifestError(f"the holdout_manifest table has no rows of the recorded version {lock['version']}: "
                            f"nothing to restore from")
    m = manifest_from_rows(rows)
    if m.sha256 != lock["manifest_sha256"]:
        raise ManifestError("holdout_manifest table rows differ from the sha256 recorded in holdout_manifest_log "
                            "(rows edited?): they cannot restore the file")
    audit = tuple({"action": "unlock", "version": e["version"], "manifest_sha256": e["manifest_sha256"],
                   "actor": e["actor"], "reason": e["reason"], "at": str(e["event_at"])}
                  for e in events if e["event"] == "unlock" and e["version"] == m.version)
    from dataclasses import replace as dc_replace

    m = dc_replace(m, audit=audit)
    with transaction(con):
        row = log_event(con, "restore", m, path, actor=actor.strip(), reason=reason.strip(), at=now)
        save_manifest(m, path)
    holdout_state(con, path)   # what every later reader does: it must verify now
    return m, row


def check_holdout_unmoved(manifest: HoldoutManifest, held: Iterable[str], present: Iterable[str], what: str) -> list[str]:
    """The one test that a set of holdout assignments matches the locked manifest: every manifest
    task still in the suite is held out and nothing else is. Raises ManifestError naming what
    moved; returns the manifest tasks missing from the suite (a warning, not a move)."""
    held, present, locked = set(held), set(present), set(manifest.task_ids)
    left, entered = (locked & present) - held, held - locked
    if left or entered:
        raise ManifestError(f"{what} would move the locked holdout {manifest.sha256[:12]}...: {len(left)} manifest "
                            f"tasks left it, {len(entered)} tasks entered it (e.g. {sorted(left or entered)[:3]})")
    return sorted(locked - present)


def lock_or_verify(con, path: str | Path, held: Iterable[str], present: Iterable[str], actor: str,
                   run_id: str | None = None) -> tuple[str, HoldoutManifest, list[str]]:
    """What the holdout_manifest asset does: adopt a manifest file the warehouse has no record of,
    then verify the locked holdout against the split's holdout tasks (logged as `verify`), or lock
    those tasks on the first clean run. Returns (event, manifest, warnings)."""
    held, present = sorted(set(held)), set(present)
    state = holdout_state(con, path)
    notes = []
    if state.needs_adoption:
        notes.append(f"adopting holdout manifest {path}: the warehouse had no record of it")
        adopt_holdout(con, state, actor=actor, run_id=run_id)
    if state.locked:
        check_holdout_unmoved(state.manifest, held, present, what="split_assignments")
        log_event(con, "verify", state.manifest, path, actor=actor, run_id=run_id)
        return "verified", state.manifest, notes
    if not held:
        raise ManifestError("refusing to lock an empty holdout: split_assignments put no task in holdout "
                            "(too few tasks or clusters for the targets?)")
    return "locked", lock_holdout(con, path, held, locked_by=actor, previous=state.manifest, run_id=run_id), notes
