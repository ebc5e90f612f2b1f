"""MLflow registry aliases follow the promotions table, on a real sqlite MLflow store."""
from pathlib import Path

import duckdb
import pytest

from ratchet.promotion import registry as R
from ratchet.promotion import state as S
from ratchet.promotion.config import GatePolicy
from ratchet.promotion.tables import ensure

from .helpers import promote_through, report

pytestmark = pytest.mark.promotion


@pytest.fixture(scope="module")
def mlflow_client(mlflow_uri):
    return R.client(mlflow_uri)


@pytest.fixture
def con(tmp_path):
    c = duckdb.connect(str(tmp_path / "w.duckdb"))
    ensure(c)
    yield c
    c.close()


def _model(c, name, version):
    return {"registered_model": name, "model_version": R.ensure_version(c, "embedded:rl", version, model_name=name)}


def test_versions_are_registered_once_with_a_logged_artifact(mlflow_client):
    c, name = mlflow_client, "reg-once"
    v1 = R.ensure_version(c, "embedded:rl", "1", model_name=name)
    assert R.ensure_version(c, "embedded:rl", "1", model_name=name) == v1
    v0 = R.ensure_version(c, "harness:sbfl", "", model_name=name)
    assert v0 != v1 and R.find_version(c, "harness:sbfl", "", name) == v0
    mv = c.get_model_version(name, v1)
    assert mv.tags["ratchet.checkpoint_version"] == "1" and mv.run_id
    assert [a.path for a in c.list_artifacts(mv.run_id, "policy")] == ["policy/policy.json"]
    # artifacts live beside the store, not in ./mlruns under the working directory
    store = Path(c.tracking_uri[len("sqlite:///"):]).parent
    assert c.get_run(mv.run_id).info.artifact_uri.startswith((store / "artifacts").as_uri())


def test_aliases_move_with_the_state_and_rollback_restores_in_one_step(mlflow_client, con):
    c, name = mlflow_client, "reg-flow"
    rep1 = report(0.3, version="1")
    pid1 = S.record_evaluation(con, rep1, model=_model(c, name, "1")).row["promotion_id"]
    R.apply(con, c, name)
    assert R.current_aliases(c, name) == {"champion": None, "canary": None, "candidate": _model(c, name, "1")["model_version"]}
    S.decide(con, pid1, policy=GatePolicy())
    S.start_canary(con, pid1, actor="t")
    R.apply(con, c, name)
    v1 = _model(c, name, "1")["model_version"]
    assert R.current_aliases(c, name) == {"champion": None, "canary": v1, "candidate": None}
    S.promote(con, pid1, actor="t")
    R.apply(con, c, name)
    assert R.current_aliases(c, name) == {"champion": v1, "canary": None, "candidate": None}

    pid2, st = promote_through(con, report(0.3, version="2", champion=("embedded:rl", "1")),
                               champion_promotion_id=pid1, model=_model(c, name, "2"))
    assert st == S.State.PROMOTED
    v2 = _model(c, name, "2")["model_version"]
    assert R.apply(con, c, name) == {"champion": (v1, v2)}
    assert R.apply(con, c, name) == {}              # idempotent

    t, restored, moved = R.rollback(con, c, actor="owner:alice", reason="incident 42", promotion_id=pid2, model_name=name)
    assert t.applied and restored["promotion_id"] == pid1
    assert moved == {"champion": (v2, v1)}
    assert str(c.get_model_version_by_alias(name, "champion").version) == v1
    assert "incident 42" in c.get_model_version(name, v1).tags["ratchet.restored_by"]
    R.rollback(con, c, actor="owner:alice", reason="to baseline", model_name=name)
    assert R.current_aliases(c, name)["champion"] is None


def test_a_rejected_candidate_loses_the_candidate_alias(mlflow_client, con):
    c, name = mlflow_client, "reg-reject"
    rep = report(0.0, version="7")       # no better than the champion
    pid = S.record_evaluation(con, rep, model=_model(c, name, "7")).row["promotion_id"]
    R.apply(con, c, name)
    assert R.current_aliases(c, name)["candidate"] is not None
    assert S.decide(con, pid, policy=GatePolicy()).state == S.State.REJECTED
    assert R.apply(con, c, name) == {"candidate": (_model(c, name, "7")["model_version"], None)}
