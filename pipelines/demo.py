"""`ratchet demo`: the whole lifecycle on the embedded default, in-process, on the persistent
Dagster instance under RATCHET_HOME (so `ratchet ui` shows the runs afterwards).

1. Build (or load from cache) the HumanEval repair suite.
2. Run the reference agents in the real sandbox and write their logs into the landing folder
   the way production logs arrive (tenants, consent grants, re-logged duplicates, bad lines),
   plus one sample of every foreign format.
3. Run the named `lifecycle_job`: ingest -> tasks -> dedup -> locked splits -> contamination gate
   -> consent -> training views -> judge calibration.
4. Evaluate the policies on the locked holdout, 3 seeds each (`holdout_eval` partitions; the
   demo evaluates the first `eval_tasks` holdout tasks and says so), then the summary, economics
   and the scorecard, which is printed.
5. Print a summary (the last line is JSON)."""
from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone

QUICK = {"problems": 12, "tasks": 16, "eval_tasks": 4}
FULL = {"problems": None, "tasks": 120, "eval_tasks": 20}
DEMO_POLICIES = ("harness:random", "harness:sbfl", "scripted:expert")


def _say(msg: str) -> None:
    print(f"[ratchet demo] {msg}", file=sys.stderr, flush=True)


def prepare_landing(home, size: dict) -> dict:
    """Agent logs from real sandbox runs + foreign-format samples. Idempotent per day: the same
    files are rewritten, so re-running the demo ingests nothing new."""
    from ratchet.samples import write_samples
    from sandboxes.generate import generate
    from sandboxes.humaneval import build_suite

    t0 = time.perf_counter()
    suite = build_suite(seed=0, limit=size["problems"])
    _say(f"task suite: {len(suite.tasks)} verified repair tasks "
         f"({'cached' if suite.cached else f'built in {suite.build_seconds:.0f} s'})")
    as_of = datetime.now(timezone.utc).date().isoformat()  # logs dated up to today: consent is judged now
    out = home.landing / "agent-logs"
    marker = out / f".generated-{as_of}-{len(suite.tasks)}-{size['tasks']}.json"
    if marker.exists():  # measured latencies differ per run: regenerating would log new content
        logs = json.loads(marker.read_text())
        _say(f"agent logs for {as_of} already in the landing folder ({logs.get('trajectories')} trajectories)")
    else:
        logs = generate(out, n_tasks=size["tasks"], seed=0, suite=suite, as_of=as_of,
                        registry=home.root / "consent_registry.yaml")
        marker.write_text(json.dumps({k: logs.get(k) for k in ("lines", "trajectories")}))
        _say(f"agents ran {size['tasks']} tasks in the sandbox in {time.perf_counter() - t0:.0f} s")
    samples = write_samples(home.landing / "imports", n_synthetic=0)
    return {"agent_log_lines": logs.get("lines"), "trajectories": logs.get("trajectories"), **samples}


def run_demo(home, quick: bool = False, tasks: int | None = None, eval_tasks: int | None = None) -> int:
    from dagster import DagsterInstance

    from assets.evaluation import run_evaluation
    from pipelines.definitions import defs

    t0 = time.perf_counter()
    _say(f"RATCHET_HOME={home.root}")
    size = dict(QUICK if quick else FULL)
    if tasks:
        size["tasks"] = tasks
    if eval_tasks:
        size["eval_tasks"] = eval_tasks
    written = prepare_landing(home, size)
    _say(f"landing folder ready: {written}")
    job = defs.resolve_job_def("lifecycle_job")
    run_config = {"loggers": {"console": {"config": {"log_level": "INFO"}}},
                  "ops": {"task_suite": {"config": {"limit": size["problems"]}}}}
    tags = {"ratchet/trigger": "demo", "ratchet/size": "quick" if quick else "default"}
    with DagsterInstance.get() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=run_config, tags=tags)
        for ev in result.get_asset_check_evaluations():
            verdict = "passed" if ev.passed else ("FAILED" if ev.severity.value == "ERROR" else "warning")
            _say(f"check {ev.asset_key.to_user_string()}:{ev.check_name} -> {verdict}")
        if not result.success:
            _say("the lifecycle run failed; see `ratchet ui` for the step logs")
            return 1
        n = size["eval_tasks"]
        _say(f"evaluating {', '.join(DEMO_POLICIES)} x 3 seeds on the first {n} locked holdout tasks "
             f"(the demo's smaller holdout; the reference workload is 400 x 3: ratchet demo --eval-tasks 400)")
        ok = run_evaluation(instance, defs.resources, policies=DEMO_POLICIES,
                            holdout_config={"task_limit": n}, log=_say, tags=tags)
        if not ok:
            _say("the evaluation failed; see `ratchet ui` for the step logs")
            return 1
    summary = collect_summary(home)
    from ratchet.evaluation.io import scorecard_text
    from ratchet.warehouse import Warehouse

    print(scorecard_text(Warehouse(home.warehouse)), file=sys.stderr)
    _say(f"scorecard stored at {home.root / 'scorecard.md'} (and in the scorecard asset's metadata and MLflow); "
         f"`ratchet scorecard` prints it again")
    _say(f"done in {time.perf_counter() - t0:.0f} s. Try: ratchet query \"SELECT * FROM v_split_summary\"")
    print(json.dumps({"demo": "ok", "warehouse": str(home.warehouse), **summary}, default=str))
    return 0


def collect_summary(home) -> dict:
    from ratchet.warehouse import Warehouse

    with Warehouse(home.warehouse).connect() as con:
        one = lambda sql: con.execute(sql).fetchall()  # noqa: E731
        return {
            "trajectories": one("SELECT count(*) FROM trajectories")[0][0],
            "quarantine": dict(one("SELECT reason_code, count(*) FROM quarantine GROUP BY 1 ORDER BY 2 DESC")),
            "by_format": dict(one("SELECT source_format, count(*) FROM trajectories GROUP BY 1 ORDER BY 1")),
            "tasks": one("SELECT count(*) FROM tasks")[0][0],
            "splits": dict(one("SELECT split, count(*) FROM split_assignments WHERE kind = 'task' GROUP BY 1 ORDER BY 1")),
            "contamination_passed": one("SELECT passed FROM contamination_report ORDER BY checked_at DESC LIMIT 1")[0][0],
            "holdout_sha256": one("SELECT manifest_sha256 FROM holdout_manifest ORDER BY version DESC LIMIT 1")[0][0],
            "training_set_by_tenant": dict(one("SELECT tenant_id, count(*) FROM training_set GROUP BY 1 ORDER BY 1")),
            "consent_excluded": dict(one("SELECT reason, count(*) FROM consent_audit GROUP BY 1 ORDER BY 2 DESC")),
            "pass_rates": {p: d for p, d in one("SELECT policy_id, pass_rate_display FROM v_eval_latest ORDER BY 1")},
        }
