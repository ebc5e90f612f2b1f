"""The consent registry as the consent_grants asset reads it, and the audit's reason vocabulary."""
from datetime import datetime, timedelta, timezone

import pytest

from ratchet.governance.consent import REASONS, Grant, decide, read_registry, training_view

pytestmark = pytest.mark.governance
NOW = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
ROW = "{consent_id: C1, tenant_id: acme, scopes: [train], retention_days: 90, granted_at: '2026-09-01T00:00:00Z'}"


def test_a_missing_registry_is_an_error_unless_allowed(tmp_path):
    path = tmp_path / "nope" / "grants.yaml"
    with pytest.raises(FileNotFoundError, match="consent registry not found at .*grants.yaml"):
        read_registry(path)
    with pytest.raises(FileNotFoundError):
        read_registry(str(path))
    assert read_registry(path, allow_missing=True) == {}


def test_a_registry_is_read_whole_and_a_malformed_one_names_the_file(tmp_path):
    good = tmp_path / "grants.yaml"
    good.write_text(f"grants:\n  - {ROW}\n")
    assert list(read_registry(good, allow_missing=True)) == ["C1"]   # a file that exists is read
    bad = tmp_path / "bad.yaml"
    bad.write_text("grants:\n  - {consent_id: C1, tenant_id: acme, scopes: [train], granted_at: '2026-09-01'}\n")
    with pytest.raises(ValueError, match=r"bad.yaml is malformed: KeyError: 'retention_days'"):
        read_registry(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text(f"- {ROW}\n- {ROW}\n")
    with pytest.raises(ValueError, match="duplicate consent_id C1"):
        read_registry(dup)


def _t(rid, tenant, consent, ended):
    return {"record_id": rid, "trajectory_id": rid, "tenant_id": tenant, "consent_id": consent, "ended_at": ended}


def test_every_documented_reason_is_one_the_audit_writes():
    """REASONS is the audit's vocabulary (analysts filter on it): each exclusion case writes one of
    them, and together the cases write all of them."""
    day = timedelta(days=1)
    grants = {
        "ok": Grant("ok", "acme", ("train",), 30, NOW - 60 * day),
        "exe": Grant("exe", "acme", ("execute",), 30, NOW - 60 * day),
        "rev": Grant("rev", "acme", ("train",), 30, NOW - 60 * day, revoked_at=NOW - day),
        "glx": Grant("glx", "globex", ("train",), 30, NOW - 60 * day),
    }
    trajs = [_t("missing", "acme", None, NOW), _t("unknown", "acme", "nope", NOW), _t("mismatch", "globex", "ok", NOW),
             _t("cross", "globex", "glx", NOW), _t("revoked", "acme", "rev", NOW), _t("scope", "acme", "exe", NOW),
             _t("expired", "acme", "ok", NOW - 31 * day)]
    view, audit = training_view(trajs, grants, NOW, "acme")
    assert view == []
    assert [a["reason"] for a in audit] == list(REASONS)


def test_a_grant_built_without_sharing_shares_with_no_one():
    g = Grant("c", "initech", ("train",), 30, NOW - timedelta(days=5))
    t = _t("r", "initech", "c", NOW - timedelta(days=1))
    assert decide(t, {"c": g}, NOW, "acme")[0] == "cross_tenant"
    assert decide(t, {"c": g}, NOW, "initech") == (None, "")


def test_revocation_and_retention_take_effect_at_their_exact_instant():
    """A grant revoked at `now` is revoked (revoked_at <= now); data is kept through the last
    instant of its retention (expired only when now > ended_at + retention_days)."""
    g = Grant("c", "acme", ("train",), 30, NOW - timedelta(days=60))
    at_revocation = {"c": Grant("c", "acme", ("train",), 30, NOW - timedelta(days=60), revoked_at=NOW)}
    fresh = _t("r", "acme", "c", NOW - timedelta(days=1))
    assert decide(fresh, at_revocation, NOW, "acme")[0] == "revoked"
    assert decide(fresh, at_revocation, NOW - timedelta(microseconds=1), "acme") == (None, "")
    edge = _t("e", "acme", "c", NOW - timedelta(days=30))
    assert decide(edge, {"c": g}, NOW, "acme") == (None, "")
    assert decide(edge, {"c": g}, NOW + timedelta(microseconds=1), "acme")[0] == "expired"


def test_checkpoint_flags_list_each_revoked_consent_in_id_order():
    from ratchet.governance.consent import checkpoints_to_flag

    registry = {"ck": {"consent_ids": ["C-b", "C-a", "C-keep"]}}
    rows = checkpoints_to_flag(["C-b", "C-a"], registry)
    assert [(r["checkpoint_id"], r["consent_id"]) for r in rows] == [("ck", "C-a"), ("ck", "C-b")]
