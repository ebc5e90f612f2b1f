from datetime import datetime, timedelta, timezone

import pytest

from ratchet.governance.consent import (checkpoints_to_flag, grant_rows, load_grants, revoke, training_view)

pytestmark = pytest.mark.governance
NOW = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)

YAML = """
grants:
  - {consent_id: CONSENT-TRN-2026-09, tenant_id: acme, scopes: [execute, train, eval], retention_days: 90, granted_at: "2026-09-01T00:00:00Z"}
  - {consent_id: CONSENT-EXE-ACME, tenant_id: acme, scopes: [execute, eval], retention_days: 90, granted_at: "2026-09-01T00:00:00Z"}
  - {consent_id: CONSENT-REV, tenant_id: acme, scopes: [train], retention_days: 90, granted_at: "2026-09-01T00:00:00Z", revoked_at: "2026-10-15T00:00:00Z"}
  - {consent_id: CONSENT-GLOBEX, tenant_id: globex, scopes: [train], retention_days: 90, granted_at: "2026-09-01T00:00:00Z"}
  - {consent_id: CONSENT-INITECH-SHARE, tenant_id: initech, scopes: [train], retention_days: 30, granted_at: "2026-09-01T00:00:00Z", cross_tenant_train_for: [acme]}
"""


def _t(rid, tenant, consent, days_ago):
    end = NOW - timedelta(days=days_ago)
    return {"record_id": rid, "trajectory_id": rid, "tenant_id": tenant, "consent_id": consent,
            "started_at": end - timedelta(minutes=3), "ended_at": end}


@pytest.fixture
def grants(tmp_path):
    p = tmp_path / "grants.yaml"
    p.write_text(YAML)
    return load_grants(p)


def test_training_view_excludes_each_case_with_its_reason(grants):
    trajs = [
        _t("ok", "acme", "CONSENT-TRN-2026-09", 10),
        _t("missing", "acme", None, 10),
        _t("unknown", "acme", "CONSENT-NOPE", 10),
        _t("expired", "acme", "CONSENT-TRN-2026-09", 91),
        _t("revoked", "acme", "CONSENT-REV", 10),
        _t("exec_only", "acme", "CONSENT-EXE-ACME", 10),
        _t("cross", "globex", "CONSENT-GLOBEX", 10),
        _t("mismatch", "globex", "CONSENT-TRN-2026-09", 10),
        _t("shared", "initech", "CONSENT-INITECH-SHARE", 10),
        _t("shared_expired", "initech", "CONSENT-INITECH-SHARE", 31),
    ]
    view, audit = training_view(trajs, grants, NOW, tenant="acme")
    assert sorted(t["record_id"] for t in view) == ["ok", "shared"]
    assert {a["record_id"]: a["reason"] for a in audit} == {
        "missing": "missing_consent", "unknown": "unknown_consent", "expired": "expired", "revoked": "revoked",
        "exec_only": "no_train_scope", "cross": "cross_tenant", "mismatch": "tenant_mismatch",
        "shared_expired": "expired",
    }
    assert all(a["target_tenant"] == "acme" and a["evaluated_at"] for a in audit)
    # globex's own view holds its data only; acme's sharing grant is not reciprocal
    gview, _ = training_view(trajs, grants, NOW, tenant="globex")
    assert [t["record_id"] for t in gview] == ["cross"]


def test_csv_registry_and_revocation_before_it_takes_effect(tmp_path):
    p = tmp_path / "grants.csv"
    p.write_text("consent_id,tenant_id,scopes,retention_days,granted_at,revoked_at\n"
                 "C1,acme,execute;train,90,2026-09-01T00:00:00Z,\n"
                 "C2,acme,train,90,2026-09-01T00:00:00Z,2026-12-01T00:00:00Z\n")
    g = load_grants(p)
    assert g["C1"].scopes == ("execute", "train") and g["C1"].revoked_at is None
    view, audit = training_view([_t("a", "acme", "C2", 1)], g, NOW, "acme")
    assert len(view) == 1 and not audit  # revocation dated in the future is not yet in force
    assert grant_rows(g)[0]["consent_id"] == "C1"


def test_revocation_purges_training_view_and_flags_checkpoints(grants):
    trajs = [_t("r1", "acme", "CONSENT-TRN-2026-09", 5), _t("r2", "acme", "CONSENT-TRN-2026-09", 6),
             _t("r3", "initech", "CONSENT-INITECH-SHARE", 5)]
    registry = {"ckpt-sft-1": {"record_ids": ["r1", "r3"]}, "ckpt-rl-2": {"record_ids": ["r3"]},
                "ckpt-old": {"consent_ids": ["CONSENT-REV"]}}
    g2 = revoke(grants, "CONSENT-TRN-2026-09", at=NOW - timedelta(hours=1))
    view, audit = training_view(trajs, g2, NOW, "acme")
    assert [t["record_id"] for t in view] == ["r3"] and {a["reason"] for a in audit} == {"revoked"}
    flags = checkpoints_to_flag(["CONSENT-TRN-2026-09"], registry, trajectories=trajs)
    assert flags == [{"checkpoint_id": "ckpt-sft-1", "consent_id": "CONSENT-TRN-2026-09", "n_records": 1,
                      "reason": "trained_on_revoked_consent"}]
    rows = [{"checkpoint_id": "ckpt-old", "record_id": None, "consent_id": "CONSENT-REV"}]
    assert [f["checkpoint_id"] for f in checkpoints_to_flag(["CONSENT-REV"], rows)] == ["ckpt-old"]
    assert checkpoints_to_flag(["CONSENT-GLOBEX"], registry, trajectories=trajs) == []


def test_checkpoint_rows_count_the_revoked_records_each_was_trained_on(grants):
    """The row form of the registry (checkpoint_id, record_id, consent_id): a flag counts the
    distinct records under the revoked grant, whether a row names its consent or only its record;
    and a revocation of a grant that does not exist is an error, never a silent no-op."""
    trajs = [_t("r1", "acme", "C-REV", 5), _t("r2", "acme", "C-REV", 6), _t("r3", "acme", "C-OK", 5)]
    rows = [{"checkpoint_id": "ck", "record_id": "r1", "consent_id": "C-REV"},
            {"checkpoint_id": "ck", "record_id": "r1", "consent_id": "C-REV"},     # the same record twice
            {"checkpoint_id": "ck", "record_id": "r2", "consent_id": None},        # consent through its record
            {"checkpoint_id": "ck", "record_id": "r3", "consent_id": None},
            {"checkpoint_id": "other", "record_id": "r3", "consent_id": "C-OK"}]
    assert checkpoints_to_flag(["C-REV"], rows, trajectories=trajs) == [
        {"checkpoint_id": "ck", "consent_id": "C-REV", "n_records": 2, "reason": "trained_on_revoked_consent"}]
    with pytest.raises(KeyError, match="unknown consent_id C-NONE"):
        revoke(grants, "C-NONE", at=NOW)
