"""Stage 9: promotion. A candidate reaches production only if it beats the champion on the locked
holdout and passes every gate; every step is a row in the append-only `promotions` table and the
MLflow aliases (champion / canary / candidate) follow it.

    holdout_eval --(promotion_sensor)--> promotion: gates -> evaluated -> approved | rejected
                                                     -> canary -> promoted | rolled_back

The asset is thin: read rows and evidence (ratchet.promotion.evidence), evaluate the gates
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
    baseline_policy_id: str = "harness:sbfl"           # the champion while nothing has been promoted
    baseline_checkpoint_version: str = ""
    policy_path: Optional[str] = None                  # YAML with `gates:` / `canary:`; default RATCHET_HOME/promotion.yaml
    gates: dict[str, Any] = {}                         # GatePolicy overrides (over the YAML)
    canary: dict[str, Any] = {}                        # CanaryPolicy overrides
    canary_skip: bool = False                          # promote straight after canary start (audited as such)
    owner: Optional[str] = None                        # a named approver (also the run tag ratchet/owner)
    registered_model: str = "ratchet-policy"
    now: Optional[str] = None                          # ISO-8601 evaluation time for consent (replays, tests)


def _policies(cfg: PromotionConfig, root):
    from pathlib import Path

    import yaml

    from ratchet.promotion.config import CanaryPolicy, GatePolicy

    path = Path(cfg.policy_path) if cfg.policy_path else root / "promotion.yaml"
    data = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    if cfg.policy_path and not path.exists():
        raise dg.Failure(f"promotion policy file {path} does not exist")
    return (GatePolicy.from_dict({**(data.get("gates") or {}), **cfg.gates}),
            CanaryPolicy.from_dict({**(data.get("canary") or {}), **cfg.canary}), path if path.exists() else None)


def _canary_rows(con, cand: dict, champ: dict, since, share: float, seed: int):
    """The window's rows on fresh tasks (in no split, not in the holdout), each arm on its routed tasks."""
    from ratchet.promotion.canary import route
    from ratchet.promotion.evidence import eval_rows, has_table

    used = set()
    if has_table(con, "split_assignments"):
        used |= {r[0] for r in con.execute("SELECT source_id FROM split_assignments WHERE kind = 'task'").fetchall()}
    if has_table(con, "holdout_manifest"):
        used |= {r[0] for r in con.execute("SELECT task_id FROM holdout_manifest").fetchall()}
    out = []
    for side, arm in ((cand, "candidate"), (champ, "champion")):
        rows = [r for r in eval_rows(con, side["policy_id"], side["checkpoint_version"])
                if r["task_id"] not in used and (r.get("started_at") is None or r["started_at"] >= since)]
        routed = route(sorted({r["task_id"] for r in rows}), share, seed)
        out.append([r for r in rows if routed[r["task_id"]] == arm])
    return out[0], out[1], used


@dg.asset(group_name="promotion", owners=OWNERS["promotion"], deps=["holdout_eval"], kinds={"duckdb", "mlflow"},
          pool="warehouse", description=(
              "Gates a candidate against the champion on the locked holdout (paired bootstrap, slices, hard gates, "
              "p95 latency, judge kappa, contamination, consent lineage, environment digest, reward hacking), moves "
              "the audited state machine in `promotions` and the MLflow aliases. See docs/promotion.md."))
def promotion(context: dg.AssetExecutionContext, config: PromotionConfig, warehouse: WarehouseResource,
              tracking: MlflowTracking) -> dg.MaterializeResult:
    from ratchet.clock import parse_now
    from ratchet.home import get_home
    from ratchet.markdown import md_table
    from ratchet.promotion import evidence as E
    from ratchet.promotion import registry as R
    from ratchet.promotion import state as S
    from ratchet.promotion import tables
    from ratchet.promotion.canary import decide_canary
    from ratchet.promotion.gates import evaluate_gates

    gate_policy, canary_policy, policy_file = _policies(config, get_home(warehouse.home).root)
    owner = config.owner or context.run.tags.get("ratchet/owner")
    now, run_id = parse_now(config.now), context.run_id
    wh = warehouse.get()
    with wh.connect() as con:
        try:
            E.require_eval_tables(con)
        except E.MissingEvaluation as e:
            raise dg.Failure(str(e)) from None
        tables.ensure(con)
        champ_row = S.current_champion(con)
        champ = ({"policy_id": champ_row["policy_id"], "checkpoint_version": champ_row["checkpoint_version"] or "",
                  "promotion_id": champ_row["promotion_id"]} if champ_row else
                 {"policy_id": config.baseline_policy_id, "checkpoint_version": config.baseline_checkpoint_version,
                  "promotion_id": None})
        if config.candidate_policy_id:
            cand = {"policy_id": config.candidate_policy_id, "checkpoint_version": config.candidate_checkpoint_version or ""}
        else:
            found = E.latest_candidate(con, exclude=((champ["policy_id"], champ["checkpoint_version"]),))
            if found is None:
                raise dg.Failure("no learned candidate in eval_episodes (only baselines or the champion): "
                                 "evaluate a candidate on the holdout or set candidate_policy_id")
            cand = {"policy_id": found[0], "checkpoint_version": found[1]}
        if champ_row and (cand["policy_id"], cand["checkpoint_version"]) == (champ["policy_id"], champ["checkpoint_version"]):
            # A repeated request after the promotion went through: nothing to decide.
            context.log.info(f"{cand['policy_id']}@{cand['checkpoint_version'] or '-'} is already the champion")
            return dg.MaterializeResult(metadata={
                "promotion_id": champ["promotion_id"], "state": "promoted", "verdict": "already the champion",
                "candidate": f"{cand['policy_id']}@{cand['checkpoint_version'] or '-'}",
                "champion_now": f"{cand['policy_id']}@{cand['checkpoint_version'] or '-'}"})
        cand_rows = E.eval_rows(con, cand["policy_id"], cand["checkpoint_version"], eval_run_id=config.eval_run_id)
        if not cand_rows:
            raise dg.Failure(f"no eval_episodes rows for candidate {cand['policy_id']}@{cand['checkpoint_version'] or '-'}"
                             + (f" in eval runs {config.eval_run_id}" if config.eval_run_id else ""))
        champ_rows = E.eval_rows(con, champ["policy_id"], champ["checkpoint_version"],
                                 environment_digest=cand_rows[0]["environment_digest"],
                                 holdout_sha256=cand_rows[0]["holdout_sha256"])
        ev = E.gather(con, cand, now, config.checkpoint_id)
    waiting = E.incomplete(cand_rows, champ_rows, gate_policy.min_seeds)
    if waiting:
        # holdout_eval materialises one policy x seed at a time: decide once every seed is in.
        context.log.info(f"promotion of {cand['policy_id']} waits: {waiting}")
        return dg.MaterializeResult(metadata={
            "state": "waiting", "verdict": "not evaluated yet", "waiting_for": waiting,
            "candidate": f"{cand['policy_id']}@{cand['checkpoint_version'] or '-'}",
            "champion_evaluated_against": f"{champ['policy_id']}@{champ['checkpoint_version'] or '-'}"})
    report = evaluate_gates(cand_rows, champ_rows, ev, gate_policy)

    client = tracking.client()
    model = {"registered_model": config.registered_model,
             "model_version": R.ensure_version(client, cand["policy_id"], cand["checkpoint_version"],
                                               model_name=config.registered_model)}
    canary_note = None
    with wh.connect() as con:
        t = S.record_evaluation(con, report, actor=f"dagster:{run_id}", champion_promotion_id=champ["promotion_id"],
                                model=model, dagster_run_id=run_id)
        pid = t.row["promotion_id"]
        S.decide(con, pid, policy=gate_policy, dagster_run_id=run_id)
        if S.current_state(con, pid) == S.State.EVALUATED and owner:
            try:
                S.approve(con, pid, policy=gate_policy, owner=owner, dagster_run_id=run_id,
                          reason=f"approved by owner {owner} (run {run_id})")
            except S.ApprovalRefused as e:
                context.log.warning(str(e))
        if S.current_state(con, pid) == S.State.APPROVED:
            S.start_canary(con, pid, actor="promotion", dagster_run_id=run_id,
                           evidence={"share": canary_policy.share, "min_tasks": canary_policy.min_tasks})
        if S.current_state(con, pid) == S.State.CANARY:
            since = next(r["at"] for r in S.history(con, pid) if r["state"] == "canary")
            if config.canary_skip:
                S.promote(con, pid, actor=f"dagster:{run_id}", reason="canary skipped by run config (canary_skip)",
                          evidence={"canary_skipped": True}, dagster_run_id=run_id)
                canary_note = "skipped by config"
            else:
                c_rows, k_rows, used = _canary_rows(con, cand, champ, since, canary_policy.share, canary_policy.seed)
                d = decide_canary(c_rows, k_rows, canary_policy, excluded_task_ids=used)
                canary_note = f"{d.action}: " + "; ".join(d.reasons)
                evidence = {"action": d.action, "reasons": list(d.reasons), **d.numbers}
                if d.action == "promote":
                    S.promote(con, pid, actor="canary", reason=d.reasons[0], evidence=evidence, dagster_run_id=run_id)
                elif d.action == "rollback":
                    S.abort_canary(con, pid, actor="canary", reason="; ".join(d.reasons), evidence=evidence,
                                   dagster_run_id=run_id)
        final = S.current_state(con, pid)
        rows = S.history(con, pid)
        new_champ = S.current_champion(con)
    with wh.connect() as con:
        moved = R.apply(con, client, config.registered_model)
    aliases = R.current_aliases(client, config.registered_model)
    context.log.info(f"promotion {pid}: {report.verdict} -> {final.value}; aliases {aliases}")
    return dg.MaterializeResult(metadata={
        "promotion_id": pid, "verdict": report.verdict, "state": final.value,
        "candidate": f"{cand['policy_id']}@{cand['checkpoint_version'] or '-'}",
        "champion_evaluated_against": f"{champ['policy_id']}@{champ['checkpoint_version'] or '-'}"
                                      + ("" if champ["promotion_id"] else " (baseline)"),
        "champion_now": (f"{new_champ['policy_id']}@{new_champ['checkpoint_version'] or '-'}" if new_champ
                         else f"{config.baseline_policy_id} (baseline)"),
        "failing_gates": dg.MetadataValue.json(report.failed),
        "report": dg.MetadataValue.md(report.to_markdown()),
        "history": dg.MetadataValue.md(md_table(["seq", "state", "from", "actor", "reason"], [
            (r["seq"], r["state"], r["previous_state"] or "", r["actor"], r["reason"]) for r in rows])),
        "canary": canary_note or "not reached",
        "aliases": dg.MetadataValue.json(aliases), "aliases_moved": dg.MetadataValue.json(
            {k: list(v) for k, v in moved.items()}),
        "model_version": model["model_version"], "policy_file": str(policy_file) if policy_file else "defaults",
        "candidate_episodes": len(cand_rows), "champion_episodes": len(champ_rows)})


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
    optionally `candidate_eval_run_id`; else the asset picks the newest learned candidate). The run
    key is the event's storage id, so a repeated tick never launches a second run for the same
    event. holdout_eval runs one policy x seed per materialisation: the asset waits (records
    nothing) until every seed of the candidate and the champion is in."""
    cfg = {}
    pid = _meta(entry, "candidate_policy_id", "policy_id")
    if pid:
        cfg["candidate_policy_id"] = pid
        cfg["candidate_checkpoint_version"] = _meta(entry, "candidate_checkpoint_version", "checkpoint_version") or ""
    run = _meta(entry, "candidate_eval_run_id")     # holdout_eval's own `eval_run_id` is one seed's run: not used
    if run:
        cfg["eval_run_id"] = run
    return dg.RunRequest(run_key=f"promotion-{storage_id}", run_config={"ops": {"promotion": {"config": cfg}}},
                         tags={"ratchet/trigger": "holdout_eval", "ratchet/holdout_eval_event": str(storage_id),
                               **({"ratchet/candidate": pid} if pid else {})})


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
    # Baselines (harness / scripted policies) are never candidates; their events request nothing.
    reqs = [promotion_request(r.storage_id, r.event_log_entry) for r in records
            if not (_meta(r.event_log_entry, "candidate_policy_id", "policy_id") or "").startswith(BASELINE_PREFIXES)]
    return reqs or dg.SkipReason(f"{len(records)} new holdout_eval materialisation(s), all of baseline policies")


defs = dg.Definitions(assets=[promotion], jobs=[promotion_job], sensors=[promotion_sensor])
