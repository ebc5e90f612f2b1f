"""Boundaries of the consent and holdout rules, each written from a mutant that survived
`make mutation` on ratchet/governance: a revocation at the very instant of the decision, the last
instant of retention, a whitespace-only unlock reason or actor, a manifest file written without
its `locked` key, a missing consent registry."""
import json
from datetime import datetime, timedelta, timezone

import pytest

from ratchet.governance.consent import Grant, decide, read_registry
from ratchet.governance.manifest import ManifestError, create_manifest, load_manifest, save_manifest, unlock
from ratchet.governance.splits import governed_splits

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


# ------------------------------------------------------------------------ split rules (splits.py)
def test_a_split_missing_from_the_targets_gets_nothing():
    from ratchet.governance.splits import split_targets

    assert split_targets(5, {"train": 7, "val": 2}) == {"train": 4, "val": 1, "holdout": 0}
    assert split_targets(3, {"train": 2, "val": 2}) == {"train": 2, "val": 1, "holdout": 0}
    m = create_manifest(["t0"], locked_by="lead")  # locked: train and val share the rest, val by its target
    from ratchet.governance.splits import assign_splits
    items = [{"id": f"t{i}", "cluster_id": f"c{i}", "slice": None} for i in range(6)]
    got = assign_splits(items, targets={"train": 5, "holdout": 1}, manifest=m)
    assert sorted(got.column("split").to_pylist()) == ["holdout", *["train"] * 5]


def test_an_exact_tie_goes_to_train_then_val_never_holdout_first():
    from ratchet.governance.splits import _order, assign_splits

    items = [{"id": f"t{i}", "cluster_id": f"c{i}", "slice": None} for i in range(3)]
    got = {r["cluster_id"]: r["split"] for r in assign_splits(items, targets={"train": 1, "val": 1, "holdout": 1}).to_pylist()}
    first, second, third = sorted(got, key=lambda c: _order(c, 0))   # the order clusters are decided in
    assert (got[first], got[second], got[third]) == ("train", "val", "holdout")


def test_trajectory_only_clusters_share_train_and_val_in_the_targets_ratio():
    items = [{"id": f"traj:r{i}", "kind": "trajectory", "cluster_id": f"c{i}", "slice": "acme", "tenant_id": "acme"}
             for i in range(100)]
    for targets, val in (({"train": 4, "val": 4, "holdout": 3}, 50), ({"train": 3, "val": 1, "holdout": 0}, 25)):
        rows = governed_splits(items, targets)
        assert sum(r["split"] == "val" for r in rows) == val and {r["split"] for r in rows} == {"train", "val"}


# ------------------------------------------------------------- training views (training_views.py)
def test_every_tenant_with_trajectories_or_grants_gets_its_consent_audit():
    """The policy tenants are those owning trajectories, holding grants or named by a grant's
    cross-tenant share: a tenant whose trajectories have no grant still gets one audit row per
    excluded trajectory, each stamped with its split and the decision time."""
    from ratchet.governance.training_views import training_rows

    grants = _grant(cross_tenant_train_for=("initech",))
    trajs = [{"record_id": "r1", "trajectory_id": "t1", "tenant_id": "acme", "consent_id": "C1",
              "ended_at": (NOW - timedelta(days=1)).isoformat()},
             {"record_id": "r2", "trajectory_id": "t2", "tenant_id": "globex", "consent_id": "C-none",
              "ended_at": (NOW - timedelta(days=1)).isoformat()}]
    split_of = {"r1": {"split": "train", "cluster_id": "c1"}, "r2": {"split": "val", "cluster_id": "c2"}}
    train, audit = training_rows(trajs, grants, split_of, NOW)
    assert sorted((r["tenant_id"], r["record_id"]) for r in train) == [("acme", "r1"), ("initech", "r1")]
    globex = [a for a in audit if a["target_tenant"] == "globex"]
    assert {(a["record_id"], a["reason"], a["split"]) for a in globex} == {("r1", "cross_tenant", "train"),
                                                                         ("r2", "unknown_consent", "val")}
    assert all(a["evaluated_at"] == NOW for a in audit)
