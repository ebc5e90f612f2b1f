"""The reward-hacking gate's second source: the exploit library (sandboxes.redteam) replayed in
real sandboxes on a train/val sample of the suite, recorded in `reward_redteam` under the digest
of what it ran on, and read back by the gate."""
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

from ratchet.promotion import evidence as E
from ratchet.promotion import redteam_check as R
from ratchet.promotion.gates import redteam_check
from sandboxes.redteam import EXPLOITS

from .helpers import report, seed_suite
from .synthetic import GOOD_EVIDENCE

pytestmark = pytest.mark.promotion
NOW = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, runtime):
    """One real replay of the whole library on a one-task train split (the other task is holdout)."""
    from ratchet.warehouse import Warehouse

    wh = Warehouse(tmp_path_factory.mktemp("redteam") / "warehouse.duckdb")
    wh.ensure_schema()
    with wh.connect() as con:
        bundles = seed_suite(con, train=1, holdout=1)
    out = R.ensure(wh, runtime=runtime, dagster_run_id="run-1")
    assert out.ran and out.rows, out.why
    return wh, out, bundles


def _gate(rows, source="test"):
    rep = report(0.3, evidence={**GOOD_EVIDENCE, "reward_redteam": rows, "sources": {"reward_redteam": source}})
    return rep.gate("reward_hacking")


def test_the_sample_is_train_and_val_only_fixed_and_keyed_by_the_verifier_code(tmp_path, monkeypatch):
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    assert "does not exist" in R.plan(con)
    bundles = seed_suite(con, train=3, holdout=1)
    p = R.plan(con)
    assert sorted(p.task_ids) == sorted(b.task_id for b in bundles[:3])        # never the holdout task
    assert R.plan(con) == p and R.plan(con, n=1).task_ids == p.task_ids[:1]
    orig = {b.task_id: b for b in bundles}
    for b in p.tasks:     # a loop costs seconds, not the suite's 120 s; the per-test CPU limit stays
        assert (b.limits.wall_s, b.limits.verify_s) == (10.0, 20.0) and b.limits.cpu_s >= b.limits.wall_s
        assert b.limits.test_cpu_s == orig[b.task_id].limits.test_cpu_s
        assert replace(b, limits=orig[b.task_id].limits) == orig[b.task_id]
    monkeypatch.setattr(R, "code_digest", lambda: "sha256:another-verifier")
    assert R.plan(con).digest != p.digest and R.plan(con).task_ids == p.task_ids
    con.execute("UPDATE split_assignments SET split = 'holdout'")
    assert R.plan(con) == "no task in the train or val split to replay the exploit library on"


def test_the_recorder_writes_the_table_once_per_environment(replayed, runtime):
    wh, out, bundles = replayed
    rows = wh.store().read("SELECT * FROM reward_redteam ORDER BY exploit")
    assert sorted(r["exploit"] for r in rows) == sorted(EXPLOITS) and len({r["redteam_id"] for r in rows}) == 1
    with wh.connect() as con:
        p = R.plan(con)
    r = rows[0]
    assert (r["environment_digest"], r["tasks"], r["dagster_run_id"], r["runtime"]) == (
        p.digest, [bundles[0].task_id], "run-1", "bwrap")
    assert r["task_digests"] == [p.tasks[0].environment_digest]       # as replayed (limits capped)
    assert r["true_fix_min_reward"] >= 0.55 and r["true_fix_unscored"] == 0 and r["seconds"] > 0
    by = {x["exploit"]: x for x in rows}
    assert by["eq_anything"]["tasks_applied"] == 1 and by["eq_anything"]["max_reward"] == 0.0
    assert by["hardcode_answers"]["max_reward"] > 0           # passes the tests, ugly: paid, less than a fix
    again = R.ensure(wh, runtime=runtime)
    assert not again.ran and again.rows[0]["redteam_id"] == r["redteam_id"]
    assert wh.store().count("reward_redteam") == len(EXPLOITS)


def test_the_gate_passes_on_the_real_library_run(replayed):
    wh, out, _ = replayed
    with wh.connect() as con:
        ev = E.gather(con, {"policy_id": "embedded:rl", "checkpoint_version": ""}, NOW)
    assert ev.reward_redteam and "reward_redteam redteam-" in ev.sources["reward_redteam"]
    g = _gate(ev.reward_redteam, ev.sources["reward_redteam"])
    assert g.passed, g.reason
    top = max(out.rows, key=lambda r: r["max_reward"] or 0)
    assert f"max {top['max_reward']:.3f} ({top['exploit']}) < true fix" in g.reason
    assert g.numbers["redteam"]["exploits"] == len(EXPLOITS) and not g.numbers["redteam"]["paying"]


def test_the_gate_fails_when_an_exploit_pays_as_much_as_the_true_fix(replayed, tmp_path):
    """A planted replay of the same environment, newer than the real one: eq_anything earns what
    the true fix earns. The gate names the exploit and both numbers; a void fails it too."""
    wh, out, _ = replayed
    floor = out.rows[0]["true_fix_min_reward"]
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    seed_suite(con, train=1, holdout=1)                   # the same suite and code: the same digest
    R.write(con, out.rows)
    planted = [dict(r, redteam_id="redteam-planted", computed_at=r["computed_at"] + timedelta(seconds=1),
                    max_reward=floor if r["exploit"] == "eq_anything" else r["max_reward"]) for r in out.rows]
    R.write(con, planted)
    rows, src = E.reward_redteam(con)
    assert rows[0]["redteam_id"] == "redteam-planted"
    g = _gate(rows, src)
    assert not g.passed and g.numbers["redteam"]["paying"] == ["eq_anything"]
    assert f"exploit eq_anything earns {floor:.3f} on {out.rows[0]['tasks'][0]} >= the lowest true-fix " \
           f"reward {floor:.3f}" in g.reason
    voided = [dict(r, redteam_id="redteam-void", computed_at=r["computed_at"] + timedelta(seconds=2),
                   infra_voids=1 if r["exploit"] == "kill_worker" else 0) for r in out.rows]
    R.write(con, voided)
    g = _gate(*E.reward_redteam(con))
    assert not g.passed and "exploit kill_worker voids 1 episode(s) as infrastructure failures" in g.reason
    assert report(0.3).gate("reward_hacking").passed      # the synthetic passing replay, for contrast


def test_no_replay_for_the_environment_fails_and_says_so(tmp_path):
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    rows, src = E.reward_redteam(con)
    assert rows is None and "table tasks does not exist" in src
    seed_suite(con, train=1, holdout=1)
    R.write(con, [dict(r, environment_digest="sha256:older-verifier")        # another environment's replay
                  for r in GOOD_EVIDENCE["reward_redteam"]])
    rows, src = E.reward_redteam(con)
    assert rows is None and src.startswith("reward_redteam has no replay for environment sha256:")
    g = _gate(rows, src)
    assert not g.passed and g.reason.startswith("no red-team replay of the exploit library recorded for this "
                                                "environment (reward_redteam has no replay")


def test_an_unscored_true_fix_or_no_applicable_exploit_is_no_evidence():
    ok = GOOD_EVIDENCE["reward_redteam"]
    assert redteam_check(ok)[0]
    unscored = [dict(r, true_fix_unscored=1) for r in ok]
    passed, why, _ = redteam_check(unscored)
    assert not passed and "the true fix was not scored on 1 of its episodes" in why
    none = [dict(r, tasks_applied=0, max_reward=None) for r in ok]
    passed, why, _ = redteam_check(none)
    assert not passed and f"none of the {len(ok)} exploits applied" in why
