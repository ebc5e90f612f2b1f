"""The training assets on a tiny configuration: base_policy -> sft_checkpoint -> rl_checkpoint for
one candidate partition, over a real DuckDB warehouse (ingested fixture trajectories, the consent
gate's training_set, train-split tasks) and a real MLflow sqlite store under tmp_path. Lineage:
model versions with their tags, per-step metrics, the curve; revoking the grant flags both; and
the training gate (ratchet.training.gate) that refuses to train on unchecked or stale evidence."""
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.training

# the training gate re-decides consent at the real now (grants expire 90 days after a trajectory),
# so the fixture's times are relative to it, not a date that would expire
NOW = datetime.now(UTC).replace(microsecond=0)
GRANTS = [
    {"consent_id": "C-ACME", "tenant_id": "acme", "scopes": "train;eval", "retention_days": 90,
     "granted_at": "2026-09-01T00:00:00Z"},
    {"consent_id": "C-GLOBEX", "tenant_id": "globex", "scopes": "train", "retention_days": 90,
     "granted_at": "2026-09-01T00:00:00Z"}]


def _native(t, i, tenant, consent, tools):
    ended = NOW - timedelta(days=3)
    return {"schema_version": "ratchet.trajectory/v1", "trajectory_id": f"{tenant}-{i:02d}", "tenant_id": tenant,
            "consent_id": consent, "task_id": t["task_id"], "repo": "humaneval", "agent_id": t["agent_id"],
            "started_at": (ended - timedelta(minutes=1)).isoformat(), "ended_at": ended.isoformat(),
            "messages": t["messages"], "tools": tools,
            "outcome": {"tests_passed": t["tests_passed"], "accepted": t["accepted"], "human_edited": False}}


@pytest.fixture
def warehouse_home(tmp_path, trajectories, tools):
    """Upstream tables as the consent and split stages leave them: trajectories (ingested),
    consent_grants, training_set (the consent + split gate), tasks and their train split."""
    from ratchet import store, tables
    from ratchet.governance.consent import grant_rows, grants_from_rows
    from ratchet.governance.tables import TRAJ_PREFIX
    from ratchet.governance.tasks import task_rows
    from ratchet.governance.training_views import training_rows
    from ratchet.ingest import IngestOptions, ingest
    from ratchet.warehouse import Warehouse
    from sandboxes.humaneval import build_suite

    wh = Warehouse(tmp_path / "warehouse.duckdb")
    wh.ensure_schema()
    # acme: two accepted expert runs and a rejected noisy run of the first one's task (a DPO pair);
    # globex: one accepted run that must never reach acme's candidate
    expert = [t for t in trajectories if t["agent_id"].startswith("expert")]
    noisy = next(t for t in trajectories if t["task_id"] == expert[0]["task_id"] and not t["accepted"])
    plan = [(expert[0], "acme", "C-ACME"), (noisy, "acme", "C-ACME"), (expert[2], "acme", "C-ACME"),
            (expert[3], "globex", "C-GLOBEX")]
    path = tmp_path / "logs.jsonl"
    path.write_text("".join(json.dumps(_native(t, i, ten, c, tools)) + "\n" for i, (t, ten, c) in enumerate(plan)))
    ingest([path], wh, IngestOptions(workers=1))
    grants = grants_from_rows(GRANTS)
    bundles = build_suite(seed=0, limit=2, per_problem=2, cache_dir=tmp_path / "suite").tasks
    with wh.connect() as con:
        tables.ensure_all(con)
        store.insert(con, "consent_grants", grant_rows(grants))
        trajs = store.fetch(con, "SELECT record_id, trajectory_id, tenant_id, consent_id, task_id, started_at, "
                                 "ended_at, accepted, tests_passed FROM trajectories")
        train, _ = training_rows(trajs, grants, {t["record_id"]: {"split": "train", "cluster_id": t["task_id"]}
                                                 for t in trajs}, NOW)
        store.insert(con, "training_set", train)
        store.insert(con, "tasks", task_rows(bundles, "test"))
        store.insert(con, "split_assignments", [
            {"id": f"task:{b.task_id}", "kind": "task", "source_id": b.task_id, "cluster_id": b.task_id,
             "slice": None, "split": "train", "reason": "test", "tenant_id": None, "assigned_at": NOW}
            for b in bundles] + [
            {"id": f"{TRAJ_PREFIX}{t['record_id']}", "kind": "trajectory", "source_id": t["record_id"],
             "cluster_id": t["task_id"], "slice": t["tenant_id"], "split": "train", "reason": "test",
             "tenant_id": t["tenant_id"], "assigned_at": NOW} for t in trajs])
    _passed_report(wh, NOW + timedelta(seconds=1))          # the contamination check's verdict on these splits
    return tmp_path, wh


def _rejected(wh):
    from ratchet import store

    with wh.connect() as con:
        return store.fetch(con, "SELECT t.record_id FROM training_set ts JOIN trajectories t USING (record_id) "
                                "WHERE ts.tenant_id = 'acme' AND NOT t.accepted")


def test_training_module_loads_without_heavy_imports():
    code = ("import sys, assets.training as t; heavy = [m for m in ('torch', 'transformers', 'trl', 'mlflow') "
            "if m in sys.modules]; assert not heavy, heavy; import dagster as dg; "
            "from resources import MlflowTracking, WarehouseResource; d = dg.Definitions.merge(t.defs, "
            "dg.Definitions(resources={'warehouse': WarehouseResource(), 'tracking': MlflowTracking()})); "
            "g = d.resolve_asset_graph(); print(sorted(k.to_user_string() for k in g.get_all_asset_keys())); "
            "print(sorted(k.to_user_string() for k in g.get(dg.AssetKey('rl_checkpoint')).parent_keys)); "
            "print(d.resolve_job_def('train_candidate').partitions_def.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert {"base_policy", "sft_checkpoint", "dpo_checkpoint", "rl_checkpoint"} <= set(eval(out[0]))
    assert eval(out[1]) == ["sft_checkpoint", "split_assignments", "training_set"] and out[2] == "candidates"


def test_candidate_trains_sft_then_rl_with_lineage_and_consent_flags(warehouse_home):
    import dagster as dg
    from mlflow.tracking import MlflowClient

    from assets.training import (
        CANDIDATES,
        base_policy,
        dpo_checkpoint,
        register_candidate,
        rl_checkpoint,
        sft_checkpoint,
    )
    from ratchet import store
    from ratchet.governance.checkpoints import flag_checkpoints
    from ratchet.training.data import data_manifest, tenant_training_rows
    from resources import MlflowTracking, WarehouseResource

    home, wh = warehouse_home
    resources = {"warehouse": WarehouseResource(home=str(home)), "tracking": MlflowTracking(home=str(home))}
    instance = dg.DagsterInstance.ephemeral()
    key = register_candidate(instance, "acme", "c1")
    assert key == "acme:c1" and instance.get_dynamic_partitions(CANDIDATES.name) == ["acme:c1"]
    tiny_base = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 512, "task_limit": 2}
    cfg = {"ops": {
        "base_policy": {"config": tiny_base},
        "sft_checkpoint": {"config": {"max_steps": 3, "batch_size": 1, "max_length": 2048, "learning_rate": 1e-2}},
        "dpo_checkpoint": {"config": {"max_steps": 2, "batch_size": 1, "max_length": 2048}},
        "rl_checkpoint": {"config": {"steps": 2, "tasks_per_step": 1, "group_size": 2, "max_tokens": 24,
                                     "max_turns": 1, "task_limit": 2}}}}
    r1 = dg.materialize([base_policy], instance=instance, resources=resources,
                        run_config={"ops": {"base_policy": cfg["ops"]["base_policy"]}})
    assert r1.success
    stages = ("sft_checkpoint", "dpo_checkpoint", "rl_checkpoint")
    r2 = dg.materialize([sft_checkpoint, dpo_checkpoint, rl_checkpoint], instance=instance, resources=resources,
                        partition_key=key, run_config={"ops": {k: cfg["ops"][k] for k in stages}})
    assert r2.success
    mats = {m.asset_key.to_user_string(): m.metadata for k in stages for m in r2.asset_materializations_for_node(k)}
    for k in stages:
        assert mats[k]["learning_curve"].value.startswith("![learning curve](data:image/png;base64,")
        assert "/#/experiments/" in mats[k]["mlflow_run"].value
        assert mats[k]["mlflow_run"].value.endswith("/runs/" + mats[k]["mlflow_run_id"].value)
        assert not any(str(v).startswith("/") for v in mats[k]["lineage"].value.values()), "paths: relative to the home"
    assert mats["rl_checkpoint"]["steps"].value == 2
    # the SFT checkpoint says which of its rows trained, per source format (the embedded base: structured)
    with wh.connect() as con:
        cov = con.execute("SELECT checkpoint_id, tenant_id, sft_data, trajectories, trained FROM v_sft_coverage").fetchall()
    assert cov == [(mats["sft_checkpoint"]["checkpoint_id"].value, "acme", "structured", 2, 2)]
    assert mats["sft_checkpoint"]["sft_data"].value == "structured"
    # no val-split task in this warehouse: the last saved step is the one registered
    assert mats["rl_checkpoint"]["validation_tasks"].value == 0 and mats["rl_checkpoint"]["registered_step"].value == 2
    assert mats["rl_checkpoint"]["stopped"].value == ""
    for k in stages:                                 # each stage says what the gate read
        assert mats[k]["gate"].value["contamination"]["passed"] is True, k
        assert mats[k]["gate"].value["training_set_violations"] == 0, k
    # the view names the task by default (RecipeSettings.hide_task): the metadata says what the
    # checkpoint saved
    from ratchet.home import get_home
    from ratchet.policy.embedded.decoding import read_view
    saved = read_view(get_home(home).root / mats["sft_checkpoint"]["checkpoint"].value)
    assert mats["sft_checkpoint"]["task_in_view"].value == "shown" and "task" not in (saved or {})

    # MLflow: one registered model for the candidate, a version per stage, lineage tags
    with wh.connect() as con:
        rows = tenant_training_rows(con, "acme")
    manifest = data_manifest(rows)
    assert len(rows) == 2                                       # globex's trajectory never reaches acme
    c = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    versions = {v.tags["ratchet.stage"]: v for v in c.search_model_versions("name='ratchet-acme-c1'")}
    # RL's step checkpoint before its final one (2 steps, a checkpoint every step) is a version too
    assert set(versions) == {"sft", "dpo", "rl", "rl-step"}
    sft, dpo, rl, step = versions["sft"], versions["dpo"], versions["rl"], versions["rl-step"]
    assert step.tags["ratchet.step"] == "1" and mats["rl_checkpoint"]["step_versions"].value == {
        "1": f"ratchet-acme-c1/{step.version}"}
    assert 0 < float(step.tags["ratchet.cpu_s"]) < float(rl.tags["ratchet.cpu_s"])
    from ratchet.training.lineage import REGISTERED
    rl_dir = get_home(home).root / mats["rl_checkpoint"]["checkpoint"].value
    assert (rl_dir.parent / "step-00001" / REGISTERED).exists()     # a re-run skips it
    with_rejected = data_manifest([*rows, *_rejected(wh)])
    assert dpo.tags["ratchet.manifest_sha256"] == with_rejected["manifest_sha256"]     # SFT's data + the pair's
    assert dpo.tags["ratchet.parent_checkpoint"] == f"ratchet-acme-c1/{sft.version}"
    assert sft.tags["ratchet.environment_digest"] != rl.tags["ratchet.environment_digest"]
    # RL's digest names the turn budget its episodes ran under (max_turns 1), not the tasks' own limit
    import json as _json

    from ratchet.evaluation.runner import with_turn_budget
    from ratchet.training.data import TRAIN_TASKS_SQL
    from ratchet.training.lineage import environment_digest
    from ratchet.training.recipe import curriculum
    from sandboxes.bundle import TaskBundle
    used = curriculum([TaskBundle.from_dict(t["bundle"] if isinstance(t["bundle"], dict) else _json.loads(t["bundle"])) for t in store.Store(wh).read(TRAIN_TASKS_SQL)[:2]], rows)
    assert rl.tags["ratchet.environment_digest"] == environment_digest(
        with_turn_budget(b, 1).environment_digest for b in used)
    assert rl.tags["ratchet.environment_digest"] != environment_digest(b.environment_digest for b in used)
    for v in (sft, dpo, rl, step):
        assert v.tags["ratchet.manifest_sha256"] == (with_rejected if v is dpo else manifest)["manifest_sha256"]
        assert v.tags["ratchet.consent_ids"] == "C-ACME" and v.tags["ratchet.dagster_run_id"] == r2.run_id
        assert float(v.tags["ratchet.cpu_s"]) > 0 and len(v.tags["ratchet.environment_digest"]) == 64
    assert rl.tags["ratchet.parent_checkpoint"] == step.tags["ratchet.parent_checkpoint"] == f"ratchet-acme-c1/{sft.version}"
    assert step.tags["ratchet.environment_digest"] == rl.tags["ratchet.environment_digest"]
    assert "base-" in sft.tags["ratchet.parent_checkpoint"]
    for name in ("loss", "reward", "kl", "pass_rate", "entropy"):
        assert len(c.get_metric_history(rl.run_id, name)) == 2, name
    assert len(c.get_metric_history(sft.run_id, "loss")) == 3
    arts = {a.path for a in c.list_artifacts(rl.run_id)}
    assert {"rl_curve.png", "manifest.json", "checkpoint"} <= arts

    # Consent: nothing flagged while the grant stands; revoking it flags SFT and its RL child
    with wh.connect() as con:
        reg = store.fetch(con, "SELECT checkpoint_id, consent_ids, trained_record_ids FROM checkpoints ORDER BY 1")
        assert [r["checkpoint_id"] for r in reg] == sorted(f"ratchet-acme-c1/{v.version}" for v in (sft, dpo, rl, step))
        assert all(set(r["trained_record_ids"]) >= set(manifest["record_ids"]) for r in reg)
        assert all(r["consent_ids"] == ["C-ACME"] for r in reg)
        _, new = flag_checkpoints(con, NOW)
        assert new == []
        con.execute("UPDATE consent_grants SET revoked_at = ? WHERE consent_id = 'C-ACME'", [NOW])
        _, new = flag_checkpoints(con, NOW + timedelta(seconds=1))
    assert new == [r["checkpoint_id"] for r in reg]


def test_training_gate_refuses_unchecked_or_stale_evidence(warehouse_home):
    """Each way the governance evidence can be missing, failed or stale gets a refusal that names it
    and its fix; the assets refuse before any work (here: before base_policy exists)."""
    import dagster as dg

    from assets.training import register_candidate, rl_checkpoint, sft_checkpoint
    from ratchet.clock import now_utc
    from ratchet.training.gate import TrainingGateError, require_training_gate, training_gate
    from resources import MlflowTracking, WarehouseResource

    home, wh = warehouse_home

    def problems():
        with wh.connect() as con:
            return training_gate(con, "acme", now_utc())["problems"]

    assert problems() == []                                              # the fixture as the checks leave it
    with wh.connect() as con:
        con.execute("UPDATE split_assignments SET assigned_at = ?", [now_utc() + timedelta(minutes=5)])
    assert len(problems()) == 1 and "after the newest contamination check" in problems()[0]
    with wh.connect() as con:
        con.execute("UPDATE contamination_report SET checked_at = ?, passed = false, overlap_fraction = 0.02",
                    [now_utc() + timedelta(minutes=10)])
    assert len(problems()) == 1 and "failed: 2.00% of" in problems()[0]
    with wh.connect() as con:
        con.execute("DELETE FROM contamination_report")
    assert problems() == ["no contamination report: run the `contamination` check on split_assignments"]

    # the dagster path: both training assets refuse, naming the problem
    instance = dg.DagsterInstance.ephemeral()
    key = register_candidate(instance, "acme", "gated")
    resources = {"warehouse": WarehouseResource(home=str(home)), "tracking": MlflowTracking(home=str(home))}
    for asset in (sft_checkpoint, rl_checkpoint):
        r = dg.materialize([asset], instance=instance, resources=resources, partition_key=key, raise_on_error=False)
        assert not r.success
        err = next(e for e in r.all_events if e.is_step_failure).event_specific_data.error
        text = err.to_string()
        assert "TrainingGateError: training refused for tenant 'acme'" in text and "no contamination report" in text

    # a grant revoked after training_set was evaluated: the next batch would carry its rows
    _passed_report(wh, now_utc() + timedelta(minutes=10))
    assert problems() == []
    with wh.connect() as con:
        con.execute("UPDATE consent_grants SET revoked_at = ? WHERE consent_id = 'C-ACME'", [now_utc()])
    [p] = problems()
    assert "3 of tenant 'acme'" in p and "revoked" in p and "re-materialise training_set" in p
    with wh.connect() as con:
        # and training_set itself failing the training_set_clean query: globex's row in acme's view
        con.execute("UPDATE consent_grants SET revoked_at = NULL")
        con.execute("UPDATE training_set SET tenant_id = 'acme' WHERE tenant_id = 'globex'")
        with pytest.raises(TrainingGateError, match="training_set_clean re-check: 1 cross_tenant"):
            require_training_gate(con, "acme", now_utc())


def _passed_report(wh, at):
    """The `contamination` check's computation on the warehouse's splits, stored at `at`."""
    from ratchet import store
    from ratchet.clock import now_utc
    from ratchet.governance.contamination import contamination_report, report_tables
    from ratchet.governance.items import CONTAMINATION_KEYS, ITEMS_SQL, PREVIOUS_SPLITS_SQL

    st = store.Store(wh)
    rep = contamination_report(st.read(PREVIOUS_SPLITS_SQL), st.arrow(ITEMS_SQL), id_col="id", text_col="text",
                               code_cols=("code",), key_cols=CONTAMINATION_KEYS, threshold=0.8, max_examples=5)
    assert rep["passed"]
    st.append(report_tables(rep, at, "test"))


def test_a_pretrained_base_is_tested_for_membership_of_the_holdout(warehouse_home, pretrained_base):
    """base_policy with a pretrained (or user) base runs the membership test on the holdout's
    reference solutions and records it; promotion's evidence and the scorecard read it back."""
    import dagster as dg

    from assets.training import base_policy
    from ratchet.evaluation.io import membership_note
    from ratchet.promotion.evidence import pretraining_membership
    from resources import WarehouseResource

    home, wh = warehouse_home
    with wh.connect() as con:
        con.execute("UPDATE split_assignments SET split = 'holdout' WHERE kind = 'task' AND source_id IN "
                    "(SELECT source_id FROM split_assignments WHERE kind = 'task' ORDER BY source_id LIMIT 2)")
    r = dg.materialize([base_policy], resources={"warehouse": WarehouseResource(home=str(home))},
                       run_config={"ops": {"base_policy": {"config": {"spec": str(pretrained_base),
                                                                        "membership_tasks": 5}}}})
    assert r.success
    meta = r.asset_materializations_for_node("base_policy")[0].metadata
    rep = meta["membership"].value
    assert rep["programs"] == 1 and rep["control_programs"] == 12       # two mutants of one problem: one solution
    with wh.connect() as con:
        got, source = pretraining_membership(con)
        row = con.execute("SELECT * FROM base_membership").fetchdf().to_dict("records")[0]
    assert got["excess_gap"] == rep["excess_gap"] and got["likely_seen"] == rep["likely_seen"]
    assert source.startswith("base_membership of ") and "over 1 programs" in source
    assert ("has likely seen" in membership_note(row)) == rep["likely_seen"]
