"""The governance asset graph in-process (dagster.materialize, ephemeral instance) over a small
HumanEval suite and ingested trajectories: checks, locked holdout, contamination gate, consent.

One module-scoped base run is copied per test (the warehouse, lake, manifest and registry all
live under RATCHET_HOME), so each test starts from a materialised, locked graph cheaply."""
import json
import shutil
from pathlib import Path

import pytest

from ratchet import store
from ratchet.governance import checkpoints

pytestmark = pytest.mark.governance

LIMIT, MORE, PER = 8, 12, 4          # HumanEval problems (base / more data), mutants per problem
NOW = "2026-11-15T00:00:00+00:00"
SYN_PATCH = "--- a/src/f.py\n+++ b/src/f.py\n@@ -1 +1 @@\n-    return x < n\n+    return x <= n\n"
REGISTRY = """
- {consent_id: CONSENT-ACME-TRN-2026-09, tenant_id: acme, scopes: [execute, train], retention_days: 90, granted_at: 2026-09-01}
- {consent_id: CONSENT-GLOBEX-TRN-2026-09, tenant_id: globex, scopes: [train], retention_days: 90, granted_at: 2026-09-01}
- {consent_id: CONSENT-INITECH-TRN-2026-09, tenant_id: initech, scopes: [train], retention_days: 90, granted_at: 2026-09-01,
   revoked_at: 2026-11-10}
- {consent_id: CONSENT-UMBRELLA-EVAL, tenant_id: umbrella, scopes: [execute, eval], retention_days: 90, granted_at: 2026-09-01}
- {consent_id: CONSENT-HOOLI-SHARED, tenant_id: hooli, scopes: [train], retention_days: 90, granted_at: 2026-09-01,
   cross_tenant_train_for: [acme]}
"""
# (trajectory_id, tenant, consent, ended_at, expected reason for the owner tenant's view)
CONSENT_CASES = [
    ("c-missing", "acme", None, "2026-11-10", "missing_consent"),
    ("c-unknown", "acme", "CONSENT-ACME-NOPE", "2026-11-10", "unknown_consent"),
    ("c-expired", "acme", "CONSENT-ACME-TRN-2026-09", "2026-05-01", "expired"),
    ("c-revoked", "initech", "CONSENT-INITECH-TRN-2026-09", "2026-11-10", "revoked"),
    ("c-noscope", "umbrella", "CONSENT-UMBRELLA-EVAL", "2026-11-10", "no_train_scope"),
    ("c-mismatch", "globex", "CONSENT-ACME-TRN-2026-09", "2026-11-10", "tenant_mismatch"),
    ("c-shared", "hooli", "CONSENT-HOOLI-SHARED", "2026-11-10", None),
]


def _record(tid, tenant, consent, prompt, *, task_id=None, repo=None, issue=None, patch=SYN_PATCH, ended="2026-11-10"):
    from ratchet.contract import Message, Trajectory

    return Trajectory(trajectory_id=tid, task_id=task_id or tid, tenant_id=tenant, consent_id=consent, repo=repo,
                      issue_id=issue, messages=[Message("user", prompt), Message("assistant", "Fixed.")],
                      started_at=f"{ended}T00:00:00+00:00", ended_at=f"{ended}T00:05:00+00:00", patch=patch,
                      accepted=True, tests_passed=True).to_record()


def _ingest(root: Path, name: str, records=None, synthetic=0, start=0):
    from ratchet.ingest import ingest
    from ratchet.synth import write_jsonl

    path = root / "landing" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if synthetic:
        write_jsonl(path, synthetic, seed=start, start=start)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return ingest([path], _wh(root))


def _wh(root: Path):
    from ratchet.warehouse import Warehouse

    w = Warehouse(Path(root) / "warehouse.duckdb")
    w.ensure_schema()
    return w


def _q(root, sql, params=None):
    with _wh(root).connect() as con:
        return store.fetch(con, sql, params)


def _assets():
    from assets.consent import (
        checkpoint_flags,
        consent_grants,
        training_set_clean,
        training_views,
    )
    from assets.splits import (
        contamination,
        dedup_clusters,
        holdout_manifest,
        split_assignments,
    )
    from assets.tasks import task_suite

    return {"task_suite": task_suite, "dedup_clusters": dedup_clusters, "split_assignments": split_assignments,
            "contamination": contamination, "holdout_manifest": holdout_manifest, "consent_grants": consent_grants,
            "training_views": training_views, "training_set_clean": training_set_clean,
            "checkpoint_flags": checkpoint_flags}


CONSENT_ONLY = ("consent_grants", "training_views", "training_set_clean", "checkpoint_flags")


def run(root, cache, *, limit=LIMIT, only=None, dedup=None, consent=None):
    from dagster import DagsterInstance, materialize

    from resources import WarehouseResource

    ops = {"task_suite": {"config": {"cache_dir": str(cache), "limit": limit, "per_problem": PER}},
           "dedup_clusters": {"config": {"chart": True, **(dedup or {})}},
           "consent_grants": {"config": consent or {}},
           "training_views": {"config": {"now": NOW}}, "checkpoint_flags": {"config": {"now": NOW}}}
    defs = _assets()
    names = set(only or defs)
    picked = [defs[k] for k in names]
    return materialize(picked, resources={"warehouse": WarehouseResource(home=str(root))},
                       run_config={"ops": {k: v for k, v in ops.items() if k in names}},
                       instance=DagsterInstance.ephemeral(), raise_on_error=False)


def materialized(res) -> set[str]:
    return {e.asset_key.to_user_string() for e in res.get_asset_materialization_events()}


def checks(res) -> dict[str, bool]:
    return {e.check_name: e.passed for e in res.get_asset_check_evaluations()}


def failures(res) -> dict[str, str]:
    return {e.step_key: e.event_specific_data.error.to_string() for e in res.all_events
            if e.event_type_value == "STEP_FAILURE"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A suite cache for this module (`make test` runs with -p no:cacheprovider)."""
    return tmp_path_factory.mktemp("humaneval-suite")


@pytest.fixture(scope="module")
def base(tmp_path_factory, cache):
    """A home with tasks, trajectories (synthetic, per-task, consent cases), a registry, and one
    successful governance run (holdout locked)."""
    from ratchet.home import get_home
    from sandboxes.humaneval import build_suite

    root = tmp_path_factory.mktemp("base") / "rh"
    get_home(root).ensure()
    suite = build_suite(seed=0, limit=LIMIT, per_problem=PER, cache_dir=cache)
    per_task = [_record(f"he-{i}", "acme", "CONSENT-ACME-TRN-2026-09", f"{t.issue_title}\n\n{t.issue_body}",
                        task_id=t.task_id, repo=t.repo, issue=t.issue_id, patch=t.metadata["fix_diff"])
                for i, t in enumerate(suite.tasks[::3])]
    cases = [_record(tid, tenant, consent, f"Case {tid}: the {tid} handler drops the last item of a batch.",
                     repo=f"{tenant}/cases", issue=f"{tid}#1", ended=ended) for tid, tenant, consent, ended, _ in CONSENT_CASES]
    _ingest(root, "synthetic.jsonl", synthetic=40)
    _ingest(root, "crafted.jsonl", per_task + cases)
    (root / "consent_registry.yaml").write_text(REGISTRY)
    res = run(root, cache)
    return {"root": root, "res": res, "suite": suite, "per_task": per_task, "cache": cache}


@pytest.fixture
def home_copy(base, tmp_path, monkeypatch):
    root = tmp_path / "rh"
    shutil.copytree(base["root"], root)
    monkeypatch.setenv("RATCHET_HOME", str(root))
    return root


def test_definitions_wire_governance_into_the_graph():
    from dagster import AssetKey

    from pipelines.definitions import defs

    g = defs.resolve_asset_graph()
    up = {k: {p.to_user_string() for p in g.get(AssetKey(k)).parent_keys}
          for k in ("dedup_clusters", "dedup_edges", "split_assignments", "holdout_manifest", "training_set",
                    "consent_audit", "checkpoint_flags")}
    assert up["dedup_clusters"] == up["dedup_edges"] == {"tasks", "trajectories"}
    assert up["split_assignments"] == {"dedup_clusters"} and up["holdout_manifest"] == {"split_assignments"}
    assert {"split_assignments", "holdout_manifest", "consent_grants"} <= up["training_set"] == up["consent_audit"]
    blocking = {k.name: g.get_check_spec(k).blocking for k in g.asset_check_keys}
    assert blocking["contamination"] and blocking["training_set_clean"]
    assert g.get(AssetKey("tasks")).group_name == "tasks"
    assert {g.get(AssetKey(k)).group_name for k in ("dedup_clusters", "split_assignments", "holdout_manifest")} == {"governance"}
    job = defs.resolve_job_def("governance_job")  # raises if the job is missing
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {
        "tasks", "dedup_clusters", "dedup_edges", "split_assignments", "holdout_manifest", "consent_grants",
        "training_set", "consent_audit", "checkpoint_flags"}


def test_graph_materialises_and_every_check_passes(base):
    res, root = base["res"], base["root"]
    assert res.success, failures(res)
    assert checks(res) == {"contamination": True, "training_set_clean": True}
    assert materialized(res) >= {"tasks", "dedup_clusters", "dedup_edges", "split_assignments", "holdout_manifest",
                                 "consent_grants", "training_set", "consent_audit", "checkpoint_flags"}
    n_tasks = len(base["suite"].tasks)
    assert _q(root, "SELECT count(*) AS n FROM tasks")[0]["n"] == n_tasks
    t = _q(root, "SELECT * FROM tasks LIMIT 1")[0]
    assert t["slice"] and t["solution"] and t["environment_digest"].startswith("sha256:") and json.loads(t["bundle"])["task_id"]
    # mutants of one HumanEval problem (one repo) always land in one split
    per_problem = _q(root, """SELECT t.repo, count(DISTINCT s.split) AS splits FROM split_assignments s
                              JOIN tasks t ON s.source_id = t.task_id AND s.kind = 'task' GROUP BY 1""")
    assert len(per_problem) == LIMIT and all(r["splits"] == 1 for r in per_problem)
    # a trajectory of a task shares its task's split (same_task edge)
    pairs = _q(root, """SELECT st.split AS task_split, sr.split AS traj_split FROM trajectories r
                        JOIN split_assignments sr ON sr.id = 'traj:' || r.record_id
                        JOIN split_assignments st ON st.id = 'task:' || r.task_id""")
    assert len(pairs) == len(base["per_task"]) and all(p["task_split"] == p["traj_split"] for p in pairs)
    assert {"same_task", "same_repo"} <= {r["reason"] for r in _q(root, "SELECT DISTINCT reason FROM dedup_edges")}
    # the holdout is locked: file, table rows and the log agree
    m = json.loads((root / "holdout_manifest.json").read_text())
    held = sorted(r["source_id"] for r in _q(root, "SELECT source_id FROM split_assignments WHERE kind='task' AND split='holdout'"))
    assert m["locked"] and m["task_ids"] == held and held
    assert {r["manifest_sha256"] for r in _q(root, "SELECT * FROM holdout_manifest")} == {m["sha256"]}
    assert [(r["event"], r["manifest_sha256"]) for r in _q(root, "SELECT * FROM holdout_manifest_log")] == [("lock", m["sha256"])]
    meta = res.asset_materializations_for_node("holdout_manifest")[0].metadata
    assert meta["event"].value == "locked" and meta["manifest_sha256"].value == m["sha256"]
    split_meta = res.asset_materializations_for_node("split_assignments")[0].metadata
    assert "| **all tasks** |" in split_meta["by_slice"].value
    dmeta = res.asset_materializations_for_node("dedup_clusters")[0].metadata
    assert dmeta["chart"].value.startswith("![cluster sizes](data:image/png;base64,iVBOR")   # the PNG itself, inline
    assert (root / dmeta["chart_file"].value).exists() and not Path(dmeta["chart_file"].value).is_absolute()
    assert meta["path"].value == "holdout_manifest.json"                                      # relative: the home can move
    rep = _q(root, "SELECT * FROM contamination_report")
    assert len(rep) == 1 and rep[0]["passed"] and rep[0]["overlap_fraction"] == 0.0
    # training rows: train split only, the owner's or an explicitly shared grant
    bad = _q(root, """SELECT ts.* FROM training_set ts JOIN split_assignments s ON s.id = 'traj:' || ts.record_id
                      WHERE s.split <> 'train' OR (ts.owner_tenant_id <> ts.tenant_id AND ts.consent_id <> 'CONSENT-HOOLI-SHARED')""")
    assert bad == [] and _q(root, "SELECT count(*) AS n FROM training_set")[0]["n"] > 0


def test_consent_exclusions_carry_the_right_reason(base):
    root = base["root"]
    audit = {(r["trajectory_id"], r["target_tenant"]): r for r in _q(root, "SELECT * FROM consent_audit")}
    train = {(r["trajectory_id"], r["tenant_id"]) for r in _q(root, "SELECT * FROM v_training_set")}
    for tid, tenant, _consent, _ended, reason in CONSENT_CASES:
        if reason:
            assert audit[(tid, tenant)]["reason"] == reason, (tid, audit[(tid, tenant)])
            assert (tid, tenant) not in train
    # the synthetic trajectories share one train cluster (same patch): consented, so trained, per owner only
    assert ("c-shared", "hooli") in train and ("c-shared", "acme") in train      # explicit cross-tenant grant
    assert audit[("traj-0000001", "acme")]["reason"] == "cross_tenant"          # a globex trajectory
    assert ("traj-0000001", "globex") in train and ("traj-0000000", "acme") in train
    held = _q(root, """SELECT DISTINCT a.reason, a.split FROM consent_audit a JOIN trajectories t USING (record_id)
                       WHERE t.trajectory_id LIKE 'he-%' AND a.target_tenant = 'acme'""")
    assert held and {r["reason"] for r in held} == {"not_train_split"} and {r["split"] for r in held} <= {"val", "holdout"}
    summary = {(r["target_tenant"], r["reason"]): r["trajectories"] for r in _q(root, "SELECT * FROM v_consent_audit_summary")}
    assert summary[("initech", "revoked")] == 1 and summary[("acme", "cross_tenant")] > 0


def test_planted_near_duplicate_fails_contamination_and_blocks_downstream(base, home_copy):
    root = home_copy
    task = _q(root, """SELECT t.task_id, t.issue_text FROM tasks t JOIN split_assignments s ON s.source_id = t.task_id
                       WHERE s.split = 'holdout' ORDER BY 1 LIMIT 1""")[0]
    text = task["issue_text"] + " Seen in prod."           # MinHash ~0.92 against the task's issue
    _ingest(root, "planted.jsonl", [_record("planted-1", "acme", "CONSENT-ACME-TRN-2026-09", text,
                                            repo="acme/elsewhere", issue="acme/elsewhere#7", patch=None)])
    # a dedup threshold above the gate's lets the near-copy escape its cluster: the gate must catch it
    res = run(root, _cache(base), dedup={"threshold": 0.98})
    assert not res.success
    assert checks(res) == {"contamination": False}
    done = materialized(res)
    assert "split_assignments" in done and not done & {"holdout_manifest", "training_set"}
    ev = next(e for e in res.get_asset_check_evaluations() if e.check_name == "contamination")
    assert ev.metadata["pairs_by_kind"].value["minhash"] >= 1 and ev.metadata["overlap_pct"].value > 0
    last = _q(root, "SELECT * FROM contamination_report ORDER BY checked_at DESC LIMIT 1")[0]
    assert not last["passed"]
    pairs = _q(root, "SELECT * FROM contamination_pairs WHERE kind = 'minhash'")
    assert any({p["a"], p["b"]} & {f"task:{task['task_id']}"} for p in pairs)
    assert not _q(root, "SELECT * FROM training_set t JOIN trajectories r USING (record_id) WHERE r.trajectory_id = 'planted-1'")
    # with the default threshold the near-copy joins the holdout task's cluster: clean again, never trained on
    res = run(root, _cache(base))
    assert res.success and checks(res)["contamination"]
    s = _q(root, """SELECT s.split FROM split_assignments s JOIN trajectories r ON s.id = 'traj:' || r.record_id
                    WHERE r.trajectory_id = 'planted-1'""")
    assert s == [{"split": "holdout"}]


def _cache(base):
    return base["cache"]


def test_more_data_never_moves_a_holdout_task(base, home_copy):
    root = home_copy
    before = json.loads((root / "holdout_manifest.json").read_text())
    old_tasks = {r["task_id"] for r in _q(root, "SELECT task_id FROM tasks")}
    _ingest(root, "more.jsonl", synthetic=30, start=1000)
    res = run(root, _cache(base), limit=MORE)
    assert res.success, failures(res)
    after = json.loads((root / "holdout_manifest.json").read_text())
    assert after["sha256"] == before["sha256"] and after["version"] == 1
    rows = _q(root, "SELECT * FROM split_assignments WHERE kind = 'task'")
    assert len({r["source_id"] for r in rows} - old_tasks) >= 4 * (MORE - LIMIT) - 4   # new problems arrived
    hold = sorted(r["source_id"] for r in rows if r["split"] == "holdout")
    assert hold == before["task_ids"]                                     # not one moved, none added
    assert all(r["reason"] == "locked_holdout" for r in rows if r["split"] == "holdout")
    assert [r["event"] for r in _q(root, "SELECT event FROM holdout_manifest_log ORDER BY seq")] == ["lock", "verify"]
    assert res.asset_materializations_for_node("holdout_manifest")[0].metadata["event"].value == "verified"


def test_tampered_or_missing_manifest_fails_the_run(base, home_copy):
    from ratchet.governance.manifest import create_manifest, save_manifest

    root = home_copy
    path = root / "holdout_manifest.json"
    m = json.loads(path.read_text())
    forged = create_manifest(m["task_ids"][1:] + ["humaneval-999-forged"], locked_by="mallory")
    save_manifest(forged, path)                      # self-consistent hash, different ids
    before = _q(root, "SELECT id, split FROM split_assignments ORDER BY id")
    res = run(root, _cache(base))
    assert not res.success
    err = failures(res)
    assert set(err) == {"split_assignments"} and "ManifestError" in err["split_assignments"]
    assert "differs from the recorded" in err["split_assignments"]
    assert not materialized(res) & {"split_assignments", "holdout_manifest", "training_set"}
    assert _q(root, "SELECT id, split FROM split_assignments ORDER BY id") == before
    path.unlink()
    res = run(root, _cache(base))
    assert not res.success and "missing" in failures(res)["split_assignments"]


def test_missing_registry_is_a_clear_error_unless_allowed(base, home_copy):
    root = home_copy
    (root / "consent_registry.yaml").unlink()
    res = run(root, _cache(base), only=CONSENT_ONLY)
    err = failures(res)
    assert not res.success and "consent_registry.yaml" in err["consent_grants"] and "allow_missing" in err["consent_grants"]
    res = run(root, _cache(base), only=CONSENT_ONLY, consent={"allow_missing": True})
    assert res.success, failures(res)
    assert _q(root, "SELECT count(*) AS n FROM training_set")[0]["n"] == 0
    reasons = {r["reason"] for r in _q(root, "SELECT DISTINCT reason FROM consent_audit")}
    assert reasons <= {"missing_consent", "unknown_consent"} and "unknown_consent" in reasons
    assert all("registry is empty or missing" in r["detail"] for r in _q(root, "SELECT detail FROM consent_audit"))


def test_revoking_a_grant_purges_training_rows_and_flags_checkpoints(base, home_copy):
    root = home_copy
    acme = [r["record_id"] for r in _q(root, "SELECT record_id FROM training_set WHERE tenant_id = 'acme' "
                                             "AND consent_id = 'CONSENT-ACME-TRN-2026-09'")]
    assert acme
    with _wh(root).connect() as con:
        checkpoints.register_checkpoint(con, "ck-acme-sft-1", "acme", acme)
        checkpoints.register_checkpoint(con, "ck-globex-sft-1", "globex",
                                  [r[0] for r in con.execute("SELECT record_id FROM training_set WHERE tenant_id = 'globex'").fetchall()])
    reg = root / "consent_registry.yaml"
    reg.write_text(reg.read_text().replace("tenant_id: acme, scopes: [execute, train], retention_days: 90, granted_at: 2026-09-01}",
                                           "tenant_id: acme, scopes: [execute, train], retention_days: 90, granted_at: 2026-09-01, "
                                           "revoked_at: 2026-11-14}"))
    res = run(root, _cache(base), only=CONSENT_ONLY)
    assert res.success, failures(res)
    assert checks(res) == {"training_set_clean": True}
    assert not _q(root, "SELECT * FROM training_set WHERE consent_id = 'CONSENT-ACME-TRN-2026-09'")
    revoked = {r["record_id"] for r in _q(root, "SELECT record_id FROM consent_audit WHERE target_tenant = 'acme' AND reason = 'revoked'")}
    assert set(acme) <= revoked
    cks = {r["checkpoint_id"]: r for r in _q(root, "SELECT * FROM checkpoints")}
    assert cks["ck-acme-sft-1"]["flagged"] and "CONSENT-ACME-TRN-2026-09" in cks["ck-acme-sft-1"]["flag_reason"]
    assert not cks["ck-globex-sft-1"]["flagged"]
    assert res.asset_materializations_for_node("checkpoint_flags")[0].metadata["newly_flagged"].value == ["ck-acme-sft-1"]


def test_holdout_unlock_cli_needs_reason_and_actor_and_is_audited(base, home_copy, capsys):
    from pipelines.cli import main

    root = home_copy
    with pytest.raises(SystemExit):
        main(["--home", str(root), "holdout", "unlock", "--actor", "alice"])
    assert main(["--home", str(root), "holdout", "unlock", "--reason", "  ", "--actor", "alice"]) == 2
    assert main(["--home", str(root), "holdout", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shown["verified"] and shown["locked"] and shown["version"] == 1
    before = shown["sha256"]
    assert main(["--home", str(root), "holdout", "unlock", "--reason", "grow the holdout to 400", "--actor", "alice"]) == 0
    log = _q(root, "SELECT event, actor, reason FROM holdout_manifest_log ORDER BY seq")
    assert log[-1] == {"event": "unlock", "actor": "alice", "reason": "grow the holdout to 400"}
    assert not json.loads((root / "holdout_manifest.json").read_text())["locked"]
    # the next run re-locks a new version; the old holdout tasks stay (previous assignments are kept)
    res = run(root, _cache(base))
    assert res.success, failures(res)
    m = json.loads((root / "holdout_manifest.json").read_text())
    old = _q(root, "SELECT task_id FROM holdout_manifest WHERE version = 1")
    assert m["locked"] and m["version"] == 2 and {r["task_id"] for r in old} <= set(m["task_ids"])
    assert m["audit"][-1]["actor"] == "alice" and before
    assert main(["--home", str(root), "holdout", "show", "--json"]) == 0
