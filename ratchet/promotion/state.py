"""The promotion state machine, persisted in the append-only `promotions` table.

    evaluated -> approved -> canary -> promoted -> rolled_back
        |            |          \\-> rolled_back   (canary regression: the champion never changed)
        \\-> rejected \\-> rejected                  (with the failing gates)

One `transition()` checks the move against TRANSITIONS and appends a row in one DuckDB
transaction. A state already reached by that promotion is not applied again (the unique
(promotion_id, state) index backs this up under concurrency): two sensor ticks requesting the
same move append one row. Approval is by the pre-authorised gate policy (every gate passed) or
by a named owner (recorded as `owner:<name>`); nobody approves past a failed hard gate, and the
gate report is read back from the stored `evaluated` row, not taken from the caller. Promotion
refuses a candidate evaluated against a champion that is no longer the champion.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from . import tables


class State(str, Enum):
    EVALUATED = "evaluated"
    APPROVED = "approved"
    CANARY = "canary"
    PROMOTED = "promoted"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"


TRANSITIONS: dict[State | None, frozenset[State]] = {
    None: frozenset({State.EVALUATED}),
    State.EVALUATED: frozenset({State.APPROVED, State.REJECTED}),
    State.APPROVED: frozenset({State.CANARY, State.REJECTED}),
    State.CANARY: frozenset({State.PROMOTED, State.ROLLED_BACK}),
    State.PROMOTED: frozenset({State.ROLLED_BACK}),
    State.REJECTED: frozenset(),
    State.ROLLED_BACK: frozenset(),
}


class IllegalTransition(ValueError):
    """A move the state machine does not allow (or whose preconditions do not hold)."""


class ApprovalRefused(IllegalTransition):
    """Approval past a failed gate, or by someone not allowed to approve."""


class StaleChampion(IllegalTransition):
    """The candidate was evaluated against a champion that has since been replaced."""


@dataclass(frozen=True)
class Transition:
    row: dict          # the row that records the state (the earlier one when not applied)
    applied: bool      # False: the state had already been reached (a repeated request)

    @property
    def state(self) -> State:
        return State(self.row["state"])


def promotion_key(policy_id: str, checkpoint_version: str, eval_run_ids: Iterable[str] = (),
                  champion: str = "") -> str:
    """Deterministic id of one candidate evaluation: every tick for it gets the same id."""
    raw = "|".join([policy_id, checkpoint_version or "", ",".join(sorted(eval_run_ids)), champion])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


_COLS = [f.name for f in tables.PROMOTIONS]
_INSERT = "INSERT INTO promotions ({}) VALUES ({})".format(", ".join(f'"{c}"' for c in _COLS), ", ".join("?" * len(_COLS)))


def _rows(con, sql: str, params: list | None = None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def history(con, promotion_id: str | None = None) -> list[dict]:
    """Every row (of one promotion, or all), oldest first; evidence decoded."""
    where, params = ("WHERE promotion_id = ?", [promotion_id]) if promotion_id else ("", [])
    rows = _rows(con, f"SELECT * FROM promotions {where} ORDER BY seq", params)
    for r in rows:
        r["evidence"] = json.loads(r["evidence"]) if r["evidence"] else None
    return rows


def current_state(con, promotion_id: str) -> State | None:
    r = con.execute("SELECT state FROM promotions WHERE promotion_id = ? ORDER BY seq DESC LIMIT 1",
                    [promotion_id]).fetchall()
    return State(r[0][0]) if r else None


def current_champion(con) -> dict | None:
    """The promoted row of the newest promotion whose current state is still `promoted`; None
    when nothing has been promoted (or every promotion was rolled back): the baseline serves."""
    rows = _rows(con, """
        SELECT p.* FROM promotions p
        JOIN (SELECT promotion_id, max(seq) AS seq FROM promotions GROUP BY 1) l USING (promotion_id, seq)
        WHERE p.state = 'promoted' ORDER BY p.seq DESC LIMIT 1""")
    if not rows:
        return None
    r = rows[0]
    r["evidence"] = json.loads(r["evidence"]) if r["evidence"] else None
    return r


def transition(con, promotion_id: str, to: State | str, *, actor: str, reason: str = "",
               evidence: Any = None, failing_gates: Iterable[str] = (), verdict: str | None = None,
               candidate: Mapping | None = None, champion: Mapping | None = None,
               model: Mapping | None = None, dagster_run_id: str | None = None, guard=None,
               now: datetime | None = None, attempts: int = 50) -> Transition:
    """Append `promotion_id`'s move to `to`, or return the existing row if it already got there.
    `candidate` (policy_id, checkpoint_version, eval_run_id) and `champion` (policy_id,
    checkpoint_version, promotion_id) are copied forward from the previous row when omitted.
    `guard(con, history)` may raise to refuse the move; it runs inside the transaction.
    A write conflict with a concurrent transaction (same state or seq) is retried: the retry
    then sees the other's row and returns it unapplied, or applies its own."""
    import time

    import duckdb

    for attempt in range(attempts):
        try:
            return _transition_once(con, promotion_id, State(to), actor=actor, reason=reason, evidence=evidence,
                                    failing_gates=failing_gates, verdict=verdict, candidate=candidate,
                                    champion=champion, model=model, dagster_run_id=dagster_run_id, guard=guard,
                                    now=now)
        except (duckdb.ConstraintException, duckdb.TransactionException):
            if attempt == attempts - 1:
                raise
            time.sleep(0.005 * (attempt + 1))
    raise AssertionError("unreachable")


def _transition_once(con, promotion_id: str, to: State, *, actor, reason, evidence, failing_gates, verdict,
                     candidate, champion, model, dagster_run_id, guard, now) -> Transition:
    if not actor:
        raise ValueError("a transition needs an actor (who or what asked for it)")
    tables.ready(con)
    con.execute("BEGIN TRANSACTION")
    try:
        past = history(con, promotion_id)
        done = next((r for r in past if r["state"] == to.value), None)
        if done is not None:
            con.execute("ROLLBACK")
            return Transition(done, applied=False)
        cur = State(past[-1]["state"]) if past else None
        if to not in TRANSITIONS[cur]:
            allowed = sorted(s.value for s in TRANSITIONS[cur]) or ["none: it is final"]
            raise IllegalTransition(f"promotion {promotion_id}: {cur.value if cur else '(new)'} -> {to.value} is not "
                                    f"allowed; from {cur.value if cur else '(new)'} the next states are {allowed}")
        if cur is None and not candidate:
            raise IllegalTransition(f"promotion {promotion_id}: the first row needs the candidate (policy_id, ...)")
        if guard is not None:
            guard(con, past)
        last = past[-1] if past else {}
        cand, champ, mdl = dict(candidate or {}), dict(champion or {}), dict(model or {})
        row = {
            "seq": con.execute("SELECT coalesce(max(seq), 0) + 1 FROM promotions").fetchall()[0][0],
            "promotion_id": promotion_id,
            "policy_id": cand.get("policy_id", last.get("policy_id")),
            "checkpoint_version": cand.get("checkpoint_version", last.get("checkpoint_version")) or "",
            "eval_run_id": cand.get("eval_run_id", last.get("eval_run_id")),
            "champion_policy_id": champ.get("policy_id", last.get("champion_policy_id")),
            "champion_checkpoint_version": champ.get("checkpoint_version", last.get("champion_checkpoint_version")),
            "champion_promotion_id": champ.get("promotion_id", last.get("champion_promotion_id")),
            "state": to.value, "previous_state": cur.value if cur else None, "actor": actor, "reason": reason,
            "verdict": verdict, "failing_gates": list(failing_gates),
            "evidence": None if evidence is None else json.dumps(evidence, default=str, sort_keys=True),
            "registered_model": mdl.get("registered_model", last.get("registered_model")),
            "model_version": mdl.get("model_version", last.get("model_version")),
            "at": now or datetime.now(UTC), "dagster_run_id": dagster_run_id,
        }
        con.execute(_INSERT,
                    [row[c] for c in _COLS])
        con.execute("COMMIT")
    except BaseException:
        _rollback(con)
        raise
    row["evidence"] = evidence
    return Transition(row, applied=True)


def _rollback(con) -> None:
    try:
        con.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - already rolled back by DuckDB after a conflict
        pass


# ----------------------------------------------------------------------------- the moves
def record_evaluation(con, report, *, promotion_id: str | None = None, actor: str = "promotion",
                      champion_promotion_id: str | None = None, model: Mapping | None = None,
                      dagster_run_id: str | None = None, now: datetime | None = None) -> Transition:
    """The `evaluated` row for a GateReport (or its to_dict()): the stored report is what every
    later approval is checked against."""
    rep = report if isinstance(report, Mapping) else report.to_dict()
    c, k = rep["candidate"], rep["champion"]
    # The champion's promotion id is part of the key: the same evaluation judged against another
    # reign of the champion (after a rollback and a re-promotion) is another decision.
    pid = promotion_id or promotion_key(c["policy_id"], c["checkpoint_version"], c.get("eval_run_ids", ()),
                                        f"{k['policy_id']}@{k['checkpoint_version']}#{champion_promotion_id or 'baseline'}")
    return transition(
        con, pid, State.EVALUATED, actor=actor, reason=f"gates: {rep['verdict']}", evidence=rep,
        failing_gates=rep["failed"], verdict=rep["verdict"], dagster_run_id=dagster_run_id, now=now, model=model,
        candidate={"policy_id": c["policy_id"], "checkpoint_version": c["checkpoint_version"],
                   "eval_run_id": ",".join(c.get("eval_run_ids", ()))},
        champion={"policy_id": k["policy_id"], "checkpoint_version": k["checkpoint_version"],
                  "promotion_id": champion_promotion_id})


def _evaluated(past: list[dict]) -> dict:
    ev = next((r for r in past if r["state"] == State.EVALUATED.value), None)
    if ev is None or not ev["evidence"]:
        raise IllegalTransition("no evaluated row with a gate report: evaluate before approving")
    return ev


def approve(con, promotion_id: str, *, policy, owner: str | None = None, reason: str = "",
            dagster_run_id: str | None = None, now: datetime | None = None) -> Transition:
    """Approve by the pre-authorised `policy` (owner None: every gate must have passed and
    policy.auto_approve must be on) or by a named owner (no hard gate may have failed; soft
    failures are waived and recorded). Raises ApprovalRefused otherwise."""
    def guard(con, past):
        rep = _evaluated(past)["evidence"]
        hard = rep.get("failed_hard", [])
        if hard:
            raise ApprovalRefused(f"promotion {promotion_id}: hard gate(s) {hard} failed; nobody approves past a "
                                  f"failed hard gate")
        if owner is None:
            if not policy.auto_approve:
                raise ApprovalRefused(f"policy {policy.name!r} does not pre-authorise approval: a named owner must approve")
            if rep.get("failed"):
                raise ApprovalRefused(f"promotion {promotion_id}: gate(s) {rep['failed']} failed; the pre-authorised "
                                      f"policy approves only when every gate passes (a named owner may waive soft gates)")
        elif policy.owners and owner not in policy.owners:
            raise ApprovalRefused(f"{owner!r} is not an approver for policy {policy.name!r} (owners: {list(policy.owners)})")

    who = f"owner:{owner}" if owner else f"policy:{policy.name}"
    if owner:
        stored = next((r for r in history(con, promotion_id) if r["state"] == State.EVALUATED.value), None)
        waived = (stored or {}).get("failing_gates") or []
        reason = (reason or f"approved by owner {owner}") + (f"; waived soft gates {waived}" if waived else "")
    return transition(con, promotion_id, State.APPROVED, actor=who, guard=guard,
                      reason=reason or "pre-authorised: every gate passed", dagster_run_id=dagster_run_id, now=now)


def reject(con, promotion_id: str, *, actor: str, reason: str = "", dagster_run_id: str | None = None,
           now: datetime | None = None) -> Transition:
    """Reject, carrying the failing gates of the stored evaluation."""
    past = history(con, promotion_id)
    failing = next((r["failing_gates"] for r in past if r["state"] == State.EVALUATED.value), []) or []
    return transition(con, promotion_id, State.REJECTED, actor=actor, failing_gates=failing,
                      reason=reason or f"failing gates: {', '.join(failing) or 'none recorded'}",
                      dagster_run_id=dagster_run_id, now=now)


def decide(con, promotion_id: str, *, policy, dagster_run_id: str | None = None,
           now: datetime | None = None) -> Transition | None:
    """What the pre-authorised policy does after an evaluation: reject a failed hard gate or a
    non-comparable result, approve when every gate passed (if auto_approve), else leave it
    `evaluated` for a named owner (returns None)."""
    rep = _evaluated(history(con, promotion_id))["evidence"]
    actor = f"policy:{policy.name}"
    if rep["verdict"] in ("reject", "not_comparable"):
        return reject(con, promotion_id, actor=actor, dagster_run_id=dagster_run_id, now=now,
                      reason=f"{rep['verdict']}: " + ", ".join(rep["failed"]))
    if rep["verdict"] == "pass" and policy.auto_approve:
        return approve(con, promotion_id, policy=policy, dagster_run_id=dagster_run_id, now=now)
    return None


def start_canary(con, promotion_id: str, *, actor: str, reason: str = "canary started", evidence: Any = None,
                 dagster_run_id: str | None = None, now: datetime | None = None) -> Transition:
    return transition(con, promotion_id, State.CANARY, actor=actor, reason=reason, evidence=evidence,
                      dagster_run_id=dagster_run_id, now=now)


def _not_stale(promotion_id: str):
    def guard(con, past):
        expected = past[0]["champion_promotion_id"]
        champ = current_champion(con)
        now_id = champ["promotion_id"] if champ else None
        if now_id != expected:
            raise StaleChampion(
                f"promotion {promotion_id} was evaluated against champion {expected or 'baseline ' + str(past[0]['champion_policy_id'])}"
                f" but the champion is now {now_id or 'the baseline'}: re-evaluate against the current champion")
    return guard


def promote(con, promotion_id: str, *, actor: str, reason: str = "canary passed", evidence: Any = None,
            dagster_run_id: str | None = None, now: datetime | None = None) -> Transition:
    """canary -> promoted: the candidate becomes the champion (refused if the champion changed)."""
    return transition(con, promotion_id, State.PROMOTED, actor=actor, reason=reason, evidence=evidence,
                      guard=_not_stale(promotion_id), dagster_run_id=dagster_run_id, now=now)


def abort_canary(con, promotion_id: str, *, actor: str, reason: str, evidence: Any = None,
                 dagster_run_id: str | None = None, now: datetime | None = None) -> Transition:
    """canary -> rolled_back: the canary regressed; the champion never changed."""
    if current_state(con, promotion_id) not in (State.CANARY, State.ROLLED_BACK):
        raise IllegalTransition(f"promotion {promotion_id} is {current_state(con, promotion_id)}, not in canary")
    return transition(con, promotion_id, State.ROLLED_BACK, actor=actor, reason=reason, evidence=evidence,
                      dagster_run_id=dagster_run_id, now=now)


def rollback(con, *, actor: str, reason: str, promotion_id: str | None = None, dagster_run_id: str | None = None,
             now: datetime | None = None) -> tuple[Transition, dict | None]:
    """Roll the current champion back in one audited step; the champion before it (or the
    baseline: None) serves again. Returns (the rolled_back transition, the restored champion).
    `promotion_id`, when given, must be the current champion (a repeated request for a rollback
    already done is a no-op)."""
    champ = current_champion(con)
    if promotion_id is not None and (champ is None or champ["promotion_id"] != promotion_id):
        if current_state(con, promotion_id) == State.ROLLED_BACK:
            done = next(r for r in history(con, promotion_id) if r["state"] == State.ROLLED_BACK.value)
            return Transition(done, applied=False), current_champion(con)
        raise IllegalTransition(f"promotion {promotion_id} is not the current champion: only the current champion "
                                f"can be rolled back")
    if champ is None:
        raise IllegalTransition("nothing to roll back: no promoted champion")
    pid = champ["promotion_id"]

    def guard(con, past):
        now_champ = current_champion(con)
        if now_champ is None or now_champ["promotion_id"] != pid:
            raise IllegalTransition(f"the champion changed while rolling back {pid}")

    t = transition(con, pid, State.ROLLED_BACK, actor=actor, reason=reason, guard=guard,
                   evidence={"rolled_back": {"policy_id": champ["policy_id"], "checkpoint_version": champ["checkpoint_version"],
                                             "model_version": champ["model_version"]}},
                   dagster_run_id=dagster_run_id, now=now)
    return t, current_champion(con)
