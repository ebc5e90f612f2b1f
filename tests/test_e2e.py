"""The whole graph in-process with a tiny configuration: what `make demo` runs, end to end, then
two more improvement cycles started by the schedule's own evaluation and moved on by the cycle and
promotion sensors' own requests (pipelines/cycle.py):

1. the demo: lifecycle, the baselines on the holdout, and one cycle that trains a candidate (SFT
   then RL) and takes it to a promotion decision against the baseline champion; a re-run resumes;
2. a configuration change as candidate (the scripted expert) against the baseline champion:
   evaluated, gated, promoted; the MLflow champion alias follows;
3. a trained candidate against the NEW champion (the expert, not the first baseline).
"""
import json
from datetime import UTC, datetime

import pytest

pytestmark = pytest.mark.e2e


def _write(path, data):
    import yaml

    path.write_text(yaml.safe_dump(data))


def test_demo_then_two_scheduled_cycles(home, capsys):
    import dagster as dg

    from pipelines.cycle import improvement_schedule, run_cycle
    from pipelines.definitions import defs
    from pipelines.demo import DEMO_POLICIES, QUICK_POLICY, QUICK_TRAIN, run_demo
    from ratchet import store
    from ratchet.warehouse import Warehouse

    # 1. the demo (quick): 10 agent runs leave one tenant with consented, accepted training data
    assert run_demo(home, quick=True, tasks=10, eval_tasks=2) == 0
    out = capsys.readouterr()
    first = json.loads(out.out.strip().splitlines()[-1])
    assert set(DEMO_POLICIES) <= set(first["pass_rates"])                 # every demo policy evaluated...
    assert all("/ 2 tasks" in first["pass_rates"][p] for p in DEMO_POLICIES)   # ...on the 2 holdout tasks asked for
    assert "| task success (majority of seeds, 95% CI) |" in out.err     # the scorecard is printed
    assert (home.root / "scorecard.md").exists()
    cycle = first["cycle"]
    assert cycle and cycle["decision"] in ("rejected", "canary", "promoted"), cycle   # a decision, not "waiting"
    assert cycle["policy"].startswith(f"embedded:ratchet-{cycle['tenant']}-cycle-")
    # the per-tenant training data is reported beside the results; the candidate is the largest tenant's
    data = cycle["training_data"]
    assert data[0]["tenant_id"] == cycle["tenant"] and data[0]["n"] == cycle["training_trajectories"] == \
        max(r["n"] for r in data) and all(0 <= r["structured"] <= r["n"] for r in data)
    assert "training data per tenant (consented, accepted, train split; structured = every call one of the five " \
           "structured tools, all the small base's SFT takes): " \
           f"{data[0]['tenant_id']} {data[0]['n']} ({data[0]['structured']} structured)" in out.err
    assert "promotion decision for embedded:" in out.err and "sft checkpoint" in out.err and "rl checkpoint" in out.err
    assert "ratchet ui" in out.err and "ratchet mlflow" in out.err and "ratchet query" in out.err
    # the scorecard's columns: the prompted baseline and the SFT checkpoint are evaluated beside the candidate
    assert "= prompted baseline (base_policy, no weight change)" in out.err and "= SFT;" in out.err
    assert any(p.startswith("embedded:base_policy@") for p in first["pass_rates"]), first["pass_rates"]
    wh = Warehouse(home.warehouse)
    episodes = wh.store().count("eval_episodes")
    # + the quick candidate and its two references (SFT, prompted baseline): 1 task x 3 seeds each
    assert episodes == len(DEMO_POLICIES) * 3 * 2 + 3 * 3
    assert first["demo"] == "ok" and first["contamination_passed"] is True
    assert first["tasks"] > 0 and set(first["splits"]) == {"train", "val", "holdout"}
    assert {"atif", "mini_swe_agent", "swe_agent", "swebench_prediction", "openai_chat"} <= set(first["by_format"])
    assert first["quarantine"]  # the landing folder carries bad lines on purpose
    # the shell agent's runs, logged as SWE-agent and ATIF files for the largest tenant, are ingested
    # with their bash / str_replace_editor calls, and the SFT's per-format line reports what trained
    from sandboxes.generate import FOREIGN_TENANT
    with Warehouse(home.warehouse).connect() as con:
        foreign = dict(con.execute(
            "SELECT source_format, count(*) FROM trajectories WHERE tenant_id = ? "
            "AND source_format IN ('swe_agent', 'atif') GROUP BY 1", [FOREIGN_TENANT]).fetchall())
    assert foreign == {"swe_agent": 2, "atif": 2}, foreign
    assert "its SFT, per source format (trained / offered" in out.err
    assert run_demo(home, quick=True, tasks=10, eval_tasks=2) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert wh.store().count("eval_episodes") == episodes   # resumed: nothing re-run, no second candidate
    assert second["pass_rates"] == first["pass_rates"] and second["cycle"] == first["cycle"]
    assert second["trajectories"] == first["trajectories"]  # nothing new: content-addressed ids
    assert second["holdout_sha256"] == first["holdout_sha256"]  # the holdout is locked
    assert second["quarantine"] == first["quarantine"]

    # 2. a scheduled cycle whose candidate is a configuration change, against the baseline champion
    suite = {"task_suite": {"config": {"limit": 12}}}
    # 2 tasks x 3 seeds: a p95 over 6 episodes is timing noise on a shared machine, so the tiny
    # configuration widens the (soft) latency tolerance; every other gate stays at its default.
    _write(home.root / "promotion.yaml", {"baseline": "harness:random", "canary_skip": True,
                                          "gates": {"latency_tolerance": 10.0}})
    _write(home.root / "cycle.yaml", {"candidate": "scripted:expert", "eval_task_limit": 6, "ops": suite})
    monday = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)
    with dg.DagsterInstance.get() as instance:
        ctx = dg.build_schedule_context(instance=instance, scheduled_execution_time=monday)
        assert improvement_schedule(ctx).run_key == improvement_schedule(ctx).run_key   # one run per tick
        c1 = run_cycle(instance, defs, when=monday)
        assert c1["ok"], c1["runs"]
        jobs = [j for j, _ in c1["runs"]]
        assert jobs[0] == "lifecycle_job" and "evaluation_report_job" in jobs and "promotion_job" in jobs
        p1 = c1["promotion"]
        assert p1["state"] == "promoted", (p1["failing_gates"], p1["report"])
        assert p1["champion_evaluated_against"].startswith("harness:random") and "(baseline)" in p1["champion_evaluated_against"]
        assert p1["aliases"]["champion"]
        # both sides resumed the demo's rows on its 2 tasks and ran the 4 more
        assert wh.store().count("eval_episodes") == episodes + 2 * 4 * 3

        # 3. the next week's scheduled cycle trains a candidate and meets the NEW champion
        _write(home.root / "cycle.yaml", {"tenant": cycle["tenant"], "candidate": "train", "eval_task_limit": 1,
                                          "ops": {**suite, **QUICK_TRAIN}, "policy_kwargs": QUICK_POLICY})
        c2 = run_cycle(instance, defs, when=datetime(2026, 11, 30, 3, 0, tzinfo=UTC))
        assert c2["ok"], c2["runs"]
        assert c2["runs"][0][0] == "improvement_job"
        p2 = c2["promotion"]
        assert p2["champion_evaluated_against"].startswith("scripted:expert"), p2   # not the first baseline
        assert p2["candidate"].startswith(f"embedded:ratchet-{cycle['tenant']}-cycle-20261130-0300@"), p2
        assert p2["state"] in ("rejected", "canary", "promoted"), p2

    with wh.connect() as con:
        decided = store.fetch(con, "SELECT DISTINCT promotion_id FROM promotions")
    assert len(decided) == 3                     # one decision per cycle, none doubled by the resumed demo
