"""Harness variants are policies like any other: they resolve through the policy layer, run the
holdout_eval path (the spawn pool included) and get their own eval_summary row beside the
baseline; each changes exactly the configuration it names."""
import pytest

from ratchet.evaluation import io
from ratchet.evaluation.variants import BASELINE, VARIANTS, register_variants, variant

pytestmark = pytest.mark.evaluation


def _tools(row_or_run):
    return [s.tool for s in row_or_run.steps]


def test_variant_ids_resolve_through_the_policy_layer():
    from ratchet.evaluation.episodes import get_policy

    assert set(register_variants()) == set(VARIANTS) and register_variants() == list(VARIANTS)  # idempotent
    for pid in VARIANTS:
        assert "@" not in pid and pid.startswith("harness:")
        pol = get_policy(pid)
        assert pol.policy_id == pid and pol.spec["config"]["agent"] == variant(pid).name
    assert variant("harness:sbfl-top3@x").top == 3 and variant(BASELINE) is None


def test_each_variant_changes_only_its_own_setting(suite_tasks):
    from sandboxes.agents import run_agent

    register_variants()
    b = sorted(suite_tasks, key=lambda t: t.task_id)[0]
    base = run_agent("sbfl", b, seed=0)
    loc = lambda run: next(m for m in run.messages if m.get("tool_calls")
                           and m["tool_calls"][0]["function"]["name"] == "localize")
    tar = run_agent("sbfl-tarantula", b, seed=0)
    assert '"formula": "tarantula"' in loc(tar)["tool_calls"][0]["function"]["arguments"]
    free = run_agent("sbfl-free-edit", b, seed=0)
    assert "propose_edits" in _tools(base) and "apply_edit" in _tools(base)
    assert not {"propose_edits", "apply_edit"} & set(_tools(free)) and "edit" in _tools(free)
    # the same candidates in the same order: the same outcome and attempt count, fewer turns
    assert (free.tests_passed, free.attempts, free.fixed_at) == (base.tests_passed, base.attempts, base.fixed_at)
    assert len(free.steps) < len(base.steps)
    top1 = run_agent("sbfl-top1", b, seed=0)
    lines = {m["tool_calls"][0]["function"]["arguments"] for m in top1.messages
             if m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] == "propose_edits"}
    assert len(lines) <= 1 and top1.attempts <= base.attempts


def test_a_variant_evaluates_through_holdout_eval_and_gets_its_own_summary_row(holdout):
    wh, path, tasks = holdout
    pid = "harness:sbfl-free-edit"
    for policy, workers in ((BASELINE, 1), (pid, 2)):          # the variant in the spawn pool
        res = io.run_holdout_eval(wh, path, policy, 0, workers=workers, task_limit=2)
        assert res["ran"] == 2 and res["infra"] == 0 and res["checkpoint_version"] == ""
    rows = io.build_summary(wh, path, baseline_policy_id=BASELINE, n_boot=200)
    alls = {r["policy_id"]: r for r in rows if r["dimension"] == "all"}
    assert set(alls) == {BASELINE, pid}
    v, bl = alls[pid], alls[BASELINE]
    assert v["checkpoint_version"] == "" and v["tasks_scored"] == 2 and v["diff_tasks"] == 2
    # same fixes in the same order: same pass rate, fewer tool calls than the structured tools
    assert v["pass_rate"] == bl["pass_rate"] and v["diff_vs_baseline"] == 0.0
    assert v["mean_tool_calls"] < bl["mean_tool_calls"]
    assert {r["policy_id"] for r in rows if r["dimension"] == "family"} == {BASELINE, pid}
