"""Stage 7-8: 3-seed locked-holdout evaluation, its summary, judge calibration, economics and the
scorecard.

    holdout_manifest --> holdout_eval [policy x seed] --> eval_summary --\\
                                                      \\--> economics ----+--> scorecard
    tasks --> judge_calibration [checks: judge_kappa_drift (warn < 0.78), judge_kappa_gate (blocking < 0.80)]

Policies are dynamic partitions ("policies": add an id with `register_policies`, the UI or a
sensor); seeds are "0", "1", "2". Logic lives in ratchet.evaluation; bodies read, call, write.
"""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from typing import Optional

import dagster as dg

from assets import OWNERS, table_metadata
from ratchet.policy.runner import TURN_BUDGET
from resources import MlflowTracking, WarehouseResource

POLICIES = dg.DynamicPartitionsDefinition(name="policies")
SEEDS = dg.StaticPartitionsDefinition(["0", "1", "2"])
POLICY_X_SEED = dg.MultiPartitionsDefinition({"policy": POLICIES, "seed": SEEDS})
DEFAULT_POLICIES = ("harness:random", "harness:sbfl", "scripted:expert", "scripted:noisy")


def register_policies(instance: dg.DagsterInstance, policy_ids=DEFAULT_POLICIES) -> list[str]:
    """Add policy ids ("<engine>:<name>[@version]") as `holdout_eval` partitions (idempotent)."""
    new = [p for p in policy_ids if not instance.has_dynamic_partition(POLICIES.name, p)]
    if new:
        instance.add_dynamic_partitions(POLICIES.name, new)
    return new


def _manifest_path(warehouse: WarehouseResource, configured: Optional[str]):
    from pathlib import Path

    from ratchet.home import get_home

    return Path(configured) if configured else get_home(warehouse.home).root / "holdout_manifest.json"


def _card(path: Optional[str]):
    from ratchet.evaluation.economics import RateCard

    return RateCard.from_yaml(path) if path else RateCard()


class HoldoutEvalConfig(dg.Config):
    manifest_path: Optional[str] = None   # default RATCHET_HOME/holdout_manifest.json
    workers: Optional[int] = None         # episodes at once; default: the machine's cores
    task_limit: Optional[int] = None      # first N holdout tasks by id (quick runs; recorded in metadata)
    judge: str = "rubric"                 # "rubric" (rubric-v3) | "rubric-v2" | "rubric-v1" | "openai"
    judge_base_url: Optional[str] = None  # for judge = "openai"
    judge_model: Optional[str] = None
    rate_card_path: Optional[str] = None  # YAML (ratchet.evaluation.economics.RateCard); default card
    policy_kwargs_json: str = "{}"        # engine arguments, e.g. {"path": "<checkpoint>"} or {"k": 4}
    retry_infra: bool = False             # re-run episodes whose stored row is an infra failure
    chunk: Optional[int] = None           # learned policies: episodes per pool job (default runner.CHUNK)
    concurrency: Optional[int] = None     # learned policies: episodes open at once per job (runner.CONCURRENCY)
    test_cache: bool = True               # reuse test results an exact repeat of a run gives (sandboxes.result_cache)
    # Turns per episode, for every policy: the budget the embedded recipe trains under
    # (ratchet.policy.runner.TURN_BUDGET); 0 = each task's own limit. Part of the environment digest.
    max_turns: int = TURN_BUDGET


def _judge_name(config) -> str:
    """The judge that graded the episodes, resolved ("rubric" -> "rubric-v3"): a later default
    change must not make old metadata read as the new judge."""
    from sandboxes.verifiers.judge import make_judge

    return make_judge(judge_config(config.judge, config.judge_base_url, config.judge_model)).name


def judge_config(kind: str, base_url: Optional[str], model: Optional[str]) -> dict:
    if kind == "openai":
        if not (base_url and model):
            raise ValueError("judge 'openai' needs judge_base_url and judge_model")
        return {"kind": "openai", "base_url": base_url, "model": model}
    return {"kind": kind}


@dg.asset(partitions_def=POLICY_X_SEED, group_name="evaluation", owners=OWNERS["evaluation"],
          deps=["holdout_manifest"], kinds={"duckdb"}, pool="sandbox", metadata=table_metadata("eval_episodes"),
          description="Every locked holdout task, one seed, one policy, in the hermetic sandbox: one "
                      "`eval_episodes` row each. The manifest is verified first; finished episodes are skipped.")
def holdout_eval(context: dg.AssetExecutionContext, config: HoldoutEvalConfig,
                 warehouse: WarehouseResource) -> dg.MaterializeResult:
    import json

    from ratchet.evaluation import io

    keys = context.partition_key.keys_by_dimension
    policy_id, seed = keys["policy"], int(keys["seed"])
    res = io.run_holdout_eval(warehouse.get(), _manifest_path(warehouse, config.manifest_path), policy_id,
                              seed, workers=config.workers, task_limit=config.task_limit,
                              judge=judge_config(config.judge, config.judge_base_url, config.judge_model),
                              rate_card=_card(config.rate_card_path),
                              policy_kwargs=json.loads(config.policy_kwargs_json),
                              retry_infra=config.retry_infra, run_tag=context.run_id,
                              chunk=config.chunk, concurrency=config.concurrency, test_cache=config.test_cache,
                              max_turns=config.max_turns)
    context.log.info(f"{policy_id} seed {seed}: {res['display']} ({res['ran']} run, {res['skipped']} resumed)")
    # An improvement cycle tags its eval runs with its candidate: that event asks for a promotion.
    cand = {} if context.run.tags.get("ratchet/candidate") != policy_id else {
        "candidate_policy_id": policy_id, "candidate_checkpoint_version": res["checkpoint_version"],
        "candidate_checkpoint_id": context.run.tags.get("ratchet/checkpoint_id", ""),
        "cycle": context.run.tags.get("ratchet/cycle", "")}
    # A cycle's reference rows (its SFT checkpoint, the prompted baseline) fill the scorecard's
    # columns; they are not candidates, so the promotion sensor skips events marked as such.
    role = context.run.tags.get("ratchet/role")
    cand.update({"role": role} if role else {})
    return dg.MaterializeResult(metadata={**cand,
        "policy_id": policy_id, "checkpoint_version": res["checkpoint_version"], "seed": seed,
        "episodes": res["episodes"], "passed": res["passed"], "infra_failures": res["infra"],
        "pass_rate": dg.MetadataValue.float(res["pass_rate"]) if res["pass_rate"] is not None else "not computable",
        "denominator": res["display"], "ran": res["ran"], "resumed_skipped": res["skipped"],
        "wall_s": round(res["wall_s"], 1), "workers": res["workers"], "holdout_sha256": res["holdout_sha256"],
        "task_limit": config.task_limit or 0, "max_turns": res["max_turns"], "eval_run_id": res["eval_run_id"],
        "judge": _judge_name(config),
        "dagster/row_count": res["episodes"]})


class SummaryConfig(dg.Config):
    baseline_policy_id: str = "harness:sbfl"   # the paired difference is against this policy
    n_boot: int = 2000
    ci_seed: int = 0
    manifest_path: Optional[str] = None


@dg.asset(group_name="evaluation", owners=OWNERS["evaluation"], deps=[holdout_eval], kinds={"duckdb"},
          pool="warehouse", metadata=table_metadata("eval_summary"),
          description="Per policy: majority-of-seeds pass rate with a 95% bootstrap CI (explicit denominators, "
                      "infra failures beside), seed spread, paired difference to the baseline, gate and "
                      "human-intervention rates, latency, turns; per slice.")
def eval_summary(context: dg.AssetExecutionContext, config: SummaryConfig,
                 warehouse: WarehouseResource) -> dg.MaterializeResult:
    from ratchet.evaluation import io
    from ratchet.evaluation.scorecard import scorecard_markdown

    rows = io.build_summary(warehouse.get(), _manifest_path(warehouse, config.manifest_path),
                            baseline_policy_id=config.baseline_policy_id, n_boot=config.n_boot,
                            ci_seed=config.ci_seed, run_id=context.run_id)
    alls = [r for r in rows if r["dimension"] == "all"]
    return dg.MaterializeResult(metadata={
        "policies": len(alls), "dagster/row_count": len(rows), "baseline": config.baseline_policy_id,
        "summary": dg.MetadataValue.md(scorecard_markdown(rows) if alls else "no eval_episodes yet"),
        "pass_rates": dg.MetadataValue.json({r["policy_id"] + (f"@{r['checkpoint_version']}" if r["checkpoint_version"]
                                                              else ""): r["pass_rate_display"] for r in alls})})


class JudgeCalibrationConfig(dg.Config):
    judge: str = "rubric"                 # "rubric" (rubric-v3) | "rubric-v2" | "rubric-v1" | "openai"
    judge_base_url: Optional[str] = None
    judge_model: Optional[str] = None
    human_labels_csv: Optional[str] = None   # task_id, explanation, label[, diff, rater, source]
    max_items: int = 600                  # embedded items sampled (seeded) when no CSV is given
    include_transcripts: bool = True      # also the explanations agents submitted in `trajectories`
    n_boot: int = 2000
    seed: int = 0


@dg.asset(group_name="evaluation", owners=OWNERS["evaluation"], deps=["tasks"], kinds={"duckdb"},
          pool="warehouse", metadata=table_metadata("judge_calibration"),
          description="Cohen's kappa (bootstrap CI) between the judge's root-cause verdict and gold labels: "
                      "human labels from a CSV, else the embedded suite's recorded ground truth. Appended.")
def judge_calibration(context: dg.AssetExecutionContext, config: JudgeCalibrationConfig,
                      warehouse: WarehouseResource) -> dg.MaterializeResult:
    from ratchet.evaluation import io

    row = io.run_judge_calibration(warehouse.get(), judge_config(config.judge, config.judge_base_url,
                                                                config.judge_model),
                                   human_labels_csv=config.human_labels_csv, max_items=config.max_items,
                                   include_transcripts=config.include_transcripts,
                                   n_boot=config.n_boot, seed=config.seed, run_id=context.run_id)
    for p in row.pop("problems", [])[:20]:
        context.log.warning(f"human labels: {p}")
    return dg.MaterializeResult(metadata={
        "judge": row["judge_id"], "gold": row["gold_source"], "items": row["items"],
        "kappa": row["kappa"] if row["kappa"] is not None else "no labels",
        "kappa_ci": dg.MetadataValue.json([row["kappa_ci_lo"], row["kappa_ci_hi"]]),
        "status": row["status"], "confusion": dg.MetadataValue.json(row["confusion"]),
        "disagreements": dg.MetadataValue.json(row["disagreements"])})


def _kappa_check(warehouse: WarehouseResource, threshold: float, severity) -> dg.AssetCheckResult:
    from ratchet.evaluation import io

    row = io.latest_calibration(warehouse.get())
    kappa = None if row is None else row["kappa"]
    return dg.AssetCheckResult(passed=kappa is not None and kappa >= threshold, severity=severity, metadata={
        "kappa": kappa if kappa is not None else "no calibration", "threshold": threshold,
        "judge": row["judge_id"] if row else "", "items": row["items"] if row else 0,
        "kappa_ci": dg.MetadataValue.json([row["kappa_ci_lo"], row["kappa_ci_hi"]] if row else [])})


@dg.asset_check(asset=judge_calibration, description="Drift alert: the judge's kappa fell below 0.78.")
def judge_kappa_drift(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from ratchet.evaluation.judge_calibration import WARN_BELOW

    return _kappa_check(warehouse, WARN_BELOW, dg.AssetCheckSeverity.WARN)


@dg.asset_check(asset=judge_calibration, blocking=True,
                description="Promotion gate: the judge's kappa must be >= 0.80 (blocks everything downstream).")
def judge_kappa_gate(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from ratchet.evaluation.judge_calibration import BLOCK_BELOW

    return _kappa_check(warehouse, BLOCK_BELOW, dg.AssetCheckSeverity.ERROR)


class EconomicsConfig(dg.Config):
    rate_card_path: Optional[str] = None
    production_n: int = 10_000            # accepted runs the training investment is spread over
    include_warm_start: bool = False      # count the warm start (SFT before RL) in amortisation
    baseline_policy_id: str = "harness:sbfl"
    checkpoints_json: str = "{}"          # policy id -> checkpoint folder (measured compute in ratchet_checkpoint.json)
    training_json: str = "{}"             # overrides: policy id -> {"usd"} or {"cpu_s", "gpu_s"}, "warm_start_usd"
    manifest_path: Optional[str] = None


@dg.asset(group_name="evaluation", owners=OWNERS["evaluation"], deps=[holdout_eval], kinds={"duckdb"},
          pool="warehouse", metadata=table_metadata("economics"),
          description="The rate card over measured episodes: variable cost per accepted run, training "
                      "investment, sample- and production-amortised cost, break-even vs the baseline.")
def economics(context: dg.AssetExecutionContext, config: EconomicsConfig,
              warehouse: WarehouseResource) -> dg.MaterializeResult:
    import json

    from ratchet.evaluation import io
    from ratchet.markdown import md_table

    rows = io.build_economics(warehouse.get(), _manifest_path(warehouse, config.manifest_path),
                              _card(config.rate_card_path), baseline_policy_id=config.baseline_policy_id,
                              production_n=config.production_n, include_warm_start=config.include_warm_start,
                              training=json.loads(config.training_json),
                              checkpoints=json.loads(config.checkpoints_json), run_id=context.run_id)
    table = md_table(["policy", "accepted", "variable / accepted", "training", "sample-amortised",
                      f"at {config.production_n:,}", "break-even"],
                     [(r["policy_id"], f"{r['accepted_runs']} / {r['episodes']}", r["variable_per_accepted"],
                       r["training_investment"], r["sample_amortised"], r["production_amortised"], r["break_even"])
                      for r in rows])
    return dg.MaterializeResult(metadata={"policies": len(rows), "dagster/row_count": len(rows),
                                          "rate_card": _card(config.rate_card_path).name,
                                          "economics": dg.MetadataValue.md(table)})


SCORECARD_PATH_KEY = "path (relative to RATCHET_HOME)"


class ScorecardConfig(dg.Config):
    order: list[str] = []                  # policy ids, left to right; default: by id
    slice_dimension: str = "family"        # the PNG's per-slice panel
    mlflow: bool = True


@dg.asset(group_name="evaluation", owners=OWNERS["evaluation"], deps=[eval_summary, economics],
          kinds={"duckdb", "mlflow"}, description="The scorecard: Markdown (metadata, RATCHET_HOME/scorecard.md, "
                                                 "MLflow artifact) and a PNG of pass rates with CI bars.")
def scorecard(context: dg.AssetExecutionContext, config: ScorecardConfig, warehouse: WarehouseResource,
              tracking: MlflowTracking) -> dg.MaterializeResult:
    import base64

    from ratchet.evaluation import io

    from ratchet.home import get_home

    out = io.write_scorecard(warehouse.get(), order=config.order, slice_dimension=config.slice_dimension,
                             tag=context.run_id[:8])
    # relative, so the metadata still names the file after RATCHET_HOME moves
    meta = {"scorecard": dg.MetadataValue.md(out["markdown"]),
            SCORECARD_PATH_KEY: dg.MetadataValue.path(get_home(warehouse.home).relative(out["md_path"])),
            "slices": dg.MetadataValue.md(out["slices"])}
    if out["png_path"] is not None:
        data = base64.b64encode(out["png_path"].read_bytes()).decode()
        meta["chart"] = dg.MetadataValue.md(f"![scorecard](data:image/png;base64,{data})")
    if config.mlflow and out["policies"]:
        with tracking.run("ratchet/scorecard", f"scorecard-{context.run_id[:8]}",
                          dagster_run_id=context.run_id) as run:
            run.log_artifact(str(out["md_path"]))
            if out["png_path"] is not None:
                run.log_artifact(str(out["png_path"]))
            run.log_metrics({f"pass_rate.{k}": v for k, v in out["pass_rates"].items() if v is not None})
        meta["mlflow_run"] = dg.MetadataValue.url(run.url)
        meta["mlflow_run_id"] = run.run_id        # the link's host may change: the id finds the run anywhere
    return dg.MaterializeResult(metadata=meta)


holdout_eval_job = dg.define_asset_job("holdout_eval_job", selection=[holdout_eval], partitions_def=POLICY_X_SEED,
                                      description="One policy x seed of the locked-holdout evaluation.")
evaluation_report_job = dg.define_asset_job(
    "evaluation_report_job", selection=["eval_summary", "economics", "scorecard", "judge_calibration"],
    description="Summary, economics, judge calibration and the scorecard over the stored episodes.")


def run_evaluation(instance: dg.DagsterInstance, resources: dict, policies=DEFAULT_POLICIES, seeds=("0", "1", "2"),
                   holdout_config: Optional[dict] = None, report_ops: Optional[dict] = None, log=print,
                   tags: Optional[dict] = None, report: bool = True, run_config: Optional[dict] = None) -> bool:
    """What `make demo` runs: every policy x seed partition of holdout_eval (each resumes), then the
    report assets with their checks. Returns True when every run succeeded. The runs go through the
    named jobs (holdout_eval_job, evaluation_report_job), as the cycle's do: `dg.materialize` would
    list them in the UI as `__ephemeral_asset_job__`. `run_config`: merged into every run's (loggers)."""
    register_policies(instance, policies)
    jobs = dg.Definitions(assets=[holdout_eval, eval_summary, judge_calibration, economics, scorecard],
                          asset_checks=[judge_kappa_drift, judge_kappa_gate],
                          jobs=[holdout_eval_job, evaluation_report_job], resources=resources)
    extra = run_config or {}
    ok = True
    for p in policies:
        for s in seeds:
            res = jobs.resolve_job_def(holdout_eval_job.name).execute_in_process(
                partition_key=dg.MultiPartitionKey({"policy": p, "seed": s}), instance=instance, raise_on_error=False,
                run_config={**extra, "ops": {"holdout_eval": {"config": holdout_config or {}}}},
                tags={**(tags or {}), "ratchet/stage": "holdout_eval"})
            ok &= res.success
            log(f"holdout_eval {p} seed {s}: {'ok' if res.success else 'FAILED'}")
    if not report:          # the caller runs the reports later (the demo: after its improvement cycle)
        return ok
    res = jobs.resolve_job_def(evaluation_report_job.name).execute_in_process(
        instance=instance, raise_on_error=False, run_config={**extra, "ops": report_ops or {}},
        tags={**(tags or {}), "ratchet/stage": "evaluation_report"})
    return ok and res.success


defs = dg.Definitions(assets=[holdout_eval, eval_summary, judge_calibration, economics, scorecard],
                      asset_checks=[judge_kappa_drift, judge_kappa_gate],
                      jobs=[holdout_eval_job, evaluation_report_job])
