"""Governance persistence: tables, idempotent writes, the holdout's recorded state, the split
composition (tasks by cluster, trajectories inherit), consent rows, the SQL re-verification and
checkpoint flags. Warehouse-level, no Dagster."""
import json
from datetime import datetime, timedelta, timezone

import pytest

from ratchet import store, tables
from ratchet.governance import checkpoints, holdout, splits, training_views
from ratchet.governance import tables as gov_tables
from ratchet.governance.consent import grants_from_rows
from ratchet.governance.manifest import (
    ManifestError,
    create_manifest,
    load_manifest,
    save_manifest,
)
from ratchet.governance.splits import EXCLUDED

pytestmark = pytest.mark.governance
NOW = datetime(2026, 11, 15, tzinfo=timezone.utc)


def _ids(con, sql):
    return [r[0] for r in con.execute(sql).fetchall()]


def test_schema_is_idempotent_and_replace_leaves_the_same_table(con):
    tables.ensure_all(con)  # twice: no error
    rows = [{"id": f"task:t{i}", "kind": "task", "source_id": f"t{i}", "cluster_id": "c", "slice": "x",
             "split": "train", "reason": "assigned"} for i in range(5)]
    for _ in range(2):
        store.replace(con, "split_assignments", rows)
    assert con.execute("SELECT count(*) FROM split_assignments").fetchall()[0][0] == 5
    assert con.execute("SELECT items FROM v_split_summary").fetchall() == [(5,)]
    cols = {r[0] for r in con.execute("DESCRIBE checkpoints").fetchall()}
    assert {"checkpoint_id", "tenant_id", "trained_record_ids", "consent_ids", "created_at", "flagged", "flag_reason"} <= cols
    for view in gov_tables.VIEWS:
        con.execute(f"SELECT * FROM {view} LIMIT 0")


def _items(n_task_clusters=30, traj_only=10):
    items = []
    for c in range(n_task_clusters):
        for k in range(3):
            items.append({"id": f"task:p{c:02d}-{k}", "kind": "task", "cluster_id": f"c{c:02d}",
                          "slice": ("arith", "cmp", "const")[c % 3], "tenant_id": None})
        items.append({"id": f"traj:r{c:02d}", "kind": "trajectory", "cluster_id": f"c{c:02d}", "slice": "acme",
                      "tenant_id": "acme"})
    for c in range(traj_only):
        items.append({"id": f"traj:o{c:02d}", "kind": "trajectory", "cluster_id": f"o{c:02d}",
                      "slice": ("acme", "globex")[c % 2], "tenant_id": ("acme", "globex")[c % 2]})
    return items


def test_governed_splits_tasks_by_cluster_and_trajectories_inherit():
    items = _items()
    rows = splits.governed_splits(items, {"train": 600, "val": 160, "holdout": 400}, seed=3)
    split = {r["id"]: r["split"] for r in rows}
    per_cluster = {}
    for i in items:
        per_cluster.setdefault(i["cluster_id"], set()).add(split[i["id"]])
    assert all(len(s) == 1 for s in per_cluster.values()), "a cluster spans two splits"
    tasks = [r for r in rows if r["kind"] == "task"]
    assert {r["split"] for r in tasks} == {"train", "val", "holdout"}
    assert sum(r["split"] == "holdout" for r in tasks) in range(27, 40)   # ~400/1160 of 90, whole clusters
    assert all(r["reason"].startswith("cluster_of_task") for r in rows if r["id"].startswith("traj:r"))
    orphans = [r for r in rows if r["id"].startswith("traj:o")]
    assert orphans and all(r["split"] in ("train", "val") for r in orphans)   # never holdout


def test_governed_splits_with_locked_manifest_freeze_the_holdout():
    items = _items()
    first = splits.governed_splits(items, {"train": 600, "val": 160, "holdout": 400}, seed=3)
    hold = sorted(r["source_id"] for r in first if r["kind"] == "task" and r["split"] == "holdout")
    m = create_manifest(hold, locked_by="test")
    # more data: new task clusters, a new task that joins a holdout cluster, new trajectories
    more = _items(45, 20)
    joined = next(i for i in items if i["id"] == f"task:{hold[0]}")["cluster_id"]
    more.append({"id": "task:newcomer", "kind": "task", "cluster_id": joined, "slice": "cmp", "tenant_id": None})
    more.append({"id": "traj:late", "kind": "trajectory", "cluster_id": joined, "slice": "acme", "tenant_id": "acme"})
    prev = {r["id"]: r["split"] for r in first}
    rows = splits.governed_splits(more, {"train": 600, "val": 160, "holdout": 400}, seed=99, manifest=m, previous=prev)
    split = {r["id"]: r for r in rows}
    assert sorted(r["source_id"] for r in rows if r["kind"] == "task" and r["split"] == "holdout") == hold
    assert split["task:newcomer"]["split"] == EXCLUDED and hold[0] in split["task:newcomer"]["reason"]
    assert split["traj:late"]["split"] == "holdout"      # a trajectory of a holdout cluster is never trained on
    assert all(split[i]["split"] == s for i, s in prev.items())   # train / val stable too


def _lock(con, path, ids=("a", "b", "c")):
    return holdout.lock_holdout(con, path, list(ids), locked_by="test")


def test_holdout_state_round_trip_and_unlock_audit(con, home):
    path = home.root / "holdout_manifest.json"
    assert holdout.holdout_state(con, path).manifest is None
    m = _lock(con, path)
    st = holdout.holdout_state(con, path)
    assert st.locked and st.recorded and st.manifest.sha256 == m.sha256
    with pytest.raises(ManifestError, match="reason"):
        holdout.unlock_holdout(con, path, reason=" ", actor="alice")
    m2, row = holdout.unlock_holdout(con, path, reason="grow the holdout", actor="alice")
    assert not m2.locked and row["actor"] == "alice" and row["reason"] == "grow the holdout"
    assert not holdout.holdout_state(con, path).locked
    assert json.loads(path.read_text())["audit"][-1]["actor"] == "alice"
    log = store.fetch(con, "SELECT event, actor, reason FROM holdout_manifest_log ORDER BY seq")
    assert log[-1] == {"event": "unlock", "actor": "alice", "reason": "grow the holdout"}
    m3 = holdout.lock_holdout(con, path, ["a", "b", "c", "d"], locked_by="test", previous=m2)
    assert m3.version == 2 and holdout.holdout_state(con, path).locked
    assert m3.audit and m3.audit[-1]["actor"] == "alice"


def test_missing_manifest_fails_when_the_warehouse_recorded_one(con, home):
    path = home.root / "holdout_manifest.json"
    _lock(con, path)
    path.unlink()
    with pytest.raises(ManifestError, match="missing"):
        holdout.holdout_state(con, path)


def test_rewritten_self_consistent_manifest_is_caught_by_the_recorded_hash(con, home):
    path = home.root / "holdout_manifest.json"
    _lock(con, path)
    forged = create_manifest(["a", "b", "x"], locked_by="mallory")
    save_manifest(forged, path)
    assert load_manifest(path).sha256 == forged.sha256          # consistent with itself
    with pytest.raises(ManifestError, match="differs from the recorded"):
        holdout.holdout_state(con, path)


def test_hand_flipped_lock_flag_and_edited_rows_are_caught(con, home):
    path = home.root / "holdout_manifest.json"
    _lock(con, path)
    d = json.loads(path.read_text())
    d["locked"] = False
    path.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="locked=False"):
        holdout.holdout_state(con, path)
    d["locked"] = True
    path.write_text(json.dumps(d))
    holdout.holdout_state(con, path)
    con.execute("UPDATE holdout_manifest SET task_id = 'zzz' WHERE task_id = 'c'")
    with pytest.raises(ManifestError):
        holdout.holdout_state(con, path)


def test_manifest_without_a_warehouse_record_is_adopted(con, home):
    path = home.root / "holdout_manifest.json"
    save_manifest(create_manifest(["a", "b"], locked_by="elsewhere"), path)
    st = holdout.holdout_state(con, path)
    assert st.needs_adoption and st.locked
    holdout.adopt_holdout(con, st, actor="test")
    st = holdout.holdout_state(con, path)
    assert st.recorded and not st.needs_adoption
    assert _ids(con, "SELECT event FROM holdout_manifest_log") == ["adopt"]


def _grants(**over):
    base = [
        {"consent_id": "G-ACME", "tenant_id": "acme", "scopes": ["execute", "train"], "retention_days": 90,
         "granted_at": "2026-09-01"},
        {"consent_id": "G-GLOBEX", "tenant_id": "globex", "scopes": ["train"], "retention_days": 90,
         "granted_at": "2026-09-01", "cross_tenant_train_for": over.get("share", [])},
    ]
    return grants_from_rows(base)


def _traj(rid, tenant, consent, ended="2026-11-10T00:00:00+00:00"):
    return {"record_id": rid, "trajectory_id": rid, "tenant_id": tenant, "consent_id": consent, "task_id": "t",
            "started_at": None, "ended_at": datetime.fromisoformat(ended), "accepted": True, "tests_passed": True}


def test_training_rows_gate_consent_then_split():
    trajs = [_traj("r1", "acme", "G-ACME"), _traj("r2", "acme", "G-ACME"), _traj("r3", "globex", "G-GLOBEX"),
             _traj("r4", "acme", "G-ACME")]
    split_of = {"r1": {"split": "train", "cluster_id": "c1"}, "r2": {"split": "val", "cluster_id": "c2"},
                "r3": {"split": "train", "cluster_id": "c3"}}
    train, audit = training_views.training_rows(trajs, _grants(), split_of, NOW)
    assert {(r["tenant_id"], r["record_id"]) for r in train} == {("acme", "r1"), ("globex", "r3")}
    why = {(a["target_tenant"], a["record_id"]): a["reason"] for a in audit}
    assert why[("acme", "r2")] == "not_train_split" and why[("acme", "r4")] == "not_train_split"
    assert why[("acme", "r3")] == "cross_tenant" and why[("globex", "r1")] == "cross_tenant"
    assert next(a for a in audit if a["record_id"] == "r4" and a["target_tenant"] == "acme")["detail"].startswith("no split")
    train, _ = training_views.training_rows(trajs, _grants(share=["acme"]), split_of, NOW)
    assert ("acme", "r3") in {(r["tenant_id"], r["record_id"]) for r in train}   # explicit sharing


def _ingest_some(wh, tmp_path, n=6):
    from ratchet.ingest import ingest
    from ratchet.synth import write_jsonl

    write_jsonl(tmp_path / "t.jsonl", n)
    ingest([tmp_path / "t.jsonl"], wh)
    return wh.query("SELECT record_id, tenant_id, consent_id FROM trajectories ORDER BY record_id").to_pylist()


def test_sql_reverification_catches_every_kind_of_bad_training_row(wh, tmp_path):
    trajs = _ingest_some(wh, tmp_path)
    acme = [t for t in trajs if t["tenant_id"] == "acme"]
    globex = [t for t in trajs if t["tenant_id"] == "globex"]
    with wh.connect() as con:
        tables.ensure_all(con)
        store.replace(con, "consent_grants", [
            {"consent_id": "CONSENT-ACME-TRN-2026-09", "tenant_id": "acme", "scopes": ["train"], "retention_days": 90,
             "granted_at": datetime(2026, 9, 1, tzinfo=timezone.utc)},
            {"consent_id": "CONSENT-GLOBEX-TRN-2026-09", "tenant_id": "globex", "scopes": ["train"], "retention_days": 90,
             "granted_at": datetime(2026, 9, 1, tzinfo=timezone.utc), "revoked_at": datetime(2026, 11, 5, tzinfo=timezone.utc)}])
        store.replace(con, "split_assignments", [
            {"id": f"traj:{t['record_id']}", "kind": "trajectory", "source_id": t["record_id"], "cluster_id": "c",
             "split": "val" if t is acme[1] else "train"} for t in trajs])

        def violations(rows):
            store.replace(con, "training_set", [{**r, "evaluated_at": NOW, "split": "train"} for r in rows])
            return {b["violation"]: b["n"] for b in store.fetch(con, training_views.TRAINING_VIOLATIONS_SQL)}

        assert violations([{"tenant_id": "acme", "record_id": acme[0]["record_id"]}]) == {}
        assert violations([{"tenant_id": "acme", "record_id": globex[0]["record_id"]}]) == {"cross_tenant": 1}
        assert violations([{"tenant_id": "globex", "record_id": globex[0]["record_id"]}]) == {"revoked": 1}
        assert violations([{"tenant_id": "acme", "record_id": acme[1]["record_id"]}]) == {"not_train_split": 1}
        assert violations([{"tenant_id": "acme", "record_id": "nope"}]) == {"unknown_record": 1}
        store.replace(con, "training_set", [{"tenant_id": "acme", "record_id": acme[0]["record_id"], "split": "train",
                                             "evaluated_at": NOW + timedelta(days=200)}])
        assert {b["violation"] for b in store.fetch(con, training_views.TRAINING_VIOLATIONS_SQL)} == {"expired"}


def test_the_gate_reads_its_inputs_from_the_warehouse_with_its_own_queries(wh, tmp_path):
    """What the `training_views` asset runs: trajectories, grants and trajectory splits read with
    the module's queries feed `training_rows`, and the stored result passes the SQL re-check."""
    trajs = _ingest_some(wh, tmp_path)
    acme = sorted(t["record_id"] for t in trajs if t["tenant_id"] == "acme")
    with wh.connect() as con:
        tables.ensure_all(con)
        store.replace(con, "consent_grants", [
            {"consent_id": "CONSENT-ACME-TRN-2026-09", "tenant_id": "acme", "scopes": ["train"], "retention_days": 90,
             "granted_at": datetime(2026, 9, 1, tzinfo=timezone.utc)}])
        store.replace(con, "split_assignments", [
            {"id": f"traj:{t['record_id']}", "kind": "trajectory", "source_id": t["record_id"], "cluster_id": "c",
             "split": "val" if t["record_id"] == acme[0] else "train"} for t in trajs]
            # a task row under a trajectory's id: only trajectory rows say where a trajectory is
            + [{"id": "task:x", "kind": "task", "source_id": acme[0], "cluster_id": "c", "split": "train"}])
        grants = grants_from_rows(store.fetch(con, training_views.GRANTS_SQL))
        rows = store.fetch(con, training_views.TRAJECTORIES_SQL)
        split_of = {r["source_id"]: r for r in store.fetch(con, training_views.SPLIT_OF_SQL)}
        assert [r["record_id"] for r in rows] == sorted(t["record_id"] for t in trajs)
        train, audit = training_views.training_rows(rows, grants, split_of, NOW, tenants=["acme"])
        assert sorted(r["record_id"] for r in train) == acme[1:]
        assert {a["reason"] for a in audit if a["record_id"] == acme[0]} == {"not_train_split"}
        store.replace(con, "training_set", train)
        assert store.fetch(con, training_views.TRAINING_VIOLATIONS_SQL) == []


def test_the_python_gate_and_the_sql_recheck_agree_at_the_boundary_instants(wh, tmp_path):
    """A grant revoked at the evaluation instant is revoked; a trajectory at exactly its retention
    end still trains, one microsecond later it has expired: in `training_rows` and in the SQL
    re-check alike (two implementations of one rule must not disagree on the instant)."""
    _ingest_some(wh, tmp_path)
    with wh.connect() as con:
        tables.ensure_all(con)
        rows = store.fetch(con, training_views.TRAJECTORIES_SQL)
        t = next(r for r in rows if r["tenant_id"] == "acme" and r["ended_at"] is not None)
        store.replace(con, "split_assignments", [{"id": f"traj:{t['record_id']}", "kind": "trajectory",
                                                  "source_id": t["record_id"], "cluster_id": "c", "split": "train"}])
        end = t["ended_at"] if t["ended_at"].tzinfo else t["ended_at"].replace(tzinfo=timezone.utc)
        us = timedelta(microseconds=1)

        def both(now, revoked_at=None):
            grant = {"consent_id": t["consent_id"], "tenant_id": "acme", "scopes": ["train"], "retention_days": 90,
                     "granted_at": end - timedelta(days=30), "revoked_at": revoked_at}
            store.replace(con, "consent_grants", [grant])
            train, audit = training_views.training_rows([t], grants_from_rows([grant]), {t["record_id"]: {"split": "train"}},
                                                        now, tenants=["acme"])
            python = audit[0]["reason"] if audit else None
            store.replace(con, "training_set", [{"tenant_id": "acme", "record_id": t["record_id"], "split": "train",
                                                 "evaluated_at": now}])
            sql = [v["violation"] for v in store.fetch(con, training_views.TRAINING_VIOLATIONS_SQL)]
            return python, (sql[0] if sql else None)

        limit = end + timedelta(days=90)
        assert both(limit) == (None, None)
        assert both(limit + us) == ("expired", "expired")
        assert both(limit - us, revoked_at=limit - us) == ("revoked", "revoked")
        assert both(limit - us, revoked_at=limit) == (None, None)


def test_checkpoint_flags_follow_revocation_and_stay_sticky(wh, tmp_path):
    trajs = _ingest_some(wh, tmp_path)
    acme = [t["record_id"] for t in trajs if t["tenant_id"] == "acme"]
    grant = {"consent_id": "CONSENT-ACME-TRN-2026-09", "tenant_id": "acme", "scopes": ["train"], "retention_days": 90,
             "granted_at": datetime(2026, 9, 1, tzinfo=timezone.utc)}
    with wh.connect() as con:
        tables.ensure_all(con)
        checkpoints.register_checkpoint(con, "ck-acme-1", "acme", acme)
        checkpoints.register_checkpoint(con, "ck-other", "globex", [])
        assert store.fetch(con, "SELECT consent_ids FROM checkpoints WHERE checkpoint_id = 'ck-acme-1'")[0]["consent_ids"] == [
            "CONSENT-ACME-TRN-2026-09"]
        store.replace(con, "consent_grants", [grant])
        assert checkpoints.flag_checkpoints(con, NOW) == ([], [])
        store.replace(con, "consent_grants", [{**grant, "revoked_at": datetime(2026, 11, 14, tzinfo=timezone.utc)}])
        flags, new = checkpoints.flag_checkpoints(con, NOW)
        assert new == ["ck-acme-1"] and flags[0]["n_records"] == len(acme)
        row = store.fetch(con, "SELECT flagged, flag_reason FROM checkpoints WHERE checkpoint_id = 'ck-acme-1'")[0]
        assert row["flagged"] and "CONSENT-ACME-TRN-2026-09" in row["flag_reason"]
        store.replace(con, "consent_grants", [grant])            # un-revoked: the checkpoint stays flagged
        assert checkpoints.flag_checkpoints(con, NOW) == ([], [])
        assert _ids(con, "SELECT checkpoint_id FROM checkpoints WHERE flagged") == ["ck-acme-1"]


def test_a_checkpoint_is_flagged_by_its_registered_grant_after_its_records_are_gone(con):
    """Revocation purges a grant's data, so its records may no longer be in `trajectories` when
    the flags are computed: the grant ids registered with the checkpoint still flag it. A
    checkpoint registered without a time gets the registration time; the counts the
    checkpoint_flags asset reports are the table's."""
    grant = {"consent_id": "C-GONE", "tenant_id": "acme", "scopes": ["train"], "retention_days": 90,
             "granted_at": datetime(2026, 9, 1, tzinfo=timezone.utc)}
    before = datetime.now(timezone.utc)
    checkpoints.register_checkpoint(con, "ck-purged", "acme", ["r-deleted-1", "r-deleted-2"], consent_ids=["C-GONE"])
    checkpoints.register_checkpoint(con, "ck-kept", "acme", [], consent_ids=["C-OTHER"],
                                    created_at=datetime(2026, 10, 1, tzinfo=timezone.utc))
    created = {r["checkpoint_id"]: r["created_at"] for r in store.fetch(con, "SELECT checkpoint_id, created_at FROM checkpoints")}
    assert before <= created["ck-purged"].astimezone(timezone.utc) <= datetime.now(timezone.utc)
    assert created["ck-kept"] == datetime(2026, 10, 1, tzinfo=timezone.utc)
    store.replace(con, "consent_grants", [{**grant, "revoked_at": datetime(2026, 11, 14, tzinfo=timezone.utc)}])
    flags, new = checkpoints.flag_checkpoints(con, NOW)
    assert new == ["ck-purged"]
    assert [(f["checkpoint_id"], f["consent_id"], f["n_records"]) for f in flags] == [("ck-purged", "C-GONE", 0)]
    assert store.fetch(con, checkpoints.CHECKPOINT_COUNTS_SQL) == [{"total": 2, "flagged": 1}]


def test_sft_coverage_is_recorded_per_checkpoint_and_a_rerun_replaces_it(con):
    """What an SFT checkpoint was offered and trained on, row by row, with the reason a row did
    not train; the same checkpoint recorded again replaces its rows, another keeps its own, and
    `v_sft_coverage` sums them per source format."""

    def entry(rid, fmt, trains, reason="", turns=4, trainable=2):
        return {"record_id": rid, "source_format": fmt, "trains": trains, "reason": reason, "turns": turns,
                "trainable_turns": trainable if trains else 0}

    first = [entry("r1", "ratchet", True), entry("r2", "swe-agent", True, turns=10, trainable=5),
             entry("r3", "swe-agent", False, "no assistant turn"), entry("r4", "swe-agent", False, "too long")]
    assert checkpoints.record_sft_coverage(con, "ck-1", "acme", first, sft_data="all", dagster_run_id="run-1") == 4
    assert checkpoints.record_sft_coverage(con, "ck-2", "acme", first[:1], sft_data="ratchet") == 1
    rows = store.fetch(con, "SELECT record_id, trains, reason, sft_data, dagster_run_id FROM sft_coverage "
                            "WHERE checkpoint_id = 'ck-1' ORDER BY record_id")
    assert [(r["record_id"], r["trains"], r["reason"]) for r in rows] == [
        ("r1", True, None), ("r2", True, None), ("r3", False, "no assistant turn"), ("r4", False, "too long")]
    assert {(r["sft_data"], r["dagster_run_id"]) for r in rows} == {("all", "run-1")}
    assert all(r["created_at"] is not None for r in store.fetch(con, "SELECT created_at FROM sft_coverage"))
    view = store.fetch(con, "SELECT * FROM v_sft_coverage WHERE checkpoint_id = 'ck-1' ORDER BY source_format")
    assert [(v["source_format"], v["trajectories"], v["trained"], v["not_trained"], v["reasons"], v["trainable_turns"],
             v["turns"]) for v in view] == [("ratchet", 1, 1, 0, None, 2, 4),
                                            ("swe-agent", 3, 1, 2, ["no assistant turn", "too long"], 5, 18)]
    # recorded again (a re-run of the same checkpoint): its rows are replaced, ck-2's are kept
    assert checkpoints.record_sft_coverage(con, "ck-1", "acme", first[:2], sft_data="all") == 2
    assert _ids(con, "SELECT checkpoint_id || ':' || record_id FROM sft_coverage ORDER BY 1") == ["ck-1:r1", "ck-1:r2", "ck-2:r1"]
