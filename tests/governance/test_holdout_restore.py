"""`ratchet holdout restore`: a deleted or forged manifest file is rewritten from the warehouse's
rows, and only when those rows hash to the sha256 recorded at lock time, so a restore can bring
back the locked holdout and nothing else."""
import json

import pytest

from ratchet import store
from ratchet.governance import holdout
from ratchet.governance.manifest import ManifestError, create_manifest, save_manifest

pytestmark = pytest.mark.governance


def test_a_forged_file_is_restored_to_the_locked_holdout(con, home):
    path = home.root / "holdout_manifest.json"
    m = holdout.lock_holdout(con, path, ["a", "b", "c"], locked_by="test")
    save_manifest(create_manifest(["a", "b", "x"], locked_by="mallory"), path)
    with pytest.raises(ManifestError, match="ratchet holdout restore"):   # the error names the way out
        holdout.holdout_state(con, path)
    with pytest.raises(ManifestError, match="reason"):
        holdout.restore_holdout(con, path, reason="", actor="alice")
    restored, row = holdout.restore_holdout(con, path, reason="file overwritten", actor="alice")
    assert restored.sha256 == m.sha256 and restored.task_ids == ("a", "b", "c")
    st = holdout.holdout_state(con, path)
    assert st.locked and st.manifest.sha256 == m.sha256
    log = store.fetch(con, "SELECT event, actor, reason, manifest_sha256 FROM holdout_manifest_log ORDER BY seq")
    assert log[-1] == {"event": "restore", "actor": "alice", "reason": "file overwritten", "manifest_sha256": m.sha256}


def test_a_deleted_unlocked_manifest_comes_back_unlocked_with_its_audit(con, home):
    path = home.root / "holdout_manifest.json"
    holdout.lock_holdout(con, path, ["a", "b", "c"], locked_by="test")
    holdout.unlock_holdout(con, path, reason="grow it", actor="bob")
    path.unlink()
    holdout.restore_holdout(con, path, reason="deleted by mistake", actor="alice")
    st = holdout.holdout_state(con, path)
    assert not st.locked
    assert [a["actor"] for a in json.loads(path.read_text())["audit"]] == ["bob"]


def test_edited_rows_cannot_restore_anything(con, home):
    path = home.root / "holdout_manifest.json"
    holdout.lock_holdout(con, path, ["a", "b", "c"], locked_by="test")
    con.execute("UPDATE holdout_manifest SET task_id = 'x' WHERE task_id = 'c'")
    path.unlink()
    with pytest.raises(ManifestError):
        holdout.restore_holdout(con, path, reason="r", actor="alice")
    assert not path.exists()
    assert store.fetch(con, "SELECT count(*) AS n FROM holdout_manifest_log WHERE event = 'restore'")[0]["n"] == 0


def test_nothing_to_restore_without_a_lock(con, home):
    with pytest.raises(ManifestError, match="nothing to restore"):
        holdout.restore_holdout(con, home.root / "holdout_manifest.json", reason="r", actor="a")


def test_cli_restores_a_deleted_manifest(home, capsys):
    from pipelines.cli import main
    from ratchet.warehouse import Warehouse

    wh = Warehouse(home.warehouse)
    wh.ensure_schema()
    path = home.root / "holdout_manifest.json"
    with wh.connect() as c:
        m = holdout.lock_holdout(c, path, ["a", "b"], locked_by="test")
    path.unlink()
    assert main(["--home", str(home.root), "holdout", "show"]) == 1
    assert main(["--home", str(home.root), "holdout", "restore", "--reason", "deleted", "--actor", "ops"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["event"] == "restore"
    assert main(["--home", str(home.root), "holdout", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sha256"] == m.sha256


def test_a_restore_refuses_rows_that_are_gone_or_edited(con, home):
    """The warehouse's rows are the only source a restore may use, and only while they hash to
    the recorded sha256: with no rows of the locked version, or edited ones, nothing is written."""
    path = home.root / "holdout_manifest.json"
    m = holdout.lock_holdout(con, path, ["a", "b", "c"], locked_by="test")
    path.unlink()
    from ratchet.governance.manifest import holdout_sha256

    # rows rewritten to another holdout that is consistent with itself: only the log's hash tells
    con.execute("UPDATE holdout_manifest SET task_id = 'x' WHERE task_id = 'c'")
    con.execute("UPDATE holdout_manifest SET manifest_sha256 = ?", [holdout_sha256(["a", "b", "x"])])
    with pytest.raises(ManifestError, match="rows differ from the sha256 recorded"):
        holdout.restore_holdout(con, path, reason="deleted by mistake", actor="alice")
    assert not path.exists()
    con.execute("DELETE FROM holdout_manifest")
    with pytest.raises(ManifestError, match=f"no rows of the recorded version {m.version}"):
        holdout.restore_holdout(con, path, reason="deleted by mistake", actor="alice")
    assert not path.exists()
