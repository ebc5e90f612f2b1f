"""A record already stored is a duplicate whatever attribution a later ingest gives it: another
tenant, or none at all (the same file ingested again without --tenant or its `_batch.yaml`)."""
import json

from ratchet import samples
from ratchet.ingest import IngestOptions, ingest

GOOD = {"task_id": "t", "messages": [{"role": "user", "content": "hi"}]}


def _one(wh, sql):
    with wh.connect() as con:
        return con.execute(sql).fetchall()


def test_the_same_file_again_without_tenant_is_a_duplicate(tmp_path, wh):
    f = tmp_path / "x.traj.json"
    f.write_text(json.dumps(samples.mini_swe_agent_traj()))
    assert ingest([f], wh, IngestOptions(tenant_id="acme", consent_id="C-ACME")).accepted == 1
    s = ingest([f], wh)
    assert (s.read, s.accepted, s.duplicates, s.attribution_conflicts) == (1, 0, 1, 1), s.as_dict()
    assert _one(wh, "SELECT tenant_id, consent_id FROM trajectories") == [("acme", "C-ACME")]
    assert _one(wh, "SELECT accepted, duplicates FROM ingest_files WHERE batch_id = "
                    f"'{s.batch_id}'") == [(0, 1)]


def test_a_sidecar_folder_read_again_without_its_sidecar(tmp_path, wh):
    d = tmp_path / "landing" / "team"
    d.mkdir(parents=True)
    (d / "_batch.yaml").write_text("tenant_id: initech\nconsent_id: C-I\n")
    lines = [json.dumps({**GOOD, "trajectory_id": f"r{i}"}) for i in range(5)]
    (d / "a.jsonl").write_text("\n".join(lines) + "\n")
    assert ingest([tmp_path / "landing"], wh).accepted == 5
    (d / "_batch.yaml").unlink()
    new = json.dumps({**GOOD, "trajectory_id": "new"})
    (d / "a.jsonl").write_text("\n".join(lines + [new, new]) + "\n")   # and one repeat within the batch
    s = ingest([tmp_path / "landing"], wh)
    assert (s.read, s.accepted, s.duplicates, s.attribution_conflicts) == (7, 1, 6, 5), s.as_dict()
    assert s.read == s.accepted + s.quarantined + s.duplicates
    # the file's own row counts both kinds of duplicate
    assert _one(wh, "SELECT read, accepted, duplicates FROM ingest_files WHERE batch_id = "
                    f"'{s.batch_id}'") == [(7, 1, 6)]
    assert _one(wh, "SELECT count(*), count(tenant_id) FROM trajectories") == [(6, 5)]


def test_other_content_under_the_same_id_is_still_a_new_record(tmp_path, wh):
    (tmp_path / "a.jsonl").write_text(json.dumps({**GOOD, "trajectory_id": "x"}) + "\n")
    assert ingest([tmp_path / "a.jsonl"], wh, IngestOptions(tenant_id="acme")).accepted == 1
    (tmp_path / "b.jsonl").write_text(json.dumps({**GOOD, "trajectory_id": "x", "repo": "other"}) + "\n")
    s = ingest([tmp_path / "b.jsonl"], wh)
    assert (s.accepted, s.attribution_conflicts, s.id_clashes) == (1, 0, 1)


def test_a_bad_line_in_a_copied_home_is_the_quarantine_row_it_was(tmp_path):
    """A quarantine row is named by its file's path inside the landing folder, not by where the
    home lies: after the home is copied, ingesting the copy's landing finds the bad line already
    quarantined (a duplicate), where a file outside any landing folder is named by its full path."""
    import shutil

    from ratchet.home import get_home
    from ratchet.warehouse import Warehouse

    a = get_home(tmp_path / "a").ensure()
    (a.landing / "logs").mkdir(parents=True)
    (a.landing / "logs" / "x.jsonl").write_text("{not json\n" + json.dumps({**GOOD, "trajectory_id": "g"}) + "\n")
    assert ingest([a.landing], Warehouse(a.warehouse)).quarantined == 1
    shutil.copytree(a.root, tmp_path / "b")
    b = get_home(tmp_path / "b")
    s = ingest([b.landing], Warehouse(b.warehouse))
    assert (s.read, s.accepted, s.quarantined, s.duplicates) == (2, 0, 0, 2), s.as_dict()
    assert _one(Warehouse(b.warehouse), "SELECT count(*) FROM quarantine") == [(1,)]
    # outside the landing folder the same line is another file's
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(b.landing / "logs", elsewhere)
    assert ingest([elsewhere], Warehouse(b.warehouse)).quarantined == 1


def test_a_bad_line_quarantined_under_its_full_path_is_found_once_it_lies_in_the_landing_folder(tmp_path, wh):
    """Quarantine ids name a landing file by its place in the landing folder; a row written
    before that (or while the file was outside the landing folder) carries its full path. The
    same bad line read again as a landing file is that row, not a second one."""
    landing = tmp_path / "landing"
    (landing / "logs").mkdir(parents=True)
    (landing / "logs" / "x.jsonl").write_text("{not json\n")
    elsewhere = IngestOptions(landing=str(tmp_path / "another-landing"))
    assert ingest([landing], wh, elsewhere).quarantined == 1          # named by its full path
    s = ingest([landing], wh, IngestOptions(landing=str(landing)))
    assert (s.read, s.quarantined, s.duplicates) == (1, 0, 1), s.as_dict()
    assert _one(wh, "SELECT count(*) FROM quarantine") == [(1,)]
