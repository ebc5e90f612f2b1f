"""Batched evaluation of model policies: a chunk of episodes per pool job through
`ratchet.policy.run_episodes` (one generate call for every waiting episode) gives the same rows as
one episode at a time; chunks stream to the sink and a killed run resumes without redoing them;
an engine that fails is an infra failure of each of its episodes, never a score.

The policy is a tiny embedded checkpoint (the base_policy builder with the training tests' tiny
shape, tokenizer trained on the non-holdout tasks), decoded under the structured action mask and
calls-only bounds it would be trained under, sampling at temperature 1 so the seed matters. Its
holdout tasks allow 4 turns (a random model rarely submits: 30-turn episodes cost ~30 s here)."""
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ratchet.evaluation import tables
from ratchet.evaluation.runner import evaluate, holdout_plan, warehouse_sink

pytestmark = pytest.mark.evaluation
ROOT = Path(__file__).resolve().parents[2]
POLICY = "embedded:tiny"
SAMPLING = {"temperature": 1.0, "max_tokens": 256}
COMPARED = ("eval_id", "outcome", "passed", "reward", "reward_tests", "reward_hygiene", "reward_judge",
            "turns", "tool_calls", "tokens_in", "tokens_out", "hard_gates", "human_intervention", "error", "judge_id")


@pytest.fixture
def holdout(wh, home, suite_tasks):
    """(warehouse, manifest path, bundles): the conftest holdout's 4 tasks with a 4-turn budget."""
    from tests.evaluation.conftest import lock_holdout

    tasks = [dataclasses.replace(t, limits=dataclasses.replace(t.limits, max_turns=4))
             for t in sorted(suite_tasks, key=lambda t: t.task_id)[:4]]
    path = home.root / "holdout_manifest.json"
    lock_holdout(wh, path, tasks)
    return wh, path, tasks


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, suite_tasks):
    """A saved embedded checkpoint: the training tests' tiny shape (2 layers, width 32), its
    tokenizer trained on the train-side tasks (those the holdout fixture does not hold out)."""
    from ratchet.policy.action_mask import structured_tools
    from ratchet.policy.embedded.corpus import task_texts
    from ratchet.policy.embedded.decoding import write_decoding
    from ratchet.policy.embedded.model import EmbeddedConfig, build_base_policy
    from ratchet.policy.grammar import Bounds
    from sandboxes.tools import TOOL_SCHEMAS

    train = sorted(suite_tasks, key=lambda t: t.task_id)[4:]
    rows = [{"task_id": b.task_id, "split": "train", "repo": b.repo, "issue_id": b.issue_id,
             "issue_title": b.issue_title, "issue_body": b.issue_body, "solution": b.files.get("solution.py")}
            for b in train]
    cfg = EmbeddedConfig(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    path = build_base_policy(tmp_path_factory.mktemp("base"), task_texts(rows, structured_tools(TOOL_SCHEMAS)),
                             config=cfg)
    write_decoding(path, action_mask="structured", bounds=Bounds(thought_chars=0, max_string=32))
    return path


def _kw(path):
    return {"path": str(path), "threads": 1, "sampling": SAMPLING}


def _key(rows):
    return sorted(({k: r[k] for k in COMPARED} for r in rows), key=lambda r: r["eval_id"])


def test_batched_chunks_give_the_rows_of_one_at_a_time(holdout, tiny_checkpoint):
    wh, path, _ = holdout
    with wh.connect() as con:
        plan = holdout_plan(con, path)
    kw = _kw(tiny_checkpoint)
    one = evaluate(plan, POLICY, "", seeds=[0, 1], workers=1, policy_kwargs=kw, batched=False)
    many = evaluate(plan, POLICY, "", seeds=[0, 1], workers=1, policy_kwargs=kw, chunk=8, concurrency=8)
    assert not one.batched and many.batched and many.chunk == 8 and many.timing["chunks"] == 1
    assert one.planned == many.planned == 8
    assert _key(one.rows) == _key(many.rows)       # (the spawn pool's rows: the resume test below)
    # the episodes are not trivial copies: the seed changes what a task's episode does
    by = {(r["task_id"], r["seed"]): (r["turns"], r["tool_calls"], r["tokens_out"]) for r in many.rows}
    assert any(by[(t.task_id, 0)] != by[(t.task_id, 1)] for t in plan.bundles)
    assert all(r["outcome"] in ("pass", "fail") and r["turns"] > 0 and r["tokens_out"] > 0 for r in many.rows)
    # generation really was batched, and each episode is billed its share of the batches it was in:
    # the shares sum to the generation time, no episode holds more than all of it
    t = many.timing
    assert t["requests"] > t["calls"] and t["episodes"] == 8
    assert sum(r["policy_s"] for r in many.rows) == pytest.approx(t["generate_s"], rel=1e-6)
    assert 0 < t["generate_s"] <= t["runner_s"] <= t["chunk_s"] <= t["job_s"]


KILLED = """
import sys, time
from ratchet.warehouse import Warehouse
from ratchet.evaluation.runner import evaluate, holdout_plan, warehouse_sink
wh = Warehouse(sys.argv[1])
with wh.connect() as con:
    plan = holdout_plan(con, sys.argv[2], task_limit=3)
done, sink = warehouse_sink(wh)
def slow_sink(rows):
    sink(rows)
    print("stored", len(rows), flush=True)
    time.sleep(30)
kw = {"path": sys.argv[3], "threads": 1, "sampling": {"temperature": 1.0, "max_tokens": 256}}
evaluate(plan, "embedded:tiny", seeds=[0, 1, 2], done=done, sink=slow_sink, workers=1, chunk=2,
         policy_kwargs=kw)
"""


def test_chunks_stream_and_a_killed_run_resumes_without_redoing_them(holdout, tiny_checkpoint):
    wh, path, _ = holdout
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(wh.path), str(path), str(tiny_checkpoint)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    # chunk=2 asked, but chunks are cut between tasks only (a task's seeds share a worker): 3
    assert line.startswith("stored 3"), f"the evaluation ended before its first chunk was stored: {line!r}"
    os.killpg(proc.pid, signal.SIGKILL)               # while it holds the next chunks
    proc.wait()
    with wh.connect() as con:
        before = {r["eval_id"]: r["eval_run_id"] for r in tables.episode_rows(con)}
        plan = holdout_plan(con, path, task_limit=3)
    assert len(before) == 3                             # the first chunk, whole
    done, sink = warehouse_sink(wh)
    # resumed in a spawn pool (two workers, a task's 3 seeds each): the rows of the one-at-a-time path
    run = evaluate(plan, POLICY, "", seeds=[0, 1, 2], done=done, sink=sink, workers=2,
                   policy_kwargs=_kw(tiny_checkpoint))
    assert run.batched and run.workers == 2 and run.skipped == 3 and len(run.rows) == 6
    # (whether a chunk of 2 shares a generate call depends on sandbox timing: with 2 open episodes
    # the runner's min_batch is 1; batching itself is asserted in the test above, with 8 open)
    assert run.chunk == 3 and run.timing["chunks"] == 2 and run.timing["requests"] >= run.timing["calls"]
    todo = {r["eval_id"] for r in run.rows}
    alone = evaluate(plan, POLICY, "", seeds=[0, 1, 2], workers=1, policy_kwargs=_kw(tiny_checkpoint), batched=False,
                     done=lambda ids: set(ids) - todo)
    assert _key(run.rows) == _key(alone.rows)
    with wh.connect() as con:
        after = {r["eval_id"]: r["eval_run_id"] for r in tables.episode_rows(con)}
    assert len(after) == 9 and all(after[k] == v for k, v in before.items())   # finished rows untouched
    again = evaluate(plan, POLICY, "", seeds=[0, 1, 2], done=done, sink=sink, workers=1,
                     policy_kwargs=_kw(tiny_checkpoint))
    assert again.skipped == 9 and again.rows == []


class _Down:
    """An engine whose server went away: every generate raises."""
    policy_id = "embedded:down"

    def generate(self, requests):
        raise ConnectionError("model server unreachable")


def test_a_failing_engine_is_an_infra_failure_of_every_episode_in_its_chunk(holdout, tmp_path):
    from ratchet.evaluation.episodes import SelfJudging, run_policy_chunk

    wh, path, tasks = holdout
    with wh.connect() as con:
        plan = holdout_plan(con, path, task_limit=2)
    # a checkpoint that cannot be loaded: every episode of the run, recorded, none scored
    run = evaluate(plan, POLICY, "", seeds=[0, 1], workers=1, policy_kwargs={"path": str(tmp_path / "nope")})
    assert run.batched and len(run.rows) == 4
    assert all(r["outcome"] == "infra_failure" and r["reward"] is None and not r["passed"]
               and r["human_intervention"] is False and "nope" in r["error"] for r in run.rows)
    # an engine that dies mid-run: each of its episodes is an infra failure with the reason
    rows, timing = run_policy_chunk("embedded:down", "", [(t, 0) for t in tasks[:2]], policy=_Down())
    assert [r["outcome"] for r in rows] == ["infra_failure"] * 2 and timing["calls"] >= 1
    assert all("model server unreachable" in r["error"] and r["reward"] is None for r in rows)
    # the judge is never the policy, on this path too
    from sandboxes.verifiers.judge import RubricJudge
    judge = RubricJudge()
    with pytest.raises(SelfJudging):
        run_policy_chunk(judge.name, "", [(tasks[0], 0)], policy=_Down(), judge=judge)
