"""Reading rows and evidence from the warehouse (a DuckDB file with the real table DDL)."""
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

from ratchet.promotion import evidence as E
from ratchet.store import insert
from ratchet.tables import ddl

from .synthetic import episodes, tasks

pytestmark = pytest.mark.promotion
NOW = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.fixture
def con(tmp_path):
    from ratchet.evaluation import tables as eval_tables

    c = duckdb.connect(str(tmp_path / "w.duckdb"))
    for t in ("checkpoints", "consent_grants", "contamination_report"):
        c.execute(ddl(t))
    eval_tables.ensure(c)
    # `trajectories` is a view over the Parquet lake in production; a plain table with the columns read here.
    c.execute("CREATE TABLE trajectories (record_id VARCHAR, trajectory_id VARCHAR, tenant_id VARCHAR, "
              "consent_id VARCHAR, started_at TIMESTAMPTZ, ended_at TIMESTAMPTZ)")
    yield c
    c.close()


def test_missing_tables_are_unknown_not_passing(tmp_path):
    c = duckdb.connect(str(tmp_path / "empty.duckdb"))
    with pytest.raises(E.MissingEvaluation, match="does not exist: materialise holdout_eval"):
        E.require_eval_tables(c)
    c.execute("CREATE TABLE eval_episodes (eval_id VARCHAR)")
    with pytest.raises(E.MissingEvaluation, match="is empty: materialise holdout_eval"):
        E.require_eval_tables(c)
    ev = E.gather(c, {"policy_id": "embedded:rl", "checkpoint_version": "1"}, NOW)
    assert (ev.judge_kappa, ev.contamination_rate, ev.lineage_recorded) == (None, None, False)
    assert "does not exist" in ev.sources["judge_kappa"]


def test_newest_evidence_rows_win(con):
    from ratchet.evaluation.tables import append_rows

    append_rows(con, "judge_calibration", [{"computed_at": NOW - timedelta(days=1), "judge_id": "old", "items": 10, "kappa": 0.9},
                                           {"computed_at": NOW, "judge_id": "rubric-v2", "items": 120, "kappa": 0.79}])
    insert(con, "contamination_report", [{"checked_at": NOW, "overlap_fraction": 0.0, "n_items": 5},
                                         {"checked_at": NOW - timedelta(days=1), "overlap_fraction": 0.2, "n_items": 5}])
    assert E.judge_kappa(con)[0] == 0.79 and "rubric-v2 over 120 items" in E.judge_kappa(con)[1]
    assert E.contamination_rate(con)[0] == 0.0


def test_the_kappa_is_that_of_the_judge_that_graded_the_candidate(con):
    """Calibrating another judge last must neither block nor pass a candidate graded by rubric-v3."""
    from ratchet.evaluation.tables import append_rows

    append_rows(con, "judge_calibration", [
        {"computed_at": NOW - timedelta(days=1), "judge_id": "rubric-v3", "items": 600, "kappa": 0.86},
        {"computed_at": NOW, "judge_id": "rubric-v1", "items": 600, "kappa": 0.41}])
    kappa, src = E.judge_kappa(con, {"rubric-v3"})
    assert kappa == 0.86 and "rubric-v3" in src
    assert E.judge_kappa(con)[0] == 0.41                       # no judge named: the newest of any
    assert E.judge_kappa(con, {"rubric-v3", "rubric-v1"})[0] == 0.41   # every judge must hold
    kappa, src = E.judge_kappa(con, {"openai:gpt"})
    assert kappa is None and "no row for it" in src            # unknown, so the gate fails closed
    ev = E.gather(con, {"policy_id": "embedded:rl", "checkpoint_version": "1"}, NOW, judge_ids=["rubric-v3"])
    assert ev.judge_kappa == 0.86


def test_consent_lineage_revoked_expired_and_clean(con):
    insert(con, "consent_grants", [
        {"consent_id": "LIVE", "tenant_id": "acme", "scopes": ["train"], "retention_days": 90, "granted_at": NOW - timedelta(days=10)},
        {"consent_id": "GONE", "tenant_id": "acme", "scopes": ["train"], "retention_days": 90,
         "granted_at": NOW - timedelta(days=10), "revoked_at": NOW - timedelta(days=1)}])
    con.executemany("INSERT INTO trajectories VALUES (?, ?, 'acme', ?, ?, ?)", [
        ("r1", "t1", "LIVE", NOW - timedelta(days=5), NOW - timedelta(days=5)),
        ("r2", "t2", "GONE", NOW - timedelta(days=5), NOW - timedelta(days=5)),
        ("r3", "t3", "LIVE", NOW - timedelta(days=200), NOW - timedelta(days=200))])   # past 90-day retention
    insert(con, "checkpoints", [
        {"checkpoint_id": "clean", "tenant_id": "acme", "trained_record_ids": ["r1"], "created_at": NOW, "flagged": False},
        {"checkpoint_id": "embedded:rl@dirty", "tenant_id": "acme", "trained_record_ids": ["r1", "r2", "r3", "r9"],
         "created_at": NOW, "flagged": False}])
    assert E.consent_lineage(con, "embedded:rl", "clean", NOW)[:2] == ([], True)
    v, recorded, src = E.consent_lineage(con, "embedded:rl", "dirty", NOW)
    assert recorded and "4 trained records" in src
    assert sorted((x["reason"], x["consent_id"], x["n_records"]) for x in v) == [
        ("expired", "LIVE", 1), ("revoked", "GONE", 1), ("unknown_record", None, 1)]
    assert E.consent_lineage(con, "harness:sbfl", "", NOW)[:2] == ([], None)       # no weights, no lineage
    assert E.consent_lineage(con, "embedded:rl", "nope", NOW)[:2] == ([], False)


def test_eval_rows_keep_one_environment(con):
    from ratchet.evaluation.tables import write_episodes

    T = tasks(5)
    old = episodes(T, "embedded:rl", checkpoint_version="1", digest="sha256:old")
    new = [dict(r, started_at=r["started_at"] + timedelta(hours=1), finished_at=r["finished_at"] + timedelta(hours=1))
           for r in episodes(T, "embedded:rl", checkpoint_version="1")]
    write_episodes(con, old)
    write_episodes(con, new)
    rows = E.eval_rows(con, "embedded:rl", "1")
    assert len(rows) == 15 and {r["environment_digest"] for r in rows} == {new[0]["environment_digest"]}
    assert len(E.eval_rows(con, "embedded:rl", "1", environment_digest="sha256:old",
                           holdout_sha256=old[0]["holdout_sha256"])) == 15
    write_episodes(con, episodes(T, "harness:sbfl"))
    assert E.latest_candidate(con) == ("embedded:rl", "1")
    assert E.latest_candidate(con, exclude=(("embedded:rl", "1"),)) is None


def test_per_task_environment_digests_compare_every_task(con):
    """A HumanEval task's digest covers its own files, so every task has its own: the promotion
    must compare all tasks (once it compared only the tasks sharing the newest row's digest)."""
    from ratchet.evaluation.tables import write_episodes
    from ratchet.promotion.flow import read_inputs
    from ratchet.promotion.gates import GatePolicy, evaluate_gates

    T = tasks(8)
    per_task = lambda rows: [dict(r, environment_digest=f"sha256:{r['task_id']}") for r in rows]  # noqa: E731
    cand = per_task(episodes(T, "embedded:rl", checkpoint_version="1", p_shift=0.3))
    champ = per_task(episodes(T, "harness:sbfl"))
    write_episodes(con, cand)
    write_episodes(con, champ)
    inp = read_inputs(con, baseline=("harness:sbfl", ""), now=NOW)
    assert len(inp.candidate_rows) == len(inp.champion_rows) == 8 * 3
    rep = evaluate_gates(inp.candidate_rows, inp.champion_rows, inp.evidence, GatePolicy(slice_columns=("slice",)))
    assert rep.gate("comparable").passed and rep.gate("comparable").numbers["tasks_compared"] == 8
    # one task re-evaluated for the champion under another environment: not comparable on that task
    moved = [dict(r, environment_digest="sha256:new", finished_at=r["finished_at"] + timedelta(hours=1),
                  eval_id=r["eval_id"] + "x") for r in champ if r["task_id"] == T[0]["task_id"]]
    rep2 = evaluate_gates(cand, [r for r in champ if r["task_id"] != T[0]["task_id"]] + moved, inp.evidence,
                          GatePolicy(slice_columns=("slice",)))
    assert not rep2.gate("comparable").passed and "differs on 1 of 8 tasks" in rep2.gate("comparable").reason


def test_rows_graded_by_another_judge_are_another_evaluation(con):
    """R_judge is part of the reward: a champion graded by an older judge (rubric-v2) is not
    compared with a candidate graded by rubric-v3. The champion's rows under the candidate's judge
    are read when they exist (a cycle re-evaluates it), and the gate refuses otherwise."""
    from ratchet.evaluation.tables import write_episodes
    from ratchet.promotion.flow import read_inputs
    from ratchet.promotion.gates import GatePolicy, evaluate_gates

    T = tasks(6)
    judged = lambda rows, j, dt=0: [dict(r, judge_id=j, eval_id=r["eval_id"] + j,  # noqa: E731
                                         finished_at=r["finished_at"] + timedelta(minutes=dt)) for r in rows]
    cand = judged(episodes(T, "embedded:rl", checkpoint_version="1", p_shift=0.3), "rubric-v3")
    old_champ = judged(episodes(T, "harness:sbfl"), "rubric-v2")
    write_episodes(con, cand)
    write_episodes(con, old_champ)
    inp = read_inputs(con, baseline=("harness:sbfl", ""), now=NOW)
    rep = evaluate_gates(inp.candidate_rows, inp.champion_rows, inp.evidence, GatePolicy(slice_columns=("slice",)))
    assert inp.champion_rows == []             # nothing graded by the candidate's judge yet
    assert not rep.gate("comparable").passed
    mixed = evaluate_gates(cand, old_champ, inp.evidence, GatePolicy(slice_columns=("slice",)))
    assert not mixed.gate("comparable").passed and "judge" in mixed.gate("comparable").reason
    assert mixed.gate("comparable").numbers["tasks_judge_differs"] == 6
    write_episodes(con, judged(episodes(T, "harness:sbfl"), "rubric-v3", dt=5))    # the champion re-evaluated
    inp = read_inputs(con, baseline=("harness:sbfl", ""), now=NOW)
    assert len(inp.champion_rows) == 6 * 3 and {r["judge_id"] for r in inp.champion_rows} == {"rubric-v3"}
    rep = evaluate_gates(inp.candidate_rows, inp.champion_rows, inp.evidence, GatePolicy(slice_columns=("slice",)))
    assert rep.gate("comparable").passed, rep.gate("comparable").reason
