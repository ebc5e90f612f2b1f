"""A locked holdout never moves. `lock_or_verify` (what the holdout_manifest asset runs) and the
split_assignments asset each refuse a set of holdout tasks that differs from the locked manifest:
a moved holdout is an error, never a quiet re-lock under a new version, and a refused split leaves
the warehouse as it was. Only `ratchet holdout unlock` opens the way to a new version.

The rest holds the records that decision rests on: a manifest file the warehouse never saw is
adopted (once), and deleted or edited warehouse rows, a hand-flipped lock flag or an unlock /
restore without a real reason and actor are refused rather than read as a fresh start."""
import json

import pytest

from ratchet import store
from ratchet.governance import holdout
from ratchet.governance.manifest import ManifestError

pytestmark = pytest.mark.governance

SUITE = [f"task-{i:02d}" for i in range(10)]
HELD = ["task-01", "task-04", "task-07"]


def _log(con):
    return store.fetch(con, "SELECT event, version, manifest_sha256 FROM holdout_manifest_log ORDER BY seq")


def _versions(con):
    return [r["version"] for r in store.fetch(con, "SELECT DISTINCT version FROM holdout_manifest ORDER BY 1")]


@pytest.fixture
def locked(wh, home):
    """A warehouse and manifest file with HELD locked as version 1."""
    path = home.root / "holdout_manifest.json"
    with wh.connect() as con:
        event, m, notes = holdout.lock_or_verify(con, path, HELD, SUITE, actor="first-run")
        assert (event, m.version, list(m.task_ids), notes) == ("locked", 1, HELD, [])
        yield con, path, m


def test_the_same_holdout_is_verified_not_relocked(locked):
    con, path, m = locked
    event, again, _ = holdout.lock_or_verify(con, path, list(reversed(HELD)), SUITE, actor="second-run")
    assert event == "verified" and again.sha256 == m.sha256 and again.version == 1
    assert [r["event"] for r in _log(con)] == ["lock", "verify"] and _versions(con) == [1]


# swapped: one task left and another entered; grown / shrunk: one side of the move alone. The
# error names a task that moved (the one that left, else the one that entered).
@pytest.mark.parametrize("held, named", [
    (["task-01", "task-04", "task-08"], "1 manifest tasks left it, 1 tasks entered it (e.g. ['task-07'])"),
    (HELD + ["task-09"], "0 manifest tasks left it, 1 tasks entered it (e.g. ['task-09'])"),
    (["task-01", "task-04"], "1 manifest tasks left it, 0 tasks entered it (e.g. ['task-07'])"),
], ids=["swapped", "grown", "shrunk"])
def test_a_moved_holdout_is_refused_and_never_relocked(locked, held, named):
    con, path, m = locked
    before_log, before_file = _log(con), path.read_text()
    with pytest.raises(ManifestError, match="would move the locked holdout") as e:
        holdout.lock_or_verify(con, path, held, SUITE, actor="mallory")
    assert named in str(e.value) and f"the locked holdout {m.sha256[:12]}...:" in str(e.value)
    # no lock (or verify) row, no new version in the table, the file untouched
    assert _log(con) == before_log == [{"event": "lock", "version": 1, "manifest_sha256": m.sha256}]
    assert _versions(con) == [1]
    assert path.read_text() == before_file
    st = holdout.holdout_state(con, path)
    assert st.locked and st.manifest.version == 1 and st.manifest.sha256 == m.sha256
    assert list(st.manifest.task_ids) == HELD


def test_a_holdout_task_gone_from_the_suite_is_not_a_move(locked):
    # the task table lost task-07 (e.g. a smaller suite): the rest of the holdout still verifies
    con, path, m = locked
    present = [t for t in SUITE if t != "task-07"]
    event, again, _ = holdout.lock_or_verify(con, path, ["task-01", "task-04"], present, actor="second-run")
    assert event == "verified" and again.version == 1 and again.sha256 == m.sha256
    assert _versions(con) == [1]


def test_after_an_unlock_the_next_split_locks_a_new_version(locked):
    # the one legitimate way to a different holdout, so the refusal above is not a blanket "never"
    con, path, m = locked
    holdout.unlock_holdout(con, path, reason="grow the holdout", actor="alice")
    event, m2, _ = holdout.lock_or_verify(con, path, HELD + ["task-09"], SUITE, actor="next-run")
    assert event == "locked" and m2.version == 2 and list(m2.task_ids) == HELD + ["task-09"]
    assert [r["event"] for r in _log(con)] == ["lock", "unlock", "lock"] and _versions(con) == [1, 2]


# ----------------------------------------------------------------------- the split_assignments asset
def _seed_suite(wh):
    """Ten tasks in ten clusters, as task_suite and dedup_clusters would leave them."""
    from ratchet.clock import now_utc

    now = now_utc()
    with wh.connect() as con:
        store.insert(con, "tasks", [{"task_id": t, "repo": f"r/{t}", "slice": "s", "loaded_at": now} for t in SUITE])
        store.insert(con, "dedup_clusters", [
            {"id": f"task:{t}", "kind": "task", "source_id": t, "cluster_id": f"c-{t}", "cluster_size": 1,
             "cluster_tasks": 1, "cluster_trajectories": 0, "computed_at": now} for t in SUITE])


def _materialize(root, names):
    from dagster import DagsterInstance, materialize

    from assets.splits import holdout_manifest, split_assignments
    from resources import WarehouseResource

    defs = {"split_assignments": split_assignments, "holdout_manifest": holdout_manifest}
    return materialize([defs[n] for n in names], resources={"warehouse": WarehouseResource(home=str(root))},
                       instance=DagsterInstance.ephemeral(), raise_on_error=False)


def _failures(res):
    return {e.step_key: e.event_specific_data.error.to_string() for e in res.all_events
            if e.event_type_value == "STEP_FAILURE"}


def test_the_split_asset_refuses_a_split_that_moves_a_holdout_task(wh, home, monkeypatch):
    """governed_split_table keeps a locked holdout in place by construction; the asset checks its
    result anyway, before writing, so a split that moves a holdout task (a bug in the splitter,
    a changed rule) fails the run instead of replacing split_assignments."""
    import ratchet.governance.splits as splits

    root = home.root
    _seed_suite(wh)
    res = _materialize(root, ["split_assignments", "holdout_manifest"])
    assert res.success, _failures(res)
    path = root / "holdout_manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["locked"] and manifest["version"] == 1 and manifest["task_ids"]
    with wh.connect() as con:
        before = store.fetch(con, "SELECT * FROM split_assignments ORDER BY id")
        log = _log(con)
    gone = manifest["task_ids"][0]
    new = next(r["source_id"] for r in before if r["split"] == "train")
    real = splits.governed_split_table

    def moving(*a, **kw):  # the real split with one holdout task swapped for a train task
        import pyarrow as pa

        table = real(*a, **kw)
        rows = table.to_pylist()
        for r in rows:
            if r["source_id"] in (gone, new):
                r["split"], r["reason"] = ("train", "moved") if r["source_id"] == gone else ("holdout", "moved")
        return pa.Table.from_pylist(rows, schema=table.schema)

    monkeypatch.setattr(splits, "governed_split_table", moving)
    res = _materialize(root, ["split_assignments", "holdout_manifest"])
    assert not res.success
    err = _failures(res)
    assert set(err) == {"split_assignments"}, err
    assert "ManifestError" in err["split_assignments"] and "would move the locked holdout" in err["split_assignments"]
    assert not {e.asset_key.to_user_string() for e in res.get_asset_materialization_events()}
    with wh.connect() as con:
        assert store.fetch(con, "SELECT * FROM split_assignments ORDER BY id") == before   # not replaced
        assert _log(con) == log and _versions(con) == [1]
    assert json.loads(path.read_text()) == manifest


# ------------------------------------------------------ adoption and deleted warehouse records
def test_a_fresh_warehouse_without_a_manifest_file_has_nothing_locked(wh, home):
    with wh.connect() as con:
        st = holdout.holdout_state(con, home.root / "holdout_manifest.json")
    assert st.manifest is None and not st.locked and not st.recorded and not st.needs_adoption


def test_a_manifest_file_without_a_warehouse_record_is_adopted_and_then_holds(wh, home):
    """A rebuilt warehouse next to a locked manifest file: the file is adopted (an `adopt` event
    counts as its lock record from then on), verified, and a moved split is still refused."""
    from ratchet.governance.manifest import create_manifest, save_manifest

    path = home.root / "holdout_manifest.json"
    m = create_manifest(HELD, locked_by="earlier-warehouse")
    save_manifest(m, path)
    with wh.connect() as con:
        st = holdout.holdout_state(con, path)
        assert st.locked and st.needs_adoption and not st.recorded and st.manifest.sha256 == m.sha256
        event, got, notes = holdout.lock_or_verify(con, path, HELD, SUITE, actor="run-1")
        assert event == "verified" and got.sha256 == m.sha256 and got.version == 1
        assert len(notes) == 1 and "adopting" in notes[0]
        st = holdout.holdout_state(con, path)      # the adopt event is the record now: no second adoption
        assert st.recorded and not st.needs_adoption and st.locked
        event, _, notes = holdout.lock_or_verify(con, path, HELD, SUITE, actor="run-2")
        assert event == "verified" and notes == []
        with pytest.raises(ManifestError, match="would move the locked holdout"):
            holdout.lock_or_verify(con, path, ["task-01", "task-04", "task-08"], SUITE, actor="run-3")
        assert [r["event"] for r in _log(con)] == ["adopt", "verify", "verify"] and _versions(con) == [1]


def test_deleted_manifest_rows_are_tampering(locked):
    # the log recorded a lock: an emptied holdout_manifest table is an edit, not a fresh warehouse
    con, path, _ = locked
    con.execute("DELETE FROM holdout_manifest")
    with pytest.raises(ManifestError, match="holdout_manifest table is empty"):
        holdout.holdout_state(con, path)
    with pytest.raises(ManifestError):
        holdout.lock_or_verify(con, path, ["task-02"], SUITE, actor="mallory")   # and nothing relocks
    assert [r["event"] for r in _log(con)] == ["lock"]


def test_a_deleted_lock_log_is_tampering(locked):
    # the table holds a locked version: a log without its lock record was edited, not fresh
    con, path, _ = locked
    con.execute("DELETE FROM holdout_manifest_log")
    with pytest.raises(ManifestError, match="no lock record"):
        holdout.holdout_state(con, path)
    with pytest.raises(ManifestError):
        holdout.lock_or_verify(con, path, ["task-02"], SUITE, actor="mallory")
    assert _versions(con) == [1]


def test_a_deleted_manifest_file_is_an_error_that_names_restore(locked):
    con, path, _ = locked
    path.unlink()
    with pytest.raises(ManifestError, match="missing.*ratchet holdout restore"):
        holdout.holdout_state(con, path)


@pytest.mark.parametrize("edit", ["ids", "version"])
def test_edited_manifest_rows_are_tampering(locked, edit):
    """Rows rewritten consistently with themselves (other ids and their own sha256, or another
    version number) still differ from what the log recorded at lock time."""
    from ratchet.governance.manifest import holdout_sha256

    con, path, _ = locked
    if edit == "ids":
        forged = ["task-01", "task-04", "task-08"]
        con.execute("UPDATE holdout_manifest SET task_id = 'task-08' WHERE task_id = 'task-07'")
        con.execute("UPDATE holdout_manifest SET manifest_sha256 = ?", [holdout_sha256(forged)])
    else:
        con.execute("UPDATE holdout_manifest SET version = 2")
    with pytest.raises(ManifestError, match="rows edited"):
        holdout.holdout_state(con, path)


def test_a_lock_flag_flipped_by_hand_is_refused(locked):
    """The ids hash the same whether locked or not, so the flag is checked on its own, in the
    file and in the table: only `ratchet holdout unlock` may change it."""
    from dataclasses import replace

    from ratchet.governance.manifest import save_manifest

    con, path, m = locked
    save_manifest(replace(m, locked=False), path)
    with pytest.raises(ManifestError, match="says locked=False but the warehouse says locked=True"):
        holdout.holdout_state(con, path)
    save_manifest(m, path)
    con.execute("UPDATE holdout_manifest SET locked = false")
    with pytest.raises(ManifestError, match="the lock flag can only change through"):
        holdout.holdout_state(con, path)


def test_an_adopted_unlocked_file_stays_unlocked_and_the_next_split_locks_anew(wh, home):
    from dataclasses import replace

    from ratchet.governance.manifest import create_manifest, save_manifest

    path = home.root / "holdout_manifest.json"
    save_manifest(replace(create_manifest(HELD, locked_by="earlier"), locked=False), path)
    with wh.connect() as con:
        event, m2, notes = holdout.lock_or_verify(con, path, HELD + ["task-09"], SUITE, actor="run-1")
        assert event == "locked" and m2.version == 2 and notes
        assert [r["event"] for r in _log(con)] == ["adopt", "unlock", "lock"]
        assert holdout.holdout_state(con, path).locked


def test_every_log_event_is_timestamped(locked):
    con, path, _ = locked
    holdout.lock_or_verify(con, path, HELD, SUITE, actor="run-2")
    holdout.unlock_holdout(con, path, reason="grow it", actor="alice")
    rows = store.fetch(con, "SELECT event, event_at FROM holdout_manifest_log ORDER BY seq")
    assert [r["event"] for r in rows] == ["lock", "verify", "unlock"] and all(r["event_at"] for r in rows)


# ------------------------------------------- an unlock or a restore needs a reason and an actor
@pytest.mark.parametrize("reason, actor", [("", "alice"), ("   ", "alice"), (None, "alice"),
                                           ("why", ""), ("why", "  "), ("why", None)])
def test_unlock_and_restore_need_a_real_reason_and_actor(locked, reason, actor):
    # whitespace is not a reason: the audit row must say who and why
    con, path, m = locked
    with pytest.raises(ManifestError, match="needs a non-empty --reason and --actor"):
        holdout.unlock_holdout(con, path, reason=reason, actor=actor)
    path.unlink()
    with pytest.raises(ManifestError, match="needs a non-empty --reason and --actor"):
        holdout.restore_holdout(con, path, reason=reason, actor=actor)
    assert [r["event"] for r in _log(con)] == ["lock"] and not path.exists()


def test_an_older_version_of_the_file_put_back_is_refused_even_with_the_same_tasks(locked):
    """Unlocked and locked again with the same tasks: version 2 has version 1's sha256, so only the
    version tells the files apart; the old file copied back is refused by its version."""
    con, path, m = locked
    v1 = path.read_text()
    holdout.unlock_holdout(con, path, reason="re-draw", actor="alice")
    event, m2, _ = holdout.lock_or_verify(con, path, HELD, SUITE, actor="next-run")
    assert (event, m2.version, m2.sha256) == ("locked", 2, m.sha256)
    path.write_text(v1)
    with pytest.raises(ManifestError, match="is version 1, the warehouse recorded 2"):
        holdout.holdout_state(con, path)


def test_the_first_lock_of_an_empty_holdout_is_refused(wh, home):
    path = home.root / "holdout_manifest.json"
    with wh.connect() as con:
        with pytest.raises(ManifestError, match="refusing to lock an empty holdout"):
            holdout.lock_or_verify(con, path, [], SUITE, actor="first-run")
        assert _log(con) == [] and not path.exists()


def test_unlock_needs_a_manifest_and_adopts_a_file_the_warehouse_never_saw(wh, home):
    from ratchet.governance.manifest import create_manifest, save_manifest

    path = home.root / "holdout_manifest.json"
    with wh.connect() as con:
        with pytest.raises(ManifestError, match="nothing to unlock"):
            holdout.unlock_holdout(con, path, reason="grow it", actor="alice")
        save_manifest(create_manifest(HELD, locked_by="elsewhere"), path)   # copied in from another warehouse
        m, _ = holdout.unlock_holdout(con, path, reason="grow it", actor="alice")
        assert not m.locked and [r["event"] for r in _log(con)] == ["adopt", "unlock"]
        assert not holdout.holdout_state(con, path).locked
