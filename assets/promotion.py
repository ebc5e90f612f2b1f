"""Stage 9: promotion. A candidate reaches production only if it beats the champion on the locked
holdout and passes every gate; every step is a row in the append-only `promotions` table and the
MLflow aliases (champion / canary / candidate) follow it.

    holdout_eval --(promotion_sensor)--> promotion: gates -> evaluated -> approved | rejected
                                                     -> canary -> promoted | rolled_back

The asset is thin: read rows and evidence (ratchet.promotion.evidence; the exploit library's
replay through ratchet.promotion.redteam_check, run only for a new environment), evaluate the gates
(ratchet.promotion.gates), move the state machine (ratchet.promotion.state), sync the aliases
(ratchet.promotion.registry), return the report as metadata. Documented in docs/promotion.md.
"""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from typing import Any, Optional

import dagster as dg

from assets import OWNERS
from resources import MlflowTracking, WarehouseResource


class PromotionConfig(dg.Config):
    candidate_policy_id: Optional[str] = None          # default: the newest evaluated learned policy
    candidate_checkpoint_version: Optional[str] = None  # "" for a policy without weights
    eval_run_id: Optional[str] = None                  # comma-separated eval runs to restrict the candidate to
    checkpoint_id: Optional[str] = None                # its `checkpoints` row, if not named by its version
    baseline_policy_id: Optional[str] = None           # the champion while nothing has been promoted;
                                                       #   default: promotion.yaml `baseline:`, else harness:sbfl
    baseline_checkpoint_version: str = ""
    policy_path: Optional[str] = None                  # YAML with `gates:` / `canary:`; default RATCHET_HOME/promotion.yaml
    gates: dict[str, Any] = {}                         # GatePolicy overrides (over the YAML)
    canary: dict[str, Any] = {}                        # CanaryPolicy overrides
    canary_skip: Optional[bool] = None                 # promote straight after canary start (audited as such);
                                                       #   default: promotion.yaml `canary_skip:`, else False
    owner: Optional[str] = None                        # a named approver (also the run tag ratchet/owner)
    registered_model: str = "ratchet-policy"
    now: Optional[str] = None                          # ISO-8601 evaluation time for consent (replays, tests)


def _policies(cfg: PromotionConfig, root):
    from pathlib import Path

    from ratchet.promotion.config import DEFAULT_BASELINE, POLICY_FILE, CanaryPolicy, GatePolicy, policy_file

    path = Path(cfg.policy_path) if cfg.policy_path else root / POLICY_FILE
    if cfg.policy_path and not path.exists():
        raise dg.Failure(f"promotion policy file {path} does not exist")
    try:
        data = policy_file(path)
    except ValueError as e:
        raise dg.Failure(str(e)) from None
    baseline = cfg.baseline_policy_id or data.get("baseline") or DEFAULT_BASELINE
    skip = cfg.canary_skip if cfg.canary_skip is not None else bool(data.get("canary_skip", False))
    return (GatePolicy.from_dict({**(data.get("gates") or {}), **cfg.gates}),
            CanaryPolicy.from_dict({**(data.get("canary") or {}), **cfg.canary}), path if path.exists() else None,
            baseline, skip)


@dg.asset(group_name="promotion", owners=OWNERS["promotion"], deps=["holdout_eval"], kinds={"duckdb", "mlflow"},
          pool="warehouse", description=(
              "Gates a candidate against the champion on the locked holdout (paired bootstrap, slices, hard gates, "
              "p95 latency, judge kappa, contamination, consent lineage, environment digest, reward hacking), moves "
              "the audited state machine in `promotions` and the MLflow aliases. See docs/promotion.md."))
def promotion(context: dg.AssetExecutionContext, config: PromotionConfig, warehouse: WarehouseResource,
              tracking: MlflowTracking) -> dg.MaterializeResult:
    from dataclasses import replace

    from ratchet.clock import parse_now
    from ratchet.home import get_home
    from ratchet.markdown import md_table
    from ratchet.promotion import redteam_check, registry
    from ratchet.promotion.evidence import MissingEvaluation
    from ratchet.promotion.flow import advance, label, read_inputs
    from ratchet.promotion.gates import evaluate_gates

    gate_policy, canary_policy, policy_file, baseline, canary_skip = _policies(config, get_home(warehouse.home).root)
    wh = warehouse.get()
    named = (config.candidate_policy_id, config.candidate_checkpoint_version or "") if config.candidate_policy_id else None

    def inputs_now():
        with wh.connect() as con:
            try:
                return read_inputs(con, baseline=(baseline, config.baseline_checkpoint_version),
                                   now=parse_now(config.now), candidate=named, eval_run_id=config.eval_run_id,
                                   checkpoint_id=config.checkpoint_id, min_seeds=gate_policy.min_seeds)
            except MissingEvaluation as e:
                raise dg.Failure(str(e)) from None

    inputs = inputs_now()
    cand, champ = label(inputs.candidate), label(inputs.champion) + ("" if inputs.champion["promotion_id"] else " (baseline)")
    if inputs.already_champion or inputs.waiting:
        # A repeated request after the promotion went through, or holdout_eval (one policy x seed per
        # materialisation) has not finished every seed: nothing to record yet.
        why = "already the champion" if inputs.already_champion else inputs.waiting
        context.log.info(f"promotion of {cand}: {why}")
        return dg.MaterializeResult(metadata={"state": "promoted" if inputs.already_champion else "waiting",
                                              "verdict": why, "candidate": cand, "champion_evaluated_against": champ})

    # The reward-hacking gate's second source: the exploit library on this environment, replayed
    # here (seconds per task) only when no replay of its digest is stored.
    red = redteam_check.ensure(wh, dagster_run_id=context.run_id)
    if red.ran:
        context.log.info(f"reward_redteam: replayed the exploit library on {red.rows[0]['tasks']} "
                         f"in {red.rows[0]['seconds']:.1f} s")
        inputs = inputs_now()
    elif red.why:
        context.log.warning(f"reward_redteam: {red.why}")
        if inputs.evidence is not None:        # the gate's detail says why there is no replay
            src = inputs.evidence.sources.get("reward_redteam")
            inputs.evidence = replace(inputs.evidence, sources={
                **inputs.evidence.sources, "reward_redteam": red.why if src == red.why else f"{src}; {red.why}"})
    report = evaluate_gates(inputs.candidate_rows, inputs.champion_rows, inputs.evidence, gate_policy)
    client = tracking.client()
    model = {"registered_model": config.registered_model, "model_version": registry.ensure_version(
        client, inputs.candidate["policy_id"], inputs.candidate["checkpoint_version"], model_name=config.registered_model)}
    with wh.connect() as con:
        out = advance(con, report, inputs, gate_policy=gate_policy, canary_policy=canary_policy,
                      owner=config.owner or context.run.tags.get("ratchet/owner"), canary_skip=canary_skip,
                      model=model, actor=f"dagster:{context.run_id}", dagster_run_id=context.run_id)
        moved = registry.apply(con, client, config.registered_model)
    if out.refused:
        context.log.warning(out.refused)
    aliases = registry.current_aliases(client, config.registered_model)
    context.log.info(f"promotion {out.promotion_id}: {report.verdict} -> {out.state.value}; aliases {aliases}")
    return dg.MaterializeResult(metadata={
        "promotion_id": out.promotion_id, "verdict": report.verdict, "state": out.state.value,
        "candidate": cand, "champion_evaluated_against": champ,
        "champion_now": label(out.champion) if out.champion else f"{baseline} (baseline)",
        "failing_gates": dg.MetadataValue.json(report.failed),
        "report": dg.MetadataValue.md(report.to_markdown()),
        "history": dg.MetadataValue.md(md_table(["seq", "state", "from", "actor", "reason"], [
            (r["seq"], r["state"], r["previous_state"] or "", r["actor"], r["reason"]) for r in out.history])),
        "canary": out.canary, "owner_refused": out.refused or "",
        "aliases": dg.MetadataValue.json(aliases),
        "aliases_moved": dg.MetadataValue.json({k: list(v) for k, v in moved.items()}),
        "model_version": model["model_version"],
        "policy_file": get_home(warehouse.home).relative(policy_file) if policy_file else "defaults",
        "candidate_episodes": len(inputs.candidate_rows), "champion_episodes": len(inputs.champion_rows),
        "reward_redteam": (f"{'replayed' if red.ran else 'reused'} {red.rows[0]['redteam_id']} "
                           f"(environment {red.digest[:19]}...)" if red.rows else red.why)})


promotion_job = dg.define_asset_job("promotion_job", selection=[promotion], tags={"ratchet/stage": "promotion"},
                                    description="Gate the newest holdout-evaluated candidate and move it through promotion.")


BASELINE_PREFIXES = ("harness:", "scripted:")   # as ratchet.promotion.evidence (kept light: no import at load)


def _meta(entry, *keys):
    mat = entry.asset_materialization
    md = mat.metadata if mat else {}
    for k in keys:
        if k in md:
            v = md[k]
            return str(getattr(v, "value", v))
    return None


def promotion_request(storage_id: int, entry) -> dg.RunRequest:
    """The run for one holdout_eval materialisation: its candidate (from the event's metadata
    `candidate_policy_id` / `policy_id`, `candidate_checkpoint_version` / `checkpoint_version`,
    optionally `candidate_checkpoint_id` and `candidate_eval_run_id`; else the asset picks the newest learned candidate). The run
    key is the event's storage id, so a repeated tick never launches a second run for the same
    event. holdout_eval runs one policy x seed per materialisation: the asset waits (records
    nothing) until every seed of the candidate and the champion is in."""
    cfg = {}
    pid = _meta(entry, "candidate_policy_id", "policy_id")
    if pid:
        cfg["candidate_policy_id"] = pid
        cfg["candidate_checkpoint_version"] = _meta(entry, "candidate_checkpoint_version", "checkpoint_version") or ""
    ckpt = _meta(entry, "candidate_checkpoint_id")
    if ckpt:
        cfg["checkpoint_id"] = ckpt
    run = _meta(entry, "candidate_eval_run_id")     # holdout_eval's own `eval_run_id` is one seed's run: not used
    if run:
        cfg["eval_run_id"] = run
    cycle = _meta(entry, "cycle")
    return dg.RunRequest(run_key=f"promotion-{storage_id}", run_config={"ops": {"promotion": {"config": cfg}}},
                         tags={"ratchet/trigger": "holdout_eval", "ratchet/holdout_eval_event": str(storage_id),
                               **({"ratchet/candidate": pid} if pid else {}), **({"ratchet/cycle": cycle} if cycle else {})})


def _is_candidate(entry) -> bool:
    """A learned policy's evaluation, or any policy a cycle named as its candidate (a harness or
    prompt variant is a configuration change that may be promoted too). Baselines evaluated for
    comparison (harness / scripted, not a cycle's candidate) and a cycle's reference rows (role
    "reference": its SFT checkpoint, the prompted baseline) request nothing."""
    if _meta(entry, "role") == "reference":
        return False
    if _meta(entry, "candidate_policy_id"):
        return True
    return not (_meta(entry, "policy_id") or "").startswith(BASELINE_PREFIXES)


@dg.sensor(job=promotion_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Requests the promotion asset for the candidate of each new holdout_eval materialisation. "
                       "Cursor: the last event's storage id; run key per event (a repeated tick never launches twice).")
def promotion_sensor(context: dg.SensorEvaluationContext):
    after = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("holdout_eval"), after_storage_id=after),
        limit=20, ascending=True).records
    if not records:
        return dg.SkipReason(f"no holdout_eval materialisation after event {after}")
    context.update_cursor(str(records[-1].storage_id))
    reqs = [promotion_request(r.storage_id, r.event_log_entry) for r in records if _is_candidate(r.event_log_entry)]
    return reqs or dg.SkipReason(f"{len(records)} new holdout_eval materialisation(s), all of baseline policies")


defs = dg.Definitions(assets=[promotion], jobs=[promotion_job], sensors=[promotion_sensor])
