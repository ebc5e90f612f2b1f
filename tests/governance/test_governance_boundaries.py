"""Boundaries of the consent and holdout rules, each written from a mutant that survived
`make mutation` on ratchet/governance: a revocation at the very instant of the decision, the last
instant of retention, a whitespace-only unlock reason or actor, a manifest file written without
its `locked` key, a missing consent registry."""
import json
from datetime import datetime, timedelta, timezone

import pytest

from ratchet.governance.consent import Grant, decide, read_registry
from ratchet.governance.manifest import ManifestError, create_manifest, load_manifest, save_manifest, unlock

pytestmark = pytest.mark.governance

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def _grant(**kw):
    base = dict(consent_id="C1", tenant_id="acme", scopes=("train",), retention_days=30,
                granted_at=NOW - timedelta(days=100))
    return {"C1": Grant(**{**base, **kw})}


def _traj(ended_at):
    return {"consent_id": "C1", "tenant_id": "acme", "ended_at": ended_at.isoformat()}


def test_a_grant_revoked_at_the_decision_instant_is_revoked():
    assert decide(_traj(NOW - timedelta(days=1)), _grant(revoked_at=NOW), NOW, "acme")[0] == "revoked"
    assert decide(_traj(NOW - timedelta(days=1)), _grant(revoked_at=NOW + timedelta(seconds=1)), NOW, "acme")[0] is None


def test_retention_holds_through_its_last_instant_and_expires_after():
    last = NOW - timedelta(days=30)          # ended exactly retention_days ago
    assert decide(_traj(last), _grant(), NOW, "acme")[0] is None
    assert decide(_traj(last - timedelta(seconds=1)), _grant(), NOW, "acme")[0] == "expired"


@pytest.mark.parametrize("reason, actor", [("   ", "lead"), ("audit", "  "), ("", "lead"), ("audit", None)])
def test_unlock_refuses_a_blank_reason_or_actor(reason, actor):
    m = create_manifest(["t1", "t2"], locked_by="lead")
    with pytest.raises(ManifestError, match="non-empty reason and actor"):
        unlock(m, reason, actor)
    assert unlock(m, "audit", "lead")[0].locked is False


def test_a_manifest_file_without_a_locked_key_reads_as_locked(tmp_path):
    path = save_manifest(create_manifest(["t1", "t2"], locked_by="lead"), tmp_path / "m.json")
    d = json.loads(path.read_text())
    del d["locked"]
    path.write_text(json.dumps(d))
    assert load_manifest(path).locked is True


def test_a_missing_registry_is_an_error_unless_allowed(tmp_path):
    with pytest.raises(FileNotFoundError, match="consent registry not found"):
        read_registry(tmp_path / "none.yaml")
    assert read_registry(tmp_path / "none.yaml", allow_missing=True) == {}
    (tmp_path / "r.yaml").write_text("- {consent_id: C1, tenant_id: acme, scopes: [train], retention_days: 30, "
                                     "granted_at: '2026-01-01T00:00:00Z'}\n")
    assert set(read_registry(tmp_path / "r.yaml")) == {"C1"}
