"""Consent / training rights. Execution access is not training permission.

A trajectory enters tenant T's training view only if, checked in this order (first failure
is the audited reason):
  missing_consent   the trajectory has no consent_id
  unknown_consent   the consent_id is not in the registry
  tenant_mismatch   the grant belongs to another tenant than the trajectory
  cross_tenant      the trajectory is another tenant's, and its grant does not list T in
                    `cross_tenant_train_for` (sharing is explicit, never implied)
  revoked           the grant has revoked_at <= now
  no_train_scope    the grant's scopes lack "train" (e.g. execute/eval only)
  expired           now > ended_at + retention_days. Retention runs from the trajectory's
                    ended_at (started_at if missing), not from granted_at: it bounds how long
                    *that data* may be kept, and a long-lived grant must not let old data
                    live forever. No timestamp at all counts as expired (unprovable).
Grant registry (YAML list/`grants:` mapping, or CSV): consent_id, tenant_id, scopes (list or
"a;b"/"a,b"/"a|b"), retention_days, granted_at, revoked_at (nullable),
cross_tenant_train_for (optional list). Rows of `consent_grants` = `grant_rows(grants)`.
consent_audit rows: record_id, trajectory_id, tenant_id, consent_id, target_tenant, reason,
detail, evaluated_at (only excluded trajectories; the view holds the included ones).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from ratchet.contract import utc_from_iso

from .clusters import rows_of

REASONS = ("missing_consent", "unknown_consent", "tenant_mismatch", "cross_tenant", "revoked", "no_train_scope", "expired")


def _ts(v: Any) -> datetime | None:
    """A registry or trajectory time as aware UTC (naive is UTC); None when absent."""
    if v is None or v == "":
        return None
    return utc_from_iso(v if isinstance(v, datetime) else str(v))


def _list(v: Any) -> tuple[str, ...]:
    if v is None or v == "":
        return ()
    if isinstance(v, str):
        for sep in (";", "|", ","):
            if sep in v:
                return tuple(x.strip() for x in v.split(sep) if x.strip())
        return (v.strip(),)
    return tuple(str(x) for x in v)


@dataclass(frozen=True)
class Grant:
    consent_id: str
    tenant_id: str
    scopes: tuple[str, ...]
    retention_days: int
    granted_at: datetime
    revoked_at: datetime | None = None
    cross_tenant_train_for: tuple[str, ...] = field(default=())

    @classmethod
    def from_row(cls, r: Mapping) -> "Grant":
        return cls(
            consent_id=str(r["consent_id"]), tenant_id=str(r["tenant_id"]), scopes=_list(r.get("scopes")),
            retention_days=int(r["retention_days"]), granted_at=_ts(r["granted_at"]),
            revoked_at=_ts(r.get("revoked_at")), cross_tenant_train_for=_list(r.get("cross_tenant_train_for")),
        )


def load_grants(path: str | Path) -> dict[str, Grant]:
    """consent_id -> Grant from a YAML or CSV registry file."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(path.read_text()) or []
        rows = data.get("grants", []) if isinstance(data, dict) else data
    else:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    return grants_from_rows(rows)


def read_registry(path: str | Path, allow_missing: bool = False) -> dict[str, Grant]:
    """The registry the consent_grants asset loads: a clear error for a malformed file, and for a
    missing one unless `allow_missing` (then no grants: every trajectory is excluded)."""
    path = Path(path)
    if not path.exists():
        if allow_missing:
            return {}
        raise FileNotFoundError(
            f"consent registry not found at {path}. Create it (YAML list of grants with consent_id, tenant_id, "
            f"scopes, retention_days, granted_at, revoked_at) or set allow_missing: true to run with no grants.")
    try:
        return load_grants(path)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"consent registry {path} is malformed: {type(e).__name__}: {e}") from e


def grants_from_rows(rows: Iterable[Mapping]) -> dict[str, Grant]:
    out: dict[str, Grant] = {}
    for r in rows_of(rows):
        g = Grant.from_row(r)
        if g.consent_id in out:
            raise ValueError(f"duplicate consent_id {g.consent_id} in the grant registry")
        out[g.consent_id] = g
    return out


def grant_rows(grants: Mapping[str, Grant]) -> list[dict]:
    """consent_grants rows: consent_id, tenant_id, scopes (list[str]), retention_days,
    granted_at, revoked_at (datetime UTC or None), cross_tenant_train_for (list[str])."""
    return [
        {"consent_id": g.consent_id, "tenant_id": g.tenant_id, "scopes": list(g.scopes), "retention_days": g.retention_days,
         "granted_at": g.granted_at, "revoked_at": g.revoked_at, "cross_tenant_train_for": list(g.cross_tenant_train_for)}
        for g in sorted(grants.values(), key=lambda g: g.consent_id)
    ]


def revoke(grants: Mapping[str, Grant], consent_id: str, at: datetime | None = None) -> dict[str, Grant]:
    if consent_id not in grants:
        raise KeyError(f"unknown consent_id {consent_id}")
    out = dict(grants)
    out[consent_id] = replace(grants[consent_id], revoked_at=at or datetime.now(timezone.utc))
    return out


def decide(t: Mapping, grants: Mapping[str, Grant], now: datetime, tenant: str) -> tuple[str | None, str]:
    """(reason, detail) for one trajectory; reason None means it may train tenant's policy."""
    cid = t.get("consent_id")
    if not cid:
        return "missing_consent", "trajectory has no consent_id"
    g = grants.get(cid)
    if g is None:
        return "unknown_consent", f"{cid} is not in the grant registry"
    owner = t.get("tenant_id")
    if owner != g.tenant_id:
        return "tenant_mismatch", f"grant {cid} belongs to {g.tenant_id}, trajectory to {owner}"
    if owner != tenant and tenant not in g.cross_tenant_train_for:
        return "cross_tenant", f"trajectory of {owner}; grant {cid} does not share it with {tenant}"
    if g.revoked_at is not None and g.revoked_at <= now:
        return "revoked", f"grant {cid} revoked at {g.revoked_at.isoformat()}"
    if "train" not in g.scopes:
        return "no_train_scope", f"grant {cid} scopes {list(g.scopes)}"
    end = _ts(t.get("ended_at")) or _ts(t.get("started_at"))
    if end is None:
        return "expired", "no timestamp: retention cannot be proven"
    if now > end + timedelta(days=g.retention_days):
        return "expired", f"ended {end.isoformat()} + {g.retention_days}d < now"
    return None, ""


def training_view(trajectories: Any, grants: Mapping[str, Grant], now: datetime, tenant: str) -> tuple[list[dict], list[dict]]:
    """(view, audit): the trajectories that may train `tenant`'s policy at `now`, and one
    consent_audit row per excluded trajectory."""
    now = _ts(now)
    view, audit = [], []
    stamp = now.isoformat()
    for t in rows_of(trajectories):
        reason, detail = decide(t, grants, now, tenant)
        if reason is None:
            view.append(t)
        else:
            audit.append({
                "record_id": t.get("record_id"), "trajectory_id": t.get("trajectory_id"), "tenant_id": t.get("tenant_id"),
                "consent_id": t.get("consent_id"), "target_tenant": tenant, "reason": reason, "detail": detail,
                "evaluated_at": stamp,
            })
    return view, audit


def checkpoints_to_flag(revoked_consent_ids: Iterable[str], checkpoint_registry: Any, trajectories: Any = None) -> list[dict]:
    """Checkpoints trained on data under a revoked grant.
    checkpoint_registry: {checkpoint_id: {"record_ids": [...], "consent_ids": [...]}} or rows
    (checkpoint_id, record_id, consent_id). Record ids are mapped to consent ids through
    `trajectories` (record_id, consent_id) when given. Returns rows
    (checkpoint_id, consent_id, n_records, reason="trained_on_revoked_consent")."""
    revoked = set(revoked_consent_ids)
    consent_of = {t["record_id"]: t.get("consent_id") for t in rows_of(trajectories)} if trajectories is not None else {}
    used: dict[str, dict[str, set]] = {}
    if isinstance(checkpoint_registry, Mapping):
        for ck, entry in checkpoint_registry.items():
            u = used.setdefault(str(ck), {})
            for cid in entry.get("consent_ids", ()):
                u.setdefault(cid, set())
            for rid in entry.get("record_ids", ()):
                cid = consent_of.get(rid)
                if cid:
                    u.setdefault(cid, set()).add(rid)
    else:
        for r in rows_of(checkpoint_registry):
            cid = r.get("consent_id") or consent_of.get(r.get("record_id"))
            s = used.setdefault(str(r["checkpoint_id"]), {}).setdefault(cid, set())
            if r.get("record_id"):
                s.add(r["record_id"])
    return [
        {"checkpoint_id": ck, "consent_id": cid, "n_records": len(rids), "reason": "trained_on_revoked_consent"}
        for ck in sorted(used) for cid, rids in sorted(used[ck].items(), key=lambda x: str(x[0])) if cid in revoked
    ]
