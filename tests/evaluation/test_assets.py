"""The evaluation assets in-process (dagster.materialize, ephemeral instance) on a tiny locked
holdout: policy x seed partitions, resume, summary, economics, scorecard (+ MLflow), the judge's
kappa checks, and the refusal on a tampered manifest."""
import json

import pytest

pytestmark = pytest.mark.evaluation

POLICIES = ("harness:sbfl", "scripted:noisy")


def _materialize(assets, root, instance, *, partition=None, ops=None, checks=()):
    from dagster import MultiPartitionKey, materialize

    from resources import MlflowTracking, WarehouseResource

    key = MultiPartitionKey({"policy": partition[0], "seed": partition[1]}) if partition else None
    return materialize([*assets, *checks], partition_key=key, instance=instance, raise_on_error=False,
                       resources={"warehouse": WarehouseResource(home=str(root)),
                                  "tracking": MlflowTracking(home=str(root))},
                       run_config={"ops": ops or {}})


@pytest.fixture
def instance():
    from dagster import DagsterInstance

    from assets.evaluation import register_policies

    inst = DagsterInstance.ephemeral()
    assert register_policies(inst, POLICIES) == list(POLICIES)
    assert register_policies(inst, POLICIES) == []          # idempotent
    return inst


def test_definitions_load_with_partitions_and_checks():
    from dagster import Definitions

    from assets.evaluation import defs
    from resources import MlflowTracking, WarehouseResource

    # the integrator merges `defs` with the shared resources, as here
    merged = Definitions.merge(defs, Definitions(resources={"warehouse": WarehouseResource(),
                                                            "tracking": MlflowTracking()}))
    repo = merged.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {"holdout_eval", "eval_summary", "judge_calibration", "economics", "scorecard"} <= keys
    pd = repo.assets_defs_by_key[next(k for k in repo.asset_graph.get_all_asset_keys()
                                      if k.to_user_string() == "holdout_eval")].partitions_def
    assert sorted(pd.partition_dimension_names) == ["policy", "seed"]
    checks = {c.name for c in repo.asset_checks_defs_by_key}
    assert checks == {"judge_kappa_drift", "judge_kappa_gate"}


def test_holdout_eval_partitions_then_summary_economics_scorecard(holdout, home, instance):
    from assets.evaluation import economics, eval_summary, holdout_eval, judge_calibration, judge_kappa_drift, \
        judge_kappa_gate, scorecard
    from ratchet.evaluation import tables

    wh, path, tasks = holdout
    ops = {"holdout_eval": {"config": {"workers": 1, "task_limit": 2, "chunk": 4, "concurrency": 4}}}
    for p in POLICIES:
        for s in ("0", "1"):
            res = _materialize([holdout_eval], home.root, instance, partition=(p, s), ops=ops)
            assert res.success, p
    meta = res.asset_materializations_for_node("holdout_eval")[0].metadata
    assert meta["episodes"].value == 2 and meta["ran"].value == 2 and "/ " in meta["denominator"].value
    # a re-run of a finished partition resumes: nothing is run again
    again = _materialize([holdout_eval], home.root, instance, partition=(POLICIES[1], "1"), ops=ops)
    m2 = again.asset_materializations_for_node("holdout_eval")[0].metadata
    assert m2["ran"].value == 0 and m2["resumed_skipped"].value == 2
    with wh.connect() as con:
        assert con.execute("SELECT count(*) FROM eval_episodes").fetchall()[0][0] == 8

    res = _materialize([eval_summary, economics, scorecard, judge_calibration], home.root, instance,
                       checks=[judge_kappa_drift, judge_kappa_gate],
                       ops={"judge_calibration": {"config": {"n_boot": 200}}, "eval_summary": {"config": {"n_boot": 300}}})
    assert res.success
    checks = {e.check_name: e.passed for e in res.get_asset_check_evaluations()}
    assert checks == {"judge_kappa_drift": True, "judge_kappa_gate": True}
    with wh.connect() as con:
        summ = tables.fetch(con, "SELECT * FROM eval_summary WHERE dimension = 'all' ORDER BY policy_id")
        eco = tables.fetch(con, "SELECT * FROM economics ORDER BY policy_id")
        latest = tables.fetch(con, "SELECT policy_id FROM v_eval_latest ORDER BY 1")
    assert [r["policy_id"] for r in summ] == sorted(POLICIES) == [r["policy_id"] for r in latest]
    assert all(r["tasks"] == 2 and r["seeds"] == [0, 1] and "/ " in r["pass_rate_display"] for r in summ)
    noisy = next(r for r in summ if r["policy_id"] == "scripted:noisy")
    assert noisy["baseline_policy_id"] == "harness:sbfl" and noisy["diff_tasks"] is not None
    assert all(r["variable_per_accepted"] == "not computable" or r["variable_per_accepted"].startswith("$") for r in eco)
    md = (home.root / "scorecard.md").read_text()
    assert "| task success" in md and "harness:sbfl" in md and "scripted:noisy" in md
    sc = res.asset_materializations_for_node("scorecard")[0].metadata
    assert "data:image/png;base64," in sc["chart"].value and "mlflow_run" in sc
    # the run id rebuilds the link wherever the MLflow UI serves; the path holds after the home moves
    assert sc["mlflow_run"].value.endswith("/runs/" + sc["mlflow_run_id"].value)
    from assets.evaluation import SCORECARD_PATH_KEY

    assert sc[SCORECARD_PATH_KEY].value == "scorecard.md" and "path" not in sc
    assert list((home.root / "artifacts").glob("scorecard-*.png"))


def test_a_judge_below_the_gate_blocks_and_warns(holdout, home, instance):
    from assets.evaluation import judge_calibration, judge_kappa_drift, judge_kappa_gate

    res = _materialize([judge_calibration], home.root, instance, checks=[judge_kappa_drift, judge_kappa_gate],
                       ops={"judge_calibration": {"config": {"judge": "rubric-v1", "n_boot": 200}}})
    checks = {e.check_name: (e.passed, e.severity.value) for e in res.get_asset_check_evaluations()}
    assert checks == {"judge_kappa_drift": (False, "WARN"), "judge_kappa_gate": (False, "ERROR")}


def test_a_tampered_manifest_stops_the_evaluation_before_any_episode(holdout, home, instance):
    from assets.evaluation import holdout_eval

    wh, path, _ = holdout
    d = json.loads(path.read_text())
    d["locked"] = False                               # flipped by hand, not through `ratchet holdout unlock`
    path.write_text(json.dumps(d))
    res = _materialize([holdout_eval], home.root, instance, partition=("harness:sbfl", "0"))
    assert not res.success
    errors = [e.event_specific_data.error.to_string() for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert any("ManifestError" in e for e in errors)
    with wh.connect() as con:
        from ratchet.evaluation import tables

        tables.ensure(con)
        assert con.execute("SELECT count(*) FROM eval_episodes").fetchall()[0][0] == 0


def test_run_evaluation_is_what_the_demo_calls(holdout, home, capsys):
    from dagster import DagsterInstance

    from assets.evaluation import run_evaluation
    from resources import MlflowTracking, WarehouseResource

    res = {"warehouse": WarehouseResource(home=str(home.root)), "tracking": MlflowTracking(home=str(home.root))}
    instance = DagsterInstance.ephemeral()
    ok = run_evaluation(instance, res, policies=("scripted:expert",), seeds=("0",),
                        holdout_config={"workers": 1, "task_limit": 1},
                        report_ops={"scorecard": {"config": {"mlflow": False}},
                                    "judge_calibration": {"config": {"n_boot": 100, "max_items": 50}}})
    assert ok and "holdout_eval scripted:expert seed 0: ok" in capsys.readouterr().out
    # the run list names them (an anonymous materialize shows as __ephemeral_asset_job__), and the
    # report run carries the judge's kappa checks as before
    runs = instance.get_runs()
    assert sorted(r.job_name for r in runs) == ["evaluation_report_job", "holdout_eval_job"]
    report = next(r for r in runs if r.job_name == "evaluation_report_job")
    from dagster import DagsterEventType

    evals = instance.get_records_for_run(report.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records
    checks = {r.event_log_entry.dagster_event.event_specific_data.check_name for r in evals}
    assert checks == {"judge_kappa_drift", "judge_kappa_gate"}, checks
    from ratchet.evaluation.io import scorecard_text

    wh, _, _ = holdout
    text = scorecard_text(wh)
    import re

    # 1 scored task (or 0 when the one episode was an infra failure on a loaded machine: reported beside)
    assert "scripted:expert" in text and re.search(r"\b[01] / [01] tasks", text), text
