import json
from collections import Counter, defaultdict
from datetime import datetime, timezone

import pytest

from ratchet.governance.clusters import build_clusters
from ratchet.governance.contamination import contamination_report
from ratchet.governance.manifest import (ManifestError, create_manifest, load_manifest, manifest_from_rows,
                                         manifest_rows, save_manifest, unlock, verify_manifest)
from ratchet.governance.splits import EXCLUDED, assign_splits, holdout_ids, split_targets

from .synthetic import mutant_tasks, mutate

pytestmark = pytest.mark.governance
NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _cluster_and_split(tasks, **kw):
    clusters, _ = build_clusters(tasks, id_col="task_id", text_col="issue", code_cols=("solution",))
    slice_of = {t["task_id"]: t["slice"] for t in tasks}
    items = [{"id": r["id"], "cluster_id": r["cluster_id"], "slice": slice_of[r["id"]]} for r in clusters.to_pylist()]
    return assign_splits(items, **kw)


def test_split_targets_reference_and_proportional():
    assert split_targets(1160) == {"train": 600, "val": 160, "holdout": 400}
    assert split_targets(2000) == {"train": 1440, "val": 160, "holdout": 400}
    t = split_targets(116)
    assert t == {"train": 60, "val": 16, "holdout": 40} and sum(split_targets(71).values()) == 71


def test_mutants_of_one_problem_always_land_in_one_split():
    for seed in range(3):
        a = _cluster_and_split(mutant_tasks(6, seed=seed), seed=seed)
        per_problem = defaultdict(set)
        for r in a.to_pylist():
            per_problem[r["id"].rsplit("-m", 1)[0]].add(r["split"])
        assert all(len(s) == 1 for s in per_problem.values()), per_problem
        counts = Counter(a.column("split").to_pylist())
        assert set(counts) == {"train", "val", "holdout"}


def test_resplit_with_more_data_never_moves_holdout_and_never_grows_it(tmp_path):
    tasks = mutant_tasks(4)
    first = _cluster_and_split(tasks)
    manifest = create_manifest(holdout_ids(first), locked_by="lead", now=NOW)
    save_manifest(manifest, tmp_path / "holdout.json")
    previous = {r["id"]: r["split"] for r in first.to_pylist()}
    # more data: extra mutants of every problem (some join holdout clusters) + brand-new problems
    more = mutant_tasks(8)[:]
    extra = [dict(t, task_id=t["task_id"] + "-late") for t in more]
    novel = []
    for i in range(3):
        novel.append({"task_id": f"new-{i}", "repo": f"other/{i}", "issue_id": f"o#{i}",
                      "issue": f"completely different issue number {i} about parsing dates and time zones",
                      "solution": f"def parse_{i}(s):\n    parts = s.split('-')\n    return tuple(int(p) for p in parts)\n", "slice": "op"})
    loaded = load_manifest(tmp_path / "holdout.json")
    second = _cluster_and_split(tasks + extra + novel, manifest=loaded, previous=previous)
    rows = {r["id"]: r for r in second.to_pylist()}
    assert holdout_ids(second) == list(manifest.task_ids)  # nothing moved out, nothing added
    for t in extra:
        if t["repo"] in {x["repo"] for x in tasks if previous[x["task_id"]] == "holdout"}:
            assert rows[t["task_id"]]["split"] == EXCLUDED
            assert "locked holdout" in rows[t["task_id"]]["reason"]
        else:
            assert rows[t["task_id"]]["split"] in ("train", "val")
    assert all(rows[t["task_id"]]["split"] in ("train", "val") for t in novel)
    assert all(rows[i]["split"] == s for i, s in previous.items() if s != "holdout")  # train/val stable too
    report = contamination_report(second, tasks + extra + novel, id_col="task_id", text_col="issue", code_cols=("solution",))
    assert report["passed"], report["counts"]


def test_tampered_or_missing_manifest_fails(tmp_path):
    m = create_manifest(["t3", "t1", "t2"], locked_by="lead", now=NOW)
    p = save_manifest(m, tmp_path / "m.json")
    assert load_manifest(p).task_ids == ("t1", "t2", "t3")
    d = json.loads(p.read_text())
    d["task_ids"] = ["t1", "t2", "t9"]
    p.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="tampered"):
        load_manifest(p)
    d["sha256"] = __import__("hashlib").sha256(b"t1\nt2\nt9").hexdigest()  # rewrite both: caught by the recorded hash
    p.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="recorded"):
        load_manifest(p, expected_sha256=m.sha256)
    with pytest.raises(ManifestError, match="missing"):
        load_manifest(tmp_path / "nope.json", required=True)
    assert load_manifest(tmp_path / "nope.json", required=False) is None
    rows = manifest_rows(m)
    assert manifest_from_rows(rows) == m
    rows[0]["task_id"] = "evil"
    with pytest.raises(ManifestError):
        manifest_from_rows(rows)
    items = [{"id": "t1", "cluster_id": "c1", "slice": "x"}]
    bad = type(m)(m.version, ("t1", "t2", "t4"), m.sha256, m.created_at, m.locked_by)
    with pytest.raises(ManifestError):
        assign_splits(items, manifest=bad)


def test_a_refused_manifest_quotes_both_hashes_by_their_first_12_characters_and_cannot_be_edited_in_place(tmp_path):
    """The tamper errors name the two hashes the same way everywhere (12 characters, then `...`),
    so a user can match them against the warehouse's `manifest_sha256`; a manifest is frozen: a
    caller cannot change its tasks after it was verified."""
    import dataclasses
    import hashlib

    m = create_manifest(["t1", "t2"], locked_by="lead", now=NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.task_ids = ("t9",)
    forged = dataclasses.replace(m, task_ids=("t1", "t9"))
    actual = hashlib.sha256(b"t1\nt9").hexdigest()
    with pytest.raises(ManifestError) as err:
        verify_manifest(forged)
    assert str(err.value) == f"holdout manifest tampered: sha256 of its 2 ids is {actual[:12]}..., manifest says {m.sha256[:12]}..."
    other = "f" * 64
    with pytest.raises(ManifestError) as err:
        verify_manifest(m, expected_sha256=other)
    assert str(err.value) == f"holdout manifest sha256 {m.sha256[:12]}... differs from the recorded ffffffffffff..."


def test_a_manifest_saves_into_a_new_folder_over_an_old_file_and_reads_locked_by_default(tmp_path):
    """`save_manifest` creates the folder and replaces an existing file; a manifest written
    without a `locked` field (as before unlocking existed) reads as locked."""
    m = create_manifest(["a", "b"], locked_by="lead", now=NOW)
    path = tmp_path / "deep" / "er" / "holdout.json"
    save_manifest(m, path)
    save_manifest(m, path)
    assert load_manifest(path).task_ids == ("a", "b") and not list(path.parent.glob("*.tmp"))
    d = json.loads(path.read_text())
    del d["locked"]
    path.write_text(json.dumps(d))
    assert load_manifest(path).locked


def test_unlock_is_explicit_and_audited():
    m = create_manifest(["a", "b"], locked_by="lead", now=NOW)
    for reason, actor in (("", "lead"), ("  ", "lead"), (None, "lead"), ("leaked", ""), ("leaked", " \t"), ("leaked", None)):
        with pytest.raises(ManifestError):   # a blank reason or actor is no reason or actor
            unlock(m, reason=reason, actor=actor)
    u, row = unlock(m, reason="holdout leaked into a public benchmark", actor="alice", now=NOW)
    assert not u.locked and row["action"] == "unlock" and row["actor"] == "alice" and u.audit == (row,)
    assert verify_manifest(u).sha256 == m.sha256
    with pytest.raises(ManifestError):
        unlock(u, reason="again", actor="alice")


def test_contamination_gate_fails_on_planted_cross_split_near_duplicate():
    tasks = mutant_tasks(4)
    a = _cluster_and_split(tasks)
    rows = a.to_pylist()
    assert contamination_report(a, tasks, id_col="task_id", text_col="issue", code_cols=("solution",))["passed"]
    # plant: a near-copy of a holdout task's issue and code, under a new repo/issue, forced into train
    h = next(t for t in tasks if next(r for r in rows if r["id"] == t["task_id"])["split"] == "holdout")
    _, code = mutate(h["solution"], 99)
    plant = dict(h, task_id="planted", repo="elsewhere/x", issue_id="x#1", issue=h["issue"] + " thanks", solution=code)
    rows.append({"id": "planted", "cluster_id": "dc-planted", "slice": "op", "split": "train", "reason": "forced"})
    rep = contamination_report(rows, tasks + [plant], id_col="task_id", text_col="issue", code_cols=("solution",))
    assert not rep["passed"] and rep["overlap_fraction"] > 0.0
    assert rep["counts"]["minhash"] >= 1 and rep["counts"]["ast"] >= 1 and rep["counts"]["repo"] == 0
    ex = rep["examples"]["minhash"][0]
    assert "planted" in (ex["a"], ex["b"]) and {ex["split_a"], ex["split_b"]} == {"train", "holdout"}
    # same repo in two splits and one id in two splits are caught too
    rows2 = rows[:-1] + [{"id": tasks[0]["task_id"], "split": "holdout" if rows[0]["split"] != "holdout" else "train"}]
    rep2 = contamination_report(rows2, tasks, id_col="task_id", text_col=None, code_cols=())
    assert not rep2["passed"] and rep2["counts"]["exact_id"] == 1


def test_every_way_a_manifest_can_be_wrong_is_refused_with_its_reason(tmp_path):
    """Each guard of a holdout manifest, one at a time: a file edited by hand that keeps its hash
    consistent (ids reordered or repeated: the hash is over the sorted set) is still refused, as are
    a malformed file, rows whose header was edited, and a lock with no author or no tasks."""
    import hashlib

    from ratchet.governance.manifest import HoldoutManifest, verify_manifest

    with pytest.raises(ManifestError, match="locked_by is required"):
        create_manifest(["a"], locked_by="", now=NOW)
    with pytest.raises(ManifestError, match="refusing to lock an empty holdout"):
        create_manifest([], locked_by="lead", now=NOW)
    m = create_manifest(["t1", "t2"], locked_by="lead", now=NOW)
    with pytest.raises(ManifestError, match="expected but missing"):
        verify_manifest(None)
    for ids, why in ((("t2", "t1"), "not sorted and unique"), (("t1", "t1", "t2"), "not sorted and unique"),
                     ((), "lists no tasks")):
        forged = HoldoutManifest(m.version, ids, hashlib.sha256("\n".join(sorted(set(ids))).encode()).hexdigest(),
                                 m.created_at, m.locked_by)
        with pytest.raises(ManifestError, match=why):
            verify_manifest(forged)
        d = json.loads(m.to_json())
        d.update(task_ids=list(ids), sha256=forged.sha256)
        (tmp_path / "m.json").write_text(json.dumps(d))
        with pytest.raises(ManifestError, match=why):
            load_manifest(tmp_path / "m.json")
    assert verify_manifest(m, expected_ids=["t2", "t1", "t1"]) == m          # the same set of ids
    with pytest.raises(ManifestError, match="ids differ from the expected holdout ids"):
        verify_manifest(m, expected_ids=["t1", "t3"])
    for text in ("{not json", json.dumps({"version": 1}), json.dumps([1, 2]), json.dumps({**json.loads(m.to_json()), "version": "x"})):
        (tmp_path / "m.json").write_text(text)
        with pytest.raises(ManifestError, match=r"m\.json is malformed"):
            load_manifest(tmp_path / "m.json")
    with pytest.raises(ManifestError, match="no holdout_manifest rows"):
        manifest_from_rows([])
    rows = manifest_rows(m)
    rows[1]["locked_by"] = "mallory"
    with pytest.raises(ManifestError, match="rows of version 1 disagree on their header"):
        manifest_from_rows(rows)
    # an older version's rows do not count: the newest version is rebuilt
    old = [{**r, "version": 0, "locked_by": "someone else"} for r in manifest_rows(m)]
    assert manifest_from_rows(old + manifest_rows(m)) == m
