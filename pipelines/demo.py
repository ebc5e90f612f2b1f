"""`ratchet demo`: the whole lifecycle on the embedded default, in-process, on the persistent
Dagster instance under RATCHET_HOME (so `ratchet ui` shows the runs afterwards).

1. Build (or load from cache) the HumanEval repair suite.
2. Run the reference agents in the real sandbox and write their logs into the landing folder
   the way production logs arrive (tenants, consent grants, re-logged duplicates, bad lines),
   plus one sample of every foreign format.
3. Run the named `lifecycle_job`: ingest -> tasks -> dedup -> locked splits -> contamination gate
   -> consent -> training views -> judge calibration.
4. Evaluate the baseline policies on the locked holdout, 3 seeds each (`holdout_eval` partitions;
   the demo evaluates the first `eval_tasks` holdout tasks and says so).
5. One improvement cycle (pipelines/cycle.py, the schedule's own path): a candidate for the tenant
   with the most consented training data, base_policy -> SFT -> RL, its holdout evaluation, the
   reports and the promotion decision against the champion (the SBFL harness until something is
   promoted). `--no-train` skips it.
6. Print the scorecard, the economics table, the promotion decision, where the checkpoints and
   curves are, and how to open the UIs; the last line is JSON. `--full` (the reference workload)
   also writes the scorecard, with the commit, date, machine and command, to the repository's
   docs/results/scorecard.md."""
from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ratchet.policy.runner import TURN_BUDGET

QUICK = {"problems": 12, "tasks": 16, "eval_tasks": 4, "foreign": 4}
# The agents' logs are sized for the candidate's training data: at 360 tasks the largest tenant
# has a few dozen consented, accepted train-split trajectories, enough of them from the structured
# agent (the tools the policy is offered) to stay above RecipeSettings.min_structured; at 120
# tasks it fell below, and the fallback to every row made the demo's SFT worse than no training.
FULL = {"problems": None, "tasks": 360, "eval_tasks": 20, "foreign": 24}
REFERENCE = {"problems": None, "tasks": 600, "eval_tasks": 400, "foreign": 40}
DEMO_POLICIES = ("harness:random", "harness:sbfl", "scripted:expert")
# The demo candidate's training, sized for the 15-minute budget on 2 cores (bench/learning.py runs
# the larger recipe). Quick: a smoke-sized model and a step or two.
TRAIN = {"rl_checkpoint": {"config": {"steps": 4, "tasks_per_step": 2, "group_size": 6}}}   # RecipeSettings.demo()
QUICK_TRAIN = {
    "base_policy": {"config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                               "vocab_size": 512}},
    "sft_checkpoint": {"config": {"max_steps": 2, "batch_size": 1, "max_length": 2048}},
    "rl_checkpoint": {"config": {"steps": 1, "tasks_per_step": 1, "group_size": 2, "max_tokens": 24, "max_turns": 2,
                                 "task_limit": 2}}}
QUICK_POLICY: dict = {}
# `--base smollm2`: the candidate starts from the pretrained SmolLM2-135M-Instruct (a LoRA) and trains
# on every accepted row, foreign formats included (sft_data "all"). Sized for 2 cores, where one GRPO
# step of 8 episodes costs ~5 minutes and a learned policy's episode ~13 s
# (docs/experiments/2026-12-05-pretrained-base-costs-traced.md): 16 SFT rows, one GRPO step, 8 holdout
# tasks. A smoke of the pipeline, not a measure of what the base can learn (that is a GPU job).
PRETRAINED_TRAIN = {
    "base_policy": {"config": {"spec": "smollm2", "membership_tasks": 20}},
    "sft_checkpoint": {"config": {"max_steps": 4, "batch_size": 4, "max_length": 2048, "learning_rate": 2e-4,
                                  "threads": 2}},
    "rl_checkpoint": {"config": {"steps": 1, "tasks_per_step": 2, "group_size": 4, "learning_rate": 1e-4,
                                 "validation_tasks": 4}}}
PRETRAINED_EVAL_TASKS = 8
BASES = ("embedded", "smollm2")
# Every in-process run logs to the console at INFO (what each step did, RL's per-step line);
# Dagster's DEBUG events (step started, output yielded, ...) stay in the run logs: `ratchet ui`.
CONSOLE = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def _say(msg: str) -> None:
    print(f"[ratchet demo] {msg}", file=sys.stderr, flush=True)


def prepare_landing(home, size: dict) -> dict:
    """Agent logs from real sandbox runs + foreign-format samples. Idempotent per day: the same
    files are rewritten, so re-running the demo ingests nothing new."""
    from ratchet.samples import write_samples
    from sandboxes.generate import generate, generate_foreign
    from sandboxes.humaneval import build_suite

    t0 = time.perf_counter()
    suite = build_suite(seed=0, limit=size["problems"])
    _say(f"task suite: {len(suite.tasks)} verified repair tasks "
         f"({'cached' if suite.cached else f'built in {suite.build_seconds:.0f} s'})")
    as_of = datetime.now(timezone.utc).date().isoformat()  # logs dated up to today: consent is judged now
    out = home.landing / "agent-logs"
    marker = out / f".generated-{as_of}-{len(suite.tasks)}-{size['tasks']}-{size['foreign']}.json"
    if marker.exists():  # measured latencies differ per run: regenerating would log new content
        logs = json.loads(marker.read_text())
        _say(f"agent logs for {as_of} already in the landing folder ({logs.get('trajectories')} trajectories)")
    else:
        logs = generate(out, n_tasks=size["tasks"], seed=0, suite=suite, as_of=as_of,
                        registry=home.root / "consent_registry.yaml")
        foreign = generate_foreign(home.landing / "foreign-logs", n_tasks=size["foreign"], seed=0, suite=suite,
                                   as_of=as_of)
        logs["foreign"] = foreign["by_format"]
        marker.write_text(json.dumps({k: logs.get(k) for k in ("lines", "trajectories", "foreign")}))
        _say(f"agents ran {size['tasks']} tasks in the sandbox in {time.perf_counter() - t0:.0f} s; the shell agent "
             f"(bash + str_replace_editor) ran {sum(foreign['by_format'].values())} more for {foreign['tenant']}, "
             f"logged as " + ", ".join(f"{n} {fmt} ({foreign['accepted'][fmt]} accepted)"
                                       for fmt, n in foreign["by_format"].items()) + " files")
    samples = write_samples(home.landing / "imports", n_synthetic=0)
    return {"agent_log_lines": logs.get("lines"), "trajectories": logs.get("trajectories"),
            "foreign_logs": logs.get("foreign"), **samples}


def run_demo(home, quick: bool = False, tasks: int | None = None, eval_tasks: int | None = None,
             train: bool = True, full: bool = False, tasks_from: str | None = None, base: str = "embedded") -> int:
    from dagster import DagsterInstance

    from assets.evaluation import run_evaluation
    from pipelines.definitions import defs

    if base not in BASES:
        raise ValueError(f"base must be one of {BASES}, got {base!r}")
    t0 = time.perf_counter()
    _say(f"RATCHET_HOME={home.root}")
    size = dict(QUICK if quick else REFERENCE if full else FULL)
    if tasks:
        size["tasks"] = tasks
    if eval_tasks:
        size["eval_tasks"] = eval_tasks
    written = prepare_landing(home, size)
    _say(f"landing folder ready: {written}")
    job = defs.resolve_job_def("lifecycle_job")
    suite_config: dict = {"limit": size["problems"]}
    if tasks_from:
        # the user's tasks beside the HumanEval suite (the demo's agent logs are written for it):
        # they go through the same governance, and the holdout evaluation runs on whatever the
        # splits put in the holdout; a task that cannot be built is a task_rejections row
        from ratchet.task_sources import sources_from_path

        suite_config["sources"] = sources_from_path(tasks_from)
        _say(f"task sources: {', '.join(s.get('path') or s['kind'] for s in suite_config['sources'])}")
    run_config = {**CONSOLE, "ops": {"task_suite": {"config": suite_config}}}
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
        scope = "the reference workload" if n >= 400 else \
            "the demo's smaller holdout; the reference workload, 400 x 3: ratchet demo --full"
        _say(f"evaluating {', '.join(DEMO_POLICIES)} x 3 seeds on the first {n} locked holdout tasks ({scope}), "
             f"<= {TURN_BUDGET} turns an episode for every policy (the training budget)")
        ok = run_evaluation(instance, defs.resources, policies=DEMO_POLICIES,
                            holdout_config={"task_limit": n}, log=_say, tags=tags, report=not train,
                            run_config=CONSOLE)
        if not ok:
            _say("the evaluation failed; see `ratchet ui` for the step logs")
            return 1
        cycle = improvement_cycle(home, instance, defs, quick, n, base=base) if train else None
        if cycle is not None and not cycle["ok"]:
            _say(f"the improvement cycle failed ({cycle['runs']}); see `ratchet ui` for the step logs")
            return 1
        if train and cycle is None and not run_evaluation(instance, defs.resources, policies=(), log=_say, tags=tags,
                                                          run_config=CONSOLE):
            _say("the evaluation reports failed; see `ratchet ui` for the step logs")
            return 1
    summary = collect_summary(home)
    report(home, cycle)
    if full:
        reference_scorecard(home, size, demo_command(tasks, eval_tasks, train), time.perf_counter() - t0)
    _say(f"done in {time.perf_counter() - t0:.0f} s")
    print(json.dumps({"demo": "ok", "warehouse": str(home.warehouse), **summary,
                      "cycle": _cycle_summary(cycle)}, default=str))
    return 0


def demo_command(tasks: int | None, eval_tasks: int | None, train: bool) -> str:
    """The `ratchet demo --full` command line that reproduces this run (RATCHET_HOME aside)."""
    return " ".join(["ratchet", "demo", "--full", *(["--tasks", str(tasks)] if tasks else []),
                     *(["--eval-tasks", str(eval_tasks)] if eval_tasks else []), *([] if train else ["--no-train"])])


def reference_scorecard(home, size: dict, command: str, seconds: float) -> Path | None:
    """After `--full`: the scorecard to docs/results/scorecard.md, when the run was the reference
    workload (sizes overridden with --tasks / --eval-tasks are not) and the repository's docs
    folder is here (an installed package has none)."""
    from ratchet import results
    from ratchet.evaluation.io import scorecard_text
    from ratchet.warehouse import Warehouse

    if size != REFERENCE:
        _say(f"{command}: not the reference workload ({size} vs {REFERENCE}); "
             f"{results.RESULTS_DIR / REFERENCE_SCORECARD} left as it is")
        return None
    if not results.RESULTS_DIR.parent.is_dir():
        return None
    path = write_reference_scorecard(scorecard_text(Warehouse(home.warehouse)), command, seconds=seconds)
    _say(f"reference scorecard written to {path} (commit it with the code it describes)")
    return path


REFERENCE_SCORECARD = "scorecard.md"


def write_reference_scorecard(scorecard: str, command: str, results_dir: Path | None = None, *,
                              seconds: float | None = None, now: datetime | None = None) -> Path:
    """docs/results/scorecard.md: a generated file. A header says what produced it (commit, date,
    the machine's cores and memory, the command, the wall time), then the scorecard exactly as
    `ratchet scorecard` prints it."""
    from ratchet import results

    results_dir = Path(results_dir) if results_dir is not None else results.RESULTS_DIR
    c, m = results.commit(), results.machine()
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    sha = (c.get("commit") or "unknown") + (" (with uncommitted changes)" if c.get("dirty") else "")
    mem = f"{m['mem_gib']} GiB memory" if m.get("mem_gib") is not None else "memory unknown"
    head = [f"<!-- Generated by `{command}`; do not edit: run it again to refresh. -->",
            "# Reference scorecard", "",
            f"- command: `{command}`",
            f"- commit: {sha}",
            f"- date: {when.strftime('%Y-%m-%d %H:%M UTC')}",
            f"- machine: {m.get('cores')} cores, {mem}" + (f", {m['cpu']}" if m.get("cpu") else "")
            + (f", Python {m['python']}" if m.get("python") else ""),
            *([f"- wall time: {seconds:.0f} s"] if seconds is not None else []), "", ""]
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / REFERENCE_SCORECARD
    path.write_text("\n".join(head) + scorecard.rstrip("\n") + "\n")
    return path


def candidate_ops(quick: bool, base: str) -> dict:
    """The improvement cycle's run config per op: the small base's demo recipe, or the pretrained
    base sized for 2 cores (PRETRAINED_TRAIN; quick: the quick recipe's step counts on it)."""
    if base == "embedded":
        return QUICK_TRAIN if quick else TRAIN
    if not quick:
        return PRETRAINED_TRAIN
    return {"base_policy": {"config": {"spec": "smollm2", "membership_tasks": 2}},
            "sft_checkpoint": {"config": {**QUICK_TRAIN["sft_checkpoint"]["config"], "learning_rate": 2e-4}},
            "rl_checkpoint": {"config": {**QUICK_TRAIN["rl_checkpoint"]["config"], "learning_rate": 1e-4,
                                         "validation_tasks": 1}}}


def improvement_cycle(home, instance, defs, quick: bool, n: int, base: str = "embedded") -> dict | None:
    """One cycle through the schedule's request path: the tenant with the most consented, accepted
    train-split trajectories gets a candidate; the champion phase resumes the baselines' rows."""
    from pipelines.cycle import run_cycle
    from ratchet.cycle import CycleSettings
    from ratchet.training.quiet import quiet_libraries

    counts = training_counts(home)
    if not counts:
        _say("no tenant has consented, accepted train-split trajectories: no candidate to train this time")
        return None
    tenant, n_rows = counts[0]["tenant_id"], counts[0]["n"]
    if base != "embedded" and not quick:
        n = min(n, PRETRAINED_EVAL_TASKS)
        sft, rl = PRETRAINED_TRAIN["sft_checkpoint"]["config"], PRETRAINED_TRAIN["rl_checkpoint"]["config"]
        _say(f"the candidate starts from the pretrained {base} base, sized for 2 cores: SFT {sft['max_steps']} steps of "
             f"{sft['batch_size']} rows (every accepted row can train: foreign formats too), {rl['steps']} GRPO step of "
             f"{rl['tasks_per_step']} x {rl['group_size']} episodes, {n} holdout tasks; a smoke of the pipeline, not a "
             "measure of what the base learns (docs/training.md)")
    per_tenant = ", ".join(f"{r['tenant_id']} {r['n']} ({r['structured']} structured)" for r in counts)
    _say(f"improvement cycle: a candidate for tenant {tenant} ({n_rows} consented, accepted train-split "
         f"trajectories, {counts[0]['structured']} of them from the structured agent"
         f"{', the rows SFT uses' if base == 'embedded' else '; every one can train from this base'}; "
         f"per tenant: {per_tenant}): base_policy -> SFT -> RL, "
         + (f"then the champion and the candidate on the same {n} holdout tasks x 3 seeds, then the promotion gates"
            if not quick else f"quick: {'a smoke-sized model, ' if base == 'embedded' else ''}one RL step, 1 holdout "
                              "task x 3 seeds, then the gates"))
    # quick: the smoke-sized candidate meets the champion on 1 task x 3 seeds (an embedded episode
    # is the slowest thing here)
    settings = CycleSettings(tenant=tenant, candidate="train", eval_task_limit=1 if quick else n, lifecycle=False,
                             ops=candidate_ops(quick, base), policy_kwargs=QUICK_POLICY if quick else {})
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    quiet_libraries()   # the trainer's log dicts and weight-loading bars stay off the console
    # one demo candidate a day: a re-run resumes
    out = run_cycle(instance, defs, settings=settings, when=today, log=_say, run_config=CONSOLE)
    out["tenant"], out["training_trajectories"], out["training_data"] = tenant, n_rows, counts
    return out


def training_counts(home) -> list[dict]:
    """Per tenant: consented, accepted train-split trajectories (`n`) and how many of them call
    only the structured tools the embedded policy is offered (`structured`: what its SFT trains
    on), largest first."""
    from ratchet.store import fetch
    from ratchet.training.data import tenant_training_rows
    from ratchet.training.recipe import structured_rows
    from ratchet.warehouse import Warehouse

    with Warehouse(home.warehouse).store().connect() as con:
        rows = fetch(con, "SELECT ts.tenant_id, count(*) AS n FROM training_set ts JOIN trajectories t "
                          "USING (record_id) WHERE ts.split = 'train' AND t.accepted GROUP BY 1 ORDER BY 2 DESC, 1")
        return [{**r, "structured": len(structured_rows(tenant_training_rows(con, r["tenant_id"])))} for r in rows]


def report(home, cycle: dict | None) -> None:
    """The demo's closing: scorecard, economics, promotion decision, where things are, what next."""
    from ratchet.cycle import read_pointer
    from ratchet.evaluation.io import scorecard_text
    from ratchet.warehouse import Warehouse

    wh = Warehouse(home.warehouse)
    print(scorecard_text(wh), file=sys.stderr)
    if cycle is not None:
        _say("columns: " + "; ".join(f"{pid} = {what}" for pid, what in column_legend(home, cycle["candidate"]))
             + "; harness:* / scripted:* = the no-weights baselines")
        _say(f"the candidate was trained for {cycle.get('tenant')}; training data per tenant (consented, accepted, "
             "train split; structured = every call one of the five structured tools, all the small base's SFT "
             "takes): " + ", ".join(
                 f"{r['tenant_id']} {r['n']} ({r['structured']} structured)" for r in cycle.get("training_data") or ()))
        trained = sft_by_format(wh, cycle.get("tenant"))
        if trained:
            _say("its SFT, per source format (trained / offered; `ratchet query \"SELECT * FROM v_sft_coverage\"`): "
                 + ", ".join(f"{r['source_format']} {r['trained']}/{r['trajectories']}"
                             + (f" (not: {'; '.join(r['reasons'])})" if r.get("reasons") else "") for r in trained)
                 + f" (sft_data: {trained[0]['sft_data']})")
    print(economics_text(wh), file=sys.stderr)
    _say(f"scorecard stored at {home.root / 'scorecard.md'} (and in the scorecard asset's metadata and MLflow); "
         f"`ratchet scorecard` prints it again")
    if cycle is not None:
        cand = cycle["candidate"]
        for stage in ("sft", "rl"):
            try:
                ptr = read_pointer(home.checkpoints, cand, stage)
            except FileNotFoundError:
                continue
            _say(f"{stage} checkpoint {ptr['checkpoint_id']}: {ptr['path']} (learning curve: {ptr.get('curve', '-')})")
        p = cycle["promotion"]
        if p:
            gates = ", ".join(p.get("failing_gates") or []) or "none"
            _say(f"promotion decision for {p.get('candidate')} against {p.get('champion_evaluated_against')}: "
                 f"{str(p.get('state')).upper()} (verdict {p.get('verdict')}; failing gates: {gates}); "
                 f"champion now: {p.get('champion_now', '-')}")
            _say("gate report: ratchet query \"SELECT seq, state, actor, reason FROM v_promotion_history\"")
    _say("open the Dagster UI: ratchet ui   (asset graph, runs, checks, the weekly improvement_schedule)")
    _say("open the MLflow UI:  ratchet mlflow   (checkpoints, learning curves, scorecards)")
    _say("query DuckDB:        ratchet query \"SELECT * FROM v_policy_scorecard\"   "
         "(also v_economics, v_slice_deltas, v_lineage, v_consent_exclusions)")


def sft_by_format(wh, tenant: str | None) -> list[dict]:
    """The tenant's newest SFT checkpoint's rows per source format (`v_sft_coverage`): how many of
    the trajectories it was offered trained, and why the others did not."""
    if not tenant:
        return []
    return wh.store().read(
        "SELECT source_format, sft_data, trajectories, trained, reasons FROM v_sft_coverage WHERE checkpoint_id = "
        "(SELECT checkpoint_id FROM sft_coverage WHERE tenant_id = ? ORDER BY created_at DESC LIMIT 1) "
        "AND tenant_id = ? ORDER BY source_format", [tenant, tenant])


def column_legend(home, cycle: str) -> list[tuple[str, str]]:
    """(policy id, what it is) for the cycle's learned columns: the prompted baseline, SFT and
    RL candidate (the scorecard names policies by id)."""
    from ratchet.cycle import base_policy_id, checkpoint_policy_id, read_pointer

    out = []
    for parts, what in (((("base",)), "prompted baseline (base_policy, no weight change)"),
                        ((cycle, "sft"), "SFT"), ((cycle, "rl"), "RL candidate")):
        try:
            ptr = read_pointer(home.checkpoints, *parts)
        except FileNotFoundError:
            continue
        out.append((base_policy_id(ptr["path"]) if parts == ("base",)
                    else checkpoint_policy_id(ptr["model_name"], ptr["version"]), what))
    return out


def economics_text(wh) -> str:
    """The economics table (`v_economics`, newest row per policy) as Markdown."""
    from ratchet.markdown import md_table

    rows = wh.store().read("SELECT * FROM v_economics QUALIFY row_number() OVER "
                           "(PARTITION BY policy_id, checkpoint_version ORDER BY computed_at DESC) = 1")
    if not rows:
        return "economics: no rows yet (materialise `economics`)"
    n = rows[0]["production_n"]
    return "\nEconomics (rate card " + str(rows[0]["rate_card"]) + "; `ratchet query \"SELECT * FROM v_economics\"`)\n\n" + md_table(
        ["policy", "accepted / episodes", "variable / accepted", "training", "sample-amortised",
         f"at {n:,} runs", "break-even vs " + str(rows[0]["baseline_policy_id"])],
        [(r["policy_id"] + (f"@{r['checkpoint_version']}" if r["checkpoint_version"] and not
                            r["policy_id"].endswith(f"@{r['checkpoint_version']}") else ""),
          f"{r['accepted_runs']} / {r['episodes']}", r["variable_per_accepted"], r["training_investment"],
          r["sample_amortised"], r["production_amortised"], r["break_even"]) for r in rows])


def _cycle_summary(cycle: dict | None) -> dict | None:
    if cycle is None:
        return None
    p = cycle["promotion"] or {}
    return {"candidate": cycle["candidate"], "tenant": cycle.get("tenant"),
            "training_trajectories": cycle.get("training_trajectories"), "training_data": cycle.get("training_data"),
            "policy": p.get("candidate"), "decision": p.get("state"), "verdict": p.get("verdict"),
            "failing_gates": p.get("failing_gates"), "champion_now": p.get("champion_now")}


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
