"""The promotion asset and sensor on a real warehouse file and a real MLflow store: wiring, a
clear failure without evaluation tables, a promotion, a second cycle against the new champion,
a rejection, and the sensor's run keys and cursor."""
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from ratchet.promotion import registry as R
from ratchet.promotion import state as S
from ratchet.store import insert
from ratchet.warehouse import Warehouse
from resources import MlflowTracking, WarehouseResource

from .helpers import seed_suite
from .synthetic import episodes, redteam_rows, tasks

pytestmark = pytest.mark.promotion
NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_defs_load_without_heavy_imports():
    code = ("import sys, assets.promotion as p; d = p.defs; "
            "assert [x.name for x in d.sensors] == ['promotion_sensor'] and [j.name for j in d.jobs] == ['promotion_job']; "
            "bad = [m for m in ('mlflow', 'torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    from assets.promotion import defs, promotion

    spec = next(iter(promotion.specs))
    assert spec.group_name == "promotion" and spec.owners == ["team:release"]
    assert dg.AssetKey("holdout_eval") in {d.asset_key for d in spec.deps}
    merged = dg.Definitions.merge(defs, dg.Definitions(resources={"warehouse": WarehouseResource(),
                                                                 "tracking": MlflowTracking()}))
    assert next(iter(defs.sensors)).default_status == dg.DefaultSensorStatus.RUNNING
    assert merged.resolve_job_def("promotion_job").name == "promotion_job"


def _env(root, uri, model):
    return {"warehouse": WarehouseResource(home=str(root)), "tracking": MlflowTracking(home=str(root), tracking_uri=uri),
            "root": root, "model": model}


@pytest.fixture
def env(tmp_path, mlflow_uri, request):
    return _env(tmp_path, mlflow_uri, request.node.name[:40])


def _run(env, **config):
    from assets.promotion import promotion

    config.setdefault("registered_model", env.get("model", "ratchet-policy"))
    return dg.materialize([promotion], resources={"warehouse": env["warehouse"], "tracking": env["tracking"]},
                          run_config={"ops": {"promotion": {"config": {"now": NOW.isoformat(), **config}}}},
                          raise_on_error=False)


def _meta(result):
    mats = result.asset_materializations_for_node("promotion")
    return {k: getattr(v, "value", v) for k, v in mats[0].metadata.items()}


def test_fails_clearly_without_evaluation_tables(env):
    res = _run(env)
    assert not res.success
    err = res.get_step_failure_events()[0].event_specific_data.error
    assert "eval_episodes" in err.message and "materialise holdout_eval" in err.message


def _seed(env, evidence=True, redteam=True):
    from ratchet.evaluation import tables as eval_tables
    from ratchet.promotion import redteam_check

    T = tasks(80, seed=1)
    wh = Warehouse(env["root"] / "warehouse.duckdb")
    wh.ensure_schema()
    with wh.connect() as con:
        eval_tables.ensure(con)
        if not con.execute("SELECT count(*) FROM tasks").fetchall()[0][0]:
            seed_suite(con, train=1, holdout=1)    # what the exploit library is replayed on
            if redteam:      # a passing replay of this environment, so the asset does not run one
                redteam_check.write(con, redteam_rows(redteam_check.plan(con).digest))
        eval_tables.write_episodes(con, episodes(T, "harness:sbfl", seed=1))
        eval_tables.write_episodes(con, episodes(T, "embedded:rl", checkpoint_version="1", p_shift=0.3,
                                                 violation_rate=0.0, latency=25, seed=2))
        eval_tables.write_episodes(con, episodes(T, "embedded:rl", checkpoint_version="2", p_shift=0.6,
                                                 violation_rate=0.0, latency=20, seed=3))
        later = [dict(r, started_at=r["started_at"] + timedelta(hours=1), finished_at=r["finished_at"] + timedelta(hours=1))
                 for r in episodes(T, "embedded:rl", checkpoint_version="3", p_shift=0.6, violation_rate=0.0,
                                   latency=20, seed=4, reward_bonus=0.2, judge_shift=-0.5)]
        eval_tables.write_episodes(con, later)     # the newest evaluation: the default candidate
        if evidence:
            eval_tables.append_rows(con, "judge_calibration", [{"computed_at": NOW, "judge_id": "rubric-v2",
                                                                "items": 120, "kappa": 0.86}])
            insert(con, "contamination_report", [{"checked_at": NOW, "passed": True, "overlap_fraction": 0.0,
                                                  "n_items": 1000}])
            insert(con, "checkpoints", [{"checkpoint_id": v, "tenant_id": "acme", "trained_record_ids": [],
                                         "consent_ids": [], "created_at": NOW, "flagged": v == "9"}
                                        for v in ("1", "2", "3", "9")])
    return wh


def test_promotes_then_the_next_cycle_must_beat_the_new_champion(env):
    wh = _seed(env)
    res = _run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1", canary_skip=True)
    assert res.success
    m = _meta(res)
    assert (m["verdict"], m["state"], m["champion_now"]) == ("pass", "promoted", "embedded:rl@1"), m["report"]
    assert "| beats_champion | hard | pass |" in m["report"] and m["champion_evaluated_against"] == "harness:sbfl (baseline)"
    c, name = env["tracking"].client(), env["model"]
    v1 = R.find_version(c, "embedded:rl", "1", name)
    assert R.current_aliases(c, name) == {"champion": v1, "canary": None, "candidate": None}

    # Repeating the same run (a second sensor tick) changes nothing.
    n = wh.query("SELECT count(*) AS n FROM promotions").column(0)[0].as_py()
    assert _run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1", canary_skip=True).success
    assert wh.query("SELECT count(*) AS n FROM promotions").column(0)[0].as_py() == n

    # The next candidate is judged against the new champion (v1), not the baseline.
    m = _meta(_run(env, canary_skip=True))          # default: the newest learned candidate that is not champion
    assert m["champion_evaluated_against"] == "embedded:rl@1"
    assert m["candidate"] == "embedded:rl@3" and m["state"] == "rejected" and "reward_hacking" in m["failing_gates"]
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="2", canary_skip=True))
    assert (m["state"], m["champion_now"]) == ("promoted", "embedded:rl@2"), m["report"]
    v2 = R.find_version(c, "embedded:rl", "2", name)
    assert R.current_aliases(c, name)["champion"] == v2

    with wh.connect() as con:
        _, restored, moved = R.rollback(con, c, actor="owner:alice", reason="incident", model_name=name)
    assert restored["checkpoint_version"] == "1" and moved == {"champion": (v2, v1)}


def test_without_canary_rows_the_candidate_waits_in_canary(env):
    _seed(env)
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1"))
    assert m["state"] == "canary" and m["canary"].startswith("wait")
    assert R.current_aliases(env["tracking"].client(), env["model"])["canary"] == m["model_version"]


def test_waits_until_every_seed_is_evaluated(env):
    from ratchet.evaluation import tables as eval_tables

    wh = _seed(env)
    with wh.connect() as con:
        con.execute("DELETE FROM eval_episodes WHERE policy_id = 'embedded:rl' AND checkpoint_version = '1' AND seed > 0")
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1", canary_skip=True))
    assert m["state"] == "waiting" and "fewer than 3 seeds" in m["verdict"]
    assert wh.query("SELECT count(*) FROM promotions").column(0)[0].as_py() == 0
    T = tasks(80, seed=1)
    with wh.connect() as con:
        eval_tables.write_episodes(con, episodes(T, "embedded:rl", checkpoint_version="1", p_shift=0.3,
                                                 violation_rate=0.0, latency=25, seed=2))
    assert _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1",
                      canary_skip=True))["state"] == "promoted"


def test_missing_evidence_and_revoked_lineage_reject(env):
    wh = _seed(env, evidence=False)
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1", canary_skip=True))
    assert m["state"] == "rejected" and {"judge_kappa", "contamination", "consent"} <= set(m["failing_gates"])
    _seed(env)       # now with evidence, and checkpoint "9" flagged as trained on a revoked grant
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="2",
                   checkpoint_id="9", canary_skip=True))
    assert (m["state"], m["failing_gates"]) == ("rejected", ["consent"]), m["report"]
    with wh.connect() as con:
        assert S.current_champion(con) is None


def test_the_asset_replays_the_exploit_library_once_per_environment(env, runtime):
    """No replay of the environment stored: the asset runs the library in real sandboxes, writes
    `reward_redteam` and gates on it; the next promotion in the same environment reuses it."""
    wh = _seed(env, redteam=False)
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1", canary_skip=True))
    assert m["state"] == "promoted" and m["reward_redteam"].startswith("replayed redteam-"), m
    assert "red team: " in m["report"] and "< true fix" in m["report"]
    n = wh.store().count("reward_redteam")
    assert n == wh.store().scalar("SELECT count(DISTINCT exploit) FROM reward_redteam") > 20
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="2", canary_skip=True))
    assert m["reward_redteam"].startswith("reused redteam-") and wh.store().count("reward_redteam") == n


def test_without_a_replay_the_candidate_is_rejected_and_the_report_says_why(env):
    wh = _seed(env, redteam=False)
    with wh.connect() as con:
        con.execute("UPDATE split_assignments SET split = 'holdout'")     # nothing left to replay on
    m = _meta(_run(env, candidate_policy_id="embedded:rl", candidate_checkpoint_version="1", canary_skip=True))
    assert (m["state"], m["failing_gates"]) == ("rejected", ["reward_hacking"]), m["report"]
    assert m["reward_redteam"] == "no task in the train or val split to replay the exploit library on"
    assert "no red-team replay of the exploit library recorded for this environment (no task in the train or " \
           "val split" in m["report"]


def test_sensor_requests_once_per_materialisation(tmp_path):
    from assets.promotion import promotion_sensor

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        ctx = dg.build_sensor_context(instance=instance)
        assert not promotion_sensor.evaluate_tick(ctx).run_requests
        instance.report_runless_asset_event(dg.AssetMaterialization(
            "holdout_eval", metadata={"policy_id": "embedded:rl@4", "checkpoint_version": "4",
                                      "eval_run_id": "one-seed-run", "seed": 0}))
        instance.report_runless_asset_event(dg.AssetMaterialization(
            "holdout_eval", metadata={"policy_id": "harness:sbfl", "checkpoint_version": ""}))   # a baseline
        instance.report_runless_asset_event(dg.AssetMaterialization(     # a cycle's SFT reference row
            "holdout_eval", metadata={"policy_id": "embedded:sft@3", "checkpoint_version": "3", "role": "reference"}))
        instance.report_runless_asset_event(dg.AssetMaterialization("holdout_eval"))
        first = promotion_sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
        a, b = first.run_requests
        assert a.run_config["ops"]["promotion"]["config"] == {
            "candidate_policy_id": "embedded:rl@4", "candidate_checkpoint_version": "4"}
        assert b.run_config["ops"]["promotion"]["config"] == {}      # the asset picks the newest candidate
        assert a.run_key != b.run_key and a.tags["ratchet/candidate"] == "embedded:rl@4"
        again = promotion_sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=first.cursor))
        assert not again.run_requests                                  # the cursor moved past all four events
        repeat = promotion_sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
        assert [r.run_key for r in repeat.run_requests] == [a.run_key, b.run_key]  # same keys: no second run
        assert first.cursor.isdigit()


def test_defs_merge_into_the_code_location():
    """What the integrator does in pipelines/definitions.py: merge `defs` and resolve the job."""
    from assets.promotion import defs
    from pipelines.definitions import defs as location

    merged = dg.Definitions.merge(location, defs)
    dg.Definitions.validate_loadable(merged)
    assert merged.resolve_job_def("promotion_job").asset_layer.executable_asset_keys == {dg.AssetKey("promotion")}
    graph = merged.resolve_asset_graph()
    assert dg.AssetKey("holdout_eval") in graph.get(dg.AssetKey("promotion")).parent_keys
