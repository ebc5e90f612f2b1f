"""One promotion step over the warehouse, as the asset runs it (no Dagster here):

    read_inputs   candidate + champion rows (same digest and holdout) and evidence, or why not yet
    advance       evaluated -> decide (reject / pre-authorised approval) -> named-owner approval
                  -> canary -> promote / roll back / wait, each move one audited row

Every move is idempotent, so running the step again (a second sensor tick, a retried run) only
continues where the promotion stands."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import evidence as E
from . import state as S
from . import tables
from .canary import decide_canary
from .config import CanaryPolicy, GatePolicy
from .gates import Evidence, GateReport


def label(side: dict) -> str:
    """"policy@version", or the policy id alone when it has no version or already names it."""
    pid, ver = side["policy_id"], side["checkpoint_version"] or ""
    return pid if not ver or pid.endswith(f"@{ver}") else f"{pid}@{ver}"


@dataclass
class Inputs:
    candidate: dict                  # policy_id, checkpoint_version
    champion: dict                   # policy_id, checkpoint_version, promotion_id (None: the baseline)
    candidate_rows: list[dict]
    champion_rows: list[dict]
    evidence: Evidence | None
    already_champion: bool = False   # the candidate is the champion: nothing to decide
    waiting: str | None = None       # the evaluation is not finished (seeds missing)


def read_inputs(con, *, baseline: tuple[str, str], now: datetime, candidate: tuple[str, str] | None = None,
                eval_run_id: str | None = None, checkpoint_id: str | None = None, min_seeds: int = 3) -> Inputs:
    """Raises E.MissingEvaluation (with what to do) when there is nothing to promote."""
    E.require_eval_tables(con)
    tables.ready(con)
    row = S.current_champion(con)
    champ = ({"policy_id": row["policy_id"], "checkpoint_version": row["checkpoint_version"] or "",
              "promotion_id": row["promotion_id"]} if row else
             {"policy_id": baseline[0], "checkpoint_version": baseline[1] or "", "promotion_id": None})
    if candidate is None:
        candidate = E.latest_candidate(con, exclude=((champ["policy_id"], champ["checkpoint_version"]),))
        if candidate is None:
            raise E.MissingEvaluation("no learned candidate in eval_episodes (only baselines or the champion): "
                                      "evaluate a candidate on the holdout or name one")
    cand = {"policy_id": candidate[0], "checkpoint_version": candidate[1] or ""}
    if row and (cand["policy_id"], cand["checkpoint_version"]) == (champ["policy_id"], champ["checkpoint_version"]):
        return Inputs(cand, champ, [], [], None, already_champion=True)
    cand_rows = E.eval_rows(con, cand["policy_id"], cand["checkpoint_version"], eval_run_id=eval_run_id)
    if not cand_rows:
        raise E.MissingEvaluation(f"no eval_episodes rows for candidate {label(cand)}"
                                  + (f" in eval runs {eval_run_id}" if eval_run_id else ""))
    champ_rows = E.eval_rows(con, champ["policy_id"], champ["checkpoint_version"],
                             task_digests={r["task_id"]: E.grading(r) for r in cand_rows},
                             holdout_sha256=cand_rows[0]["holdout_sha256"])
    return Inputs(cand, champ, cand_rows, champ_rows, E.gather(con, cand, now, checkpoint_id,
                           judge_ids={r.get("judge_id") for r in cand_rows}),
                  waiting=E.incomplete(cand_rows, champ_rows, min_seeds))


@dataclass
class Outcome:
    promotion_id: str
    state: S.State
    canary: str                      # what the canary did ("not reached", "skipped by config", "wait: ...")
    history: list[dict]
    champion: dict | None            # the champion after this step (None: the baseline)
    refused: str | None = None       # an owner approval that was refused, and why


def advance(con, report: GateReport, inputs: Inputs, *, gate_policy: GatePolicy, canary_policy: CanaryPolicy,
            owner: str | None = None, canary_skip: bool = False, model: dict | None = None,
            actor: str = "promotion", dagster_run_id: str | None = None) -> Outcome:
    run = {"dagster_run_id": dagster_run_id}
    pid = S.record_evaluation(con, report, actor=actor, champion_promotion_id=inputs.champion["promotion_id"],
                              model=model, **run).row["promotion_id"]
    S.decide(con, pid, policy=gate_policy, **run)
    refused = None
    if S.current_state(con, pid) == S.State.EVALUATED and owner:
        try:
            S.approve(con, pid, policy=gate_policy, owner=owner, reason=f"approved by owner {owner}", **run)
        except S.ApprovalRefused as e:
            refused = str(e)
    if S.current_state(con, pid) == S.State.APPROVED:
        S.start_canary(con, pid, actor=actor, evidence={"share": canary_policy.share, "min_tasks": canary_policy.min_tasks},
                       **run)
    note = "not reached"
    if S.current_state(con, pid) == S.State.CANARY:
        note = _canary(con, pid, inputs, canary_policy, canary_skip, actor, run)
    return Outcome(pid, S.current_state(con, pid), note, S.history(con, pid), S.current_champion(con), refused)


def _canary(con, pid: str, inputs: Inputs, pol: CanaryPolicy, skip: bool, actor: str, run: dict[str, Any]) -> str:
    if skip:
        S.promote(con, pid, actor=actor, reason="canary skipped by configuration (canary_skip)",
                  evidence={"canary_skipped": True}, **run)
        return "skipped by config"
    since = next(r["at"] for r in S.history(con, pid) if r["state"] == S.State.CANARY.value)
    c_rows, k_rows, used = E.canary_rows(con, inputs.candidate, inputs.champion, since, pol.share, pol.seed)
    d = decide_canary(c_rows, k_rows, pol, excluded_task_ids=used)
    ev = {"action": d.action, "reasons": list(d.reasons), **d.numbers}
    if d.action == "promote":
        S.promote(con, pid, actor="canary", reason=d.reasons[0], evidence=ev, **run)
    elif d.action == "rollback":
        S.abort_canary(con, pid, actor="canary", reason="; ".join(d.reasons), evidence=ev, **run)
    return f"{d.action}: " + "; ".join(d.reasons)
