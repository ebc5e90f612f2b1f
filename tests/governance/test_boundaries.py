"""Boundaries and defaults of the governance rules that mutation testing found unpinned: each test
fails if one comparison or one default flips (a revoked-at-this-instant grant, the last retained
second, a missing registry or manifest, a manifest file without a `locked` key, an unlock without
a reason or actor)."""
import json
from datetime import datetime, timedelta, timezone

import pytest

from ratchet.governance.consent import Grant, decide, read_registry
from ratchet.governance.manifest import ManifestError, create_manifest, load_manifest, save_manifest, unlock

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def _grant(**kw) -> Grant:
    return Grant(**{"consent_id": "C-1", "tenant_id": "acme", "scopes": ("train",), "retention_days": 30,
                    "granted_at": NOW - timedelta(days=100), **kw})


def _traj(ended_at) -> dict:
    return {"consent_id": "C-1", "tenant_id": "acme", "ended_at": ended_at.isoformat()}


def test_a_grant_revoked_at_this_instant_is_revoked():
    assert decide(_traj(NOW - timedelta(days=1)), {"C-1": _grant(revoked_at=NOW)}, NOW, "acme")[0] == "revoked"
    later = _grant(revoked_at=NOW + timedelta(seconds=1))           # revoked from a later time: not yet
    assert decide(_traj(NOW - timedelta(days=1)), {"C-1": later}, NOW, "acme") == (None, "")


def test_a_loaded_grant_cannot_be_revoked_or_widened_in_place():
    """A grant is a record of the registry as read: code that holds one cannot clear its
    revocation or add a scope; a change goes through the registry file and a new read."""
    import dataclasses

    g = _grant(revoked_at=NOW)
    for field, value in (("revoked_at", None), ("scopes", ("train", "eval"))):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(g, field, value)
    assert g.revoked_at == NOW and g.scopes == ("train",)


def test_retention_holds_to_its_last_instant_and_not_a_second_more():
    g = {"C-1": _grant(retention_days=30)}
    assert decide(_traj(NOW - timedelta(days=30)), g, NOW, "acme") == (None, "")
    assert decide(_traj(NOW - timedelta(days=30, seconds=1)), g, NOW, "acme")[0] == "expired"


def test_a_missing_consent_registry_is_an_error_unless_allowed(tmp_path):
    with pytest.raises(FileNotFoundError, match="consent registry not found"):
        read_registry(tmp_path / "grants.yaml")
    assert read_registry(tmp_path / "grants.yaml", allow_missing=True) == {}


def test_a_missing_manifest_is_an_error_unless_not_required(tmp_path):
    with pytest.raises(ManifestError, match="missing"):
        load_manifest(tmp_path / "holdout.json")
    assert load_manifest(tmp_path / "holdout.json", required=False) is None


def test_a_manifest_file_without_a_locked_key_reads_as_locked(tmp_path):
    """Older files had no `locked` field: every one of them was a lock, never an open holdout."""
    path = save_manifest(create_manifest(["t1", "t2"], locked_by="ci", now=NOW), tmp_path / "holdout.json")
    d = json.loads(path.read_text())
    del d["locked"]
    path.write_text(json.dumps(d))
    assert load_manifest(path).locked is True


@pytest.mark.parametrize("reason,actor", [("", "ann"), ("   ", "ann"), ("moved suite", ""), ("moved suite", "  "),
                                          (None, "ann"), ("moved suite", None)])
def test_an_unlock_needs_both_a_reason_and_an_actor(reason, actor):
    m = create_manifest(["t1"], locked_by="ci", now=NOW)
    with pytest.raises(ManifestError, match="non-empty reason and actor"):
        unlock(m, reason, actor)
    assert unlock(m, "moved suite", "ann")[0].locked is False
