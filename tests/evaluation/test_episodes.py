"""Episodes in the real sandbox: the row contract, reproducibility, resume after a kill, the
holdout manifest gate, infra failures, self-judging refusal."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ratchet.evaluation import tables
from ratchet.evaluation.episodes import SelfJudging, run_policy_episode
from ratchet.evaluation.runner import evaluate, holdout_plan, warehouse_sink

pytestmark = pytest.mark.evaluation
ROOT = Path(__file__).resolve().parents[2]


def _repro(row):
    return {k: v for k, v in row.items() if k not in tables.NON_REPRODUCIBLE}


def test_row_matches_the_contract_schema(holdout):
    wh, path, tasks = holdout
    row = run_policy_episode("harness:sbfl", "", tasks[0], 0, holdout_sha256="x")
    assert set(row) == set(tables.EVAL_EPISODES.names)
    tables.to_arrow("eval_episodes", [row])          # types fit the schema
    assert row["outcome"] in ("pass", "fail") and row["reward"] is not None
    assert row["turns"] > 0 and row["latency_s"] > row["sandbox_s"] > 0
    assert row["family"] == tasks[0].metadata["root_cause"]["family"]
    from sandboxes.verifiers.judge import KeywordRubricJudge, RubricJudge
    assert row["judge_id"] == RubricJudge.name                  # graded by the reward's default judge
    assert run_policy_episode("harness:sbfl", "", tasks[0], 0, judge=KeywordRubricJudge())["judge_id"] == "rubric-v1"


def test_same_checkpoint_seed_digest_gives_identical_rows_across_runs_and_workers(holdout):
    wh, path, _ = holdout
    with wh.connect() as con:
        plan = holdout_plan(con, path, task_limit=2)
    a = evaluate(plan, "scripted:noisy", seeds=[0, 1], workers=1)
    b = evaluate(plan, "scripted:noisy", seeds=[0, 1], workers=2)       # spawn pool
    assert a.eval_run_id != b.eval_run_id and a.planned == 4 and b.workers == 2
    key = lambda r: r["eval_id"]  # noqa: E731
    ra, rb = sorted(a.rows, key=key), sorted(b.rows, key=key)
    assert [_repro(r) for r in ra] == [_repro(r) for r in rb]
    # the seed matters for a seeded policy: some reproducible column differs between seeds 0 and 1
    by = {(r["task_id"], r["seed"]): _repro(r) for r in ra}
    assert any({k: v for k, v in by[(t, 0)].items() if k not in ("eval_id", "seed")}
               != {k: v for k, v in by[(t, 1)].items() if k not in ("eval_id", "seed")}
               for t in {r["task_id"] for r in ra})


KILLED = """
import sys, time
from ratchet.warehouse import Warehouse
from ratchet.evaluation.runner import evaluate, holdout_plan, warehouse_sink
wh = Warehouse(sys.argv[1])
with wh.connect() as con:
    plan = holdout_plan(con, sys.argv[2], task_limit=2)
done, sink = warehouse_sink(wh)
def slow_sink(rows):
    sink(rows)
    print("stored", len(rows), flush=True)
    time.sleep(1)
evaluate(plan, "harness:random", seeds=[0, 1, 2], done=done, sink=slow_sink, workers=1, flush_every=1)
"""


def test_resume_after_a_kill_redoes_no_finished_episode(holdout):
    wh, path, _ = holdout
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(wh.path), str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    stored = 0
    while stored < 2:
        line = proc.stdout.readline()
        assert line, "the evaluation ended before it could be killed"
        stored += line.startswith("stored")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with wh.connect() as con:
        before = {r["eval_id"]: r["eval_run_id"] for r in tables.episode_rows(con)}
        plan = holdout_plan(con, path, task_limit=2)
    assert 2 <= len(before) < 6
    done, sink = warehouse_sink(wh)
    run = evaluate(plan, "harness:random", seeds=[0, 1, 2], done=done, sink=sink, workers=1)
    assert run.skipped == len(before) and len(run.rows) == 6 - len(before)
    with wh.connect() as con:
        after = {r["eval_id"]: r["eval_run_id"] for r in tables.episode_rows(con)}
    assert len(after) == 6
    assert all(after[k] == v for k, v in before.items())          # finished rows untouched
    again = evaluate(plan, "harness:random", seeds=[0, 1, 2], done=done, sink=sink, workers=1)
    assert again.skipped == 6 and again.rows == []


def test_manifest_is_verified_before_the_first_episode(holdout):
    from ratchet.governance.manifest import ManifestError

    wh, path, tasks = holdout
    d = json.loads(path.read_text())
    d["task_ids"] = sorted(d["task_ids"][:-1] + ["humaneval-999-planted"])
    from ratchet.governance.manifest import holdout_sha256
    d["sha256"] = holdout_sha256(d["task_ids"])          # self-consistent, but not what was recorded
    path.write_text(json.dumps(d))
    with wh.connect() as con, pytest.raises(ManifestError, match="differs from the recorded"):
        holdout_plan(con, path)


def test_a_holdout_task_without_a_bundle_refuses_the_run(holdout):
    from ratchet.governance.manifest import ManifestError

    wh, path, tasks = holdout
    with wh.connect() as con:
        con.execute("DELETE FROM tasks WHERE task_id = ?", [tasks[0].task_id])
        with pytest.raises(ManifestError, match="no bundle"):
            holdout_plan(con, path)


class _Unreachable:
    """An engine whose server is down: every generate raises (as an HTTP engine would)."""
    def __init__(self, name, policy_id=None, **kw):
        self.policy_id = policy_id

    def generate(self, requests):
        raise ConnectionError("model server unreachable")


def test_infra_failure_is_recorded_never_scored(holdout):
    from ratchet.policy.base import engine_names, register_engine

    if "test-down" not in engine_names():
        register_engine("test-down", _Unreachable)
    _, _, tasks = holdout
    row = run_policy_episode("test-down:v1", "7", tasks[0], 0)
    assert row["outcome"] == "infra_failure" and row["reward"] is None and row["passed"] is False
    assert row["reward_tests"] is None and row["human_intervention"] is False
    assert "model server unreachable" in row["error"] and row["checkpoint_version"] == "7"
    # an engine that cannot even be made is an infra failure too, not a crash of the evaluation
    row = run_policy_episode("harness:no-such-agent", "", tasks[0], 0)
    assert row["outcome"] == "infra_failure" and "no-such-agent" in row["error"]


def test_a_policy_never_judges_its_own_work(holdout):
    from sandboxes.verifiers.judge import RubricJudge

    wh, path, tasks = holdout
    judge = RubricJudge()
    with pytest.raises(SelfJudging):
        run_policy_episode(judge.name, "", tasks[0], 0, judge=judge)
    with wh.connect() as con:
        plan = holdout_plan(con, path)
    with pytest.raises(SelfJudging):
        evaluate(plan, "openai:gpt-x", judge={"kind": "openai", "base_url": "http://127.0.0.1:9", "model": "gpt-x"})


def test_another_judge_is_another_evaluation(holdout):
    """R_judge is part of the reward: rows graded by rubric-v2 are not resumed by a rubric-v3
    evaluation, and the summary reads the newest grading of each task, never both as more seeds."""
    from ratchet.evaluation.io import current_episodes

    wh, path, _ = holdout
    with wh.connect() as con:
        plan = holdout_plan(con, path, task_limit=2)
    done, sink = warehouse_sink(wh)
    old = evaluate(plan, "harness:sbfl", seeds=[0], done=done, sink=sink, workers=1, judge={"kind": "rubric-v2"})
    assert {r["judge_id"] for r in old.rows} == {"rubric-v2"} and len(old.rows) == 2
    new = evaluate(plan, "harness:sbfl", seeds=[0], done=done, sink=sink, workers=1)       # the default judge
    assert new.skipped == 0 and {r["judge_id"] for r in new.rows} == {"rubric-v3"}
    assert {r["eval_id"] for r in new.rows}.isdisjoint(r["eval_id"] for r in old.rows)
    again = evaluate(plan, "harness:sbfl", seeds=[0], done=done, sink=sink, workers=1)
    assert again.skipped == 2 and again.rows == []
    with wh.connect() as con:
        assert len(tables.episode_rows(con)) == 4                       # the history is kept...
        rows, _ = current_episodes(con, path)
    assert sorted((r["task_id"], r["judge_id"]) for r in rows) == sorted(
        (r["task_id"], "rubric-v3") for r in new.rows)                  # ...the summary reads the newest


def test_the_turn_budget_is_part_of_the_environment_and_its_rows_are_its_own(holdout):
    """holdout_eval runs every policy under one turn budget (the training one by default): the
    budget lowers each task's limit, which is in the environment digest, so rows under another
    budget are neither resumed nor counted, and the episode really stops at the budget."""
    from assets.evaluation import HoldoutEvalConfig
    from ratchet.evaluation import io
    from ratchet.policy.runner import TURN_BUDGET
    from ratchet.training.recipe import RecipeSettings

    assert HoldoutEvalConfig().max_turns == RecipeSettings().max_turns == TURN_BUDGET
    wh, path, _ = holdout
    with wh.connect() as con:
        own = holdout_plan(con, path, task_limit=2)
        low = holdout_plan(con, path, task_limit=2, max_turns=3)
        high = holdout_plan(con, path, task_limit=2, max_turns=1000)
        with pytest.raises(ValueError, match="positive"):
            holdout_plan(con, path, max_turns=-1)
    assert own.max_turns is None and low.max_turns == 3
    assert [b.limits.max_turns for b in low.bundles] == [3, 3] and own.bundles[0].limits.max_turns > 3
    assert high.task_digests() == own.task_digests()                # a budget above the limit changes nothing
    assert set(low.task_digests().values()).isdisjoint(own.task_digests().values())

    res = io.run_holdout_eval(wh, path, "harness:random", 0, workers=1, task_limit=2, max_turns=3)
    assert (res["ran"], res["episodes"], res["max_turns"]) == (2, 2, 3)
    with wh.connect() as con:
        rows = tables.episode_rows(con, "harness:random")
    assert len(rows) == 2 and all(1 <= r["turns"] <= 3 for r in rows)
    assert {r["environment_digest"] for r in rows} == set(low.task_digests().values())
    # the tasks' own budget: other episodes, and the seed's figures count only them
    res = io.run_holdout_eval(wh, path, "harness:random", 0, workers=1, task_limit=2, max_turns=0)
    assert (res["ran"], res["skipped"], res["episodes"], res["max_turns"]) == (2, 0, 2, 0)
    res = io.run_holdout_eval(wh, path, "harness:random", 0, workers=1, task_limit=2, max_turns=3)
    assert (res["ran"], res["skipped"], res["episodes"]) == (0, 2, 2)     # resumed under its own budget
