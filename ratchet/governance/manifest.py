"""The locked holdout manifest: sorted task ids + sha256 over them.

Once locked, the holdout never changes: `splits.assign_splits` keeps every manifest task in
holdout and adds none. Changing it takes an explicit, audited `unlock(reason, actor)` and a
new manifest with a higher version.

Warehouse rows (`manifest_rows`), table holdout_manifest, one row per task:
  version (int), task_id (str), manifest_sha256 (str), created_at (str, ISO-8601 UTC),
  locked_by (str), locked (bool)
Audit rows (`unlock` returns one; also kept in the manifest JSON under "audit"):
  action, version, manifest_sha256, actor, reason, at
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence


class ManifestError(Exception):
    """The holdout manifest is missing, malformed, tampered with or used without authority."""


def holdout_sha256(task_ids: Iterable[str]) -> str:
    """sha256 over the sorted, de-duplicated ids joined by newlines (UTF-8)."""
    return hashlib.sha256("\n".join(sorted(set(map(str, task_ids)))).encode()).hexdigest()


def _now(now: datetime | None) -> str:
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat()


@dataclass(frozen=True)
class HoldoutManifest:
    version: int
    task_ids: tuple[str, ...]
    sha256: str
    created_at: str
    locked_by: str
    locked: bool = True
    audit: tuple[dict, ...] = field(default=())

    def to_json(self) -> str:
        d = asdict(self)
        d["task_ids"] = list(self.task_ids)
        d["audit"] = list(self.audit)
        return json.dumps(d, indent=2, sort_keys=True)


def create_manifest(task_ids: Iterable[str], locked_by: str, now: datetime | None = None, version: int = 1) -> HoldoutManifest:
    if not locked_by:
        raise ManifestError("locked_by is required")
    ids = tuple(sorted(set(map(str, task_ids))))
    if not ids:
        raise ManifestError("refusing to lock an empty holdout")
    return HoldoutManifest(version, ids, holdout_sha256(ids), _now(now), locked_by, True)


def verify_manifest(m: HoldoutManifest, expected_sha256: str | None = None, expected_ids: Sequence[str] | None = None) -> HoldoutManifest:
    """Recompute the hash and check it; `expected_sha256` is the value recorded elsewhere (the
    warehouse), which catches a file whose ids and hash were both rewritten."""
    if m is None:
        raise ManifestError("holdout manifest expected but missing")
    ids = list(m.task_ids)
    if not ids:
        raise ManifestError("holdout manifest lists no tasks")
    if ids != sorted(set(ids)):
        raise ManifestError("holdout manifest ids are not sorted and unique (edited by hand?)")
    actual = holdout_sha256(ids)
    if actual != m.sha256:
        raise ManifestError(f"holdout manifest tampered: sha256 of its {len(ids)} ids is {actual[:12]}..., manifest says {m.sha256[:12]}...")
    if expected_sha256 is not None and expected_sha256 != m.sha256:
        raise ManifestError(f"holdout manifest sha256 {m.sha256[:12]}... differs from the recorded {expected_sha256[:12]}...")
    if expected_ids is not None and holdout_sha256(expected_ids) != m.sha256:
        raise ManifestError("holdout manifest ids differ from the expected holdout ids")
    return m


def save_manifest(m: HoldoutManifest, path: str | Path) -> Path:
    verify_manifest(m)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(m.to_json() + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a manifest
    return path


def load_manifest(path: str | Path, required: bool = True, expected_sha256: str | None = None) -> HoldoutManifest | None:
    """Load and verify. A missing file raises ManifestError when `required` (i.e. a holdout
    was locked before: the warehouse has manifest rows), else returns None."""
    path = Path(path)
    if not path.exists():
        if required:
            raise ManifestError(f"holdout manifest expected at {path} but missing")
        return None
    try:
        d = json.loads(path.read_text())
        m = HoldoutManifest(
            version=int(d["version"]), task_ids=tuple(d["task_ids"]), sha256=str(d["sha256"]),
            created_at=str(d["created_at"]), locked_by=str(d["locked_by"]), locked=bool(d.get("locked", True)),
            audit=tuple(d.get("audit", ())),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise ManifestError(f"holdout manifest at {path} is malformed: {err}") from err
    return verify_manifest(m, expected_sha256=expected_sha256)


def manifest_rows(m: HoldoutManifest) -> list[dict]:
    verify_manifest(m)
    return [
        {"version": m.version, "task_id": t, "manifest_sha256": m.sha256, "created_at": m.created_at,
         "locked_by": m.locked_by, "locked": m.locked}
        for t in m.task_ids
    ]


def manifest_from_rows(rows: Iterable[dict]) -> HoldoutManifest:
    """Rebuild (and verify) the newest manifest version from holdout_manifest rows."""
    rows = list(rows)
    if not rows:
        raise ManifestError("no holdout_manifest rows")
    v = max(int(r["version"]) for r in rows)
    rows = [r for r in rows if int(r["version"]) == v]
    heads = {(r["manifest_sha256"], str(r["created_at"]), r["locked_by"], bool(r["locked"])) for r in rows}
    if len(heads) != 1:
        raise ManifestError(f"holdout_manifest rows of version {v} disagree on their header")
    sha, created, by, locked = heads.pop()
    ids = tuple(sorted(str(r["task_id"]) for r in rows))
    return verify_manifest(HoldoutManifest(v, ids, sha, created, by, locked))


def unlock(m: HoldoutManifest, reason: str, actor: str, now: datetime | None = None) -> tuple[HoldoutManifest, dict]:
    """The only way to unfreeze a holdout: needs a reason and an actor, returns the unlocked
    manifest (audit appended) and the audit row to persist."""
    verify_manifest(m)
    if not (reason and reason.strip()) or not (actor and actor.strip()):
        raise ManifestError("unlocking the holdout needs a non-empty reason and actor")
    if not m.locked:
        raise ManifestError("holdout manifest is already unlocked")
    row = {"action": "unlock", "version": m.version, "manifest_sha256": m.sha256, "actor": actor, "reason": reason, "at": _now(now)}
    return replace(m, locked=False, audit=m.audit + (row,)), row
