"""Reading a promotion's inputs from the warehouse: the candidate's and the champion's
eval_episodes rows, and the evidence the rows cannot carry (judge kappa from
`judge_calibration`, the contamination rate from `contamination_report`, the consent status of
the candidate checkpoint's training lineage from `checkpoints` + `trajectories` +
`consent_grants`, the exploit library's replay on the current environment from `reward_redteam`).
Each reader says where its figure came from; a missing table is "unknown", which the gates treat
as a failure, never as a pass."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from ratchet.evaluation.tables import grading
from ratchet.store import fetch

from .gates import Evidence

BASELINE_PREFIXES = ("harness:", "scripted:")


class MissingEvaluation(LookupError):
    """The evaluation tables or the rows a promotion needs are not there."""


def has_table(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchall()[0][0])


def require_eval_tables(con) -> None:
    if not has_table(con, "eval_episodes"):
        raise MissingEvaluation("table eval_episodes does not exist: materialise holdout_eval (the holdout "
                                "evaluation) before promotion")
    if not con.execute("SELECT count(*) FROM (SELECT 1 FROM eval_episodes LIMIT 1)").fetchall()[0][0]:
        raise MissingEvaluation("table eval_episodes is empty: materialise holdout_eval (the holdout evaluation) "
                                "before promotion")


def latest_candidate(con, exclude: tuple[tuple[str, str], ...] = ()) -> tuple[str, str] | None:
    """The (policy_id, checkpoint_version) evaluated most recently that is a learned policy
    (not a harness or scripted baseline) and not in `exclude` (e.g. the champion)."""
    rows = con.execute("""
        SELECT policy_id, checkpoint_version, max(finished_at) AS last FROM eval_episodes
        GROUP BY 1, 2 ORDER BY last DESC NULLS LAST""").fetchall()
    for pid, ver, _ in rows:
        if not pid.startswith(BASELINE_PREFIXES) and (pid, ver or "") not in exclude:
            return pid, ver or ""
    return None


def eval_rows(con, policy_id: str, checkpoint_version: str, *, eval_run_id: str | None = None,
              environment_digest: str | None = None, holdout_sha256: str | None = None,
              task_digests: Mapping[str, str] | None = None) -> list[dict]:
    """One row per eval_id of a policy x checkpoint under one holdout (the given one, else that of
    its newest episode). Environment digests are per task: `environment_digest` keeps one digest,
    `task_digests` (task -> digest, or -> `grading(row)` = (digest, judge), e.g. the candidate's)
    keeps each task's given digest (and judge), and by default each task keeps the digest and
    judge of its newest episode (an older evaluation of the task under another environment or
    judge is not mixed in). A retried episode keeps its newest row."""
    where, params = ["policy_id = ?", "coalesce(checkpoint_version, '') = ?"], [policy_id, checkpoint_version or ""]
    if eval_run_id:
        where.append("list_contains(string_split(?, ','), eval_run_id)")
        params.append(eval_run_id)
    base = " AND ".join(where)
    if holdout_sha256 is None:
        newest = con.execute(f"SELECT holdout_sha256 FROM eval_episodes WHERE {base} "
                             f"ORDER BY finished_at DESC NULLS LAST LIMIT 1", params).fetchall()
        if not newest:
            return []
        holdout_sha256 = newest[0][0]
    rows = fetch(con, f"""
        SELECT * FROM eval_episodes WHERE {base} AND holdout_sha256 IS NOT DISTINCT FROM ?
        QUALIFY row_number() OVER (PARTITION BY eval_id ORDER BY finished_at DESC NULLS LAST) = 1
        ORDER BY task_id, seed""", params + [holdout_sha256])
    if environment_digest is not None:
        return [r for r in rows if r["environment_digest"] == environment_digest]
    if task_digests is not None:
        return [r for r in rows if _matches(task_digests.get(r["task_id"]), r)]
    newest: dict = {}
    for r in sorted(rows, key=lambda r: (r["finished_at"] is not None, r["finished_at"] or 0)):
        newest[r["task_id"]] = grading(r)
    return [r for r in rows if newest[r["task_id"]] == grading(r)]


def _matches(want, row: Mapping) -> bool:
    # task_digests values: a digest (any judge) or a (digest, judge) pair from `grading`
    return want == (grading(row) if isinstance(want, tuple) else row["environment_digest"])


def incomplete(candidate_rows: list[dict], champion_rows: list[dict], min_seeds: int) -> str | None:
    """Why the evaluation is not finished yet (a side with no rows, or tasks with fewer seeds than
    required), or None. A champion with no rows at all is not "waiting": the gates report it."""
    from .gates import seeds_per_task

    out = []
    for side, rows in (("candidate", candidate_rows), ("champion", champion_rows)):
        if not rows:
            continue
        n = seeds_per_task(rows)
        short = sum(v < min_seeds for v in n.values())
        if short:
            out.append(f"{side}: {short} of {len(n)} tasks have fewer than {min_seeds} seeds (min {min(n.values())})")
    return "; ".join(out) or None


def canary_rows(con, cand: Mapping, champ: Mapping, since: datetime, share: float, seed: int):
    """The canary window: each policy's eval rows on fresh tasks (in no split, not in the holdout)
    started since the canary began, each arm on the tasks routed to it. Returns (candidate rows,
    champion rows, the ids of tasks that are in a split)."""
    from .canary import route

    used: set[str] = set()
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


def _newest(con, table: str, cols: str, order: str) -> tuple[dict | None, str]:
    """The newest row of an evidence table, or (None, why it is unknown)."""
    if not has_table(con, table):
        return None, f"table {table} does not exist"
    r = fetch(con, f"SELECT {cols} FROM {table} ORDER BY {order} DESC NULLS LAST LIMIT 1")
    return (r[0], "") if r else (None, f"{table} is empty")


def judge_kappa(con, judge_ids: Iterable[str] = ()) -> tuple[float | None, str]:
    """The calibration of the judge that graded the candidate: another judge's kappa says nothing
    about these rewards. Several judges: the lowest of their newest kappas (the gate must hold for
    each). No judge named: the newest calibration of any judge."""
    judges = sorted({j for j in judge_ids if j})
    if not judges:
        r, why = _newest(con, "judge_calibration", "kappa, judge_id, items, computed_at", "computed_at")
        if r is None:
            return None, why
        return r["kappa"], f"judge_calibration {r['judge_id']} over {r['items']} items at {r['computed_at']}"
    if not has_table(con, "judge_calibration"):
        return None, "table judge_calibration does not exist"
    newest = []
    for j in judges:
        r = fetch(con, "SELECT kappa, judge_id, items, computed_at FROM judge_calibration WHERE judge_id = ? "
                       "ORDER BY computed_at DESC NULLS LAST LIMIT 1", [j])
        if not r:
            return None, f"judge {j} graded the candidate but judge_calibration has no row for it"
        newest.append(r[0])
    r = min(newest, key=lambda x: (x["kappa"] is not None, x["kappa"] or 0.0))
    return r["kappa"], f"judge_calibration {r['judge_id']} over {r['items']} items at {r['computed_at']}"


def contamination_rate(con) -> tuple[float | None, str]:
    r, why = _newest(con, "contamination_report", "overlap_fraction, n_items, checked_at, passed", "checked_at")
    if r is None:
        return None, why
    return r["overlap_fraction"], f"contamination_report over {r['n_items']} items at {r['checked_at']}"


def pretraining_membership(con) -> tuple[dict | None, str]:
    """The newest membership test of the base on the holdout (`base_membership`), as the report dict."""
    r, why = _newest(con, "base_membership", "*", "checked_at")
    if r is None:
        return None, why
    rep = {k: r[k] for k in ("programs", "control_programs", "min_k", "held_out_gap", "control_gap", "excess_gap",
                             "likely_seen")}
    rep["excess_gap_ci"] = [r["excess_gap_ci_lo"], r["excess_gap_ci_hi"]]
    return rep, f"base_membership of {r['base']} over {r['programs']} programs at {r['checked_at']}"


def reward_redteam(con) -> tuple[list[dict] | None, str]:
    """The newest replay of the exploit library on the environment a promotion is decided in: the
    digest of today's train/val sample, sandbox and verifier code (`redteam_check.plan`). A replay
    of another digest (older code, another suite) says nothing about this reward."""
    from .redteam_check import plan, recorded

    p = plan(con)
    if isinstance(p, str):
        return None, p
    rows = recorded(con, p.digest)
    if not rows:
        return None, f"reward_redteam has no replay for environment {p.digest[:19]}... (tasks {', '.join(p.task_ids)})"
    r = rows[0]
    return rows, (f"reward_redteam {r['redteam_id']} over {len(r['tasks'] or [])} tasks at {r['computed_at']} "
                  f"(environment {p.digest[:19]}...)")


def checkpoint_ids(policy_id: str, checkpoint_version: str) -> list[str]:
    """How a checkpoint may be named in the `checkpoints` registry (trainers register one of these;
    eval policy ids carry the version already, e.g. "embedded:rl@3" with checkpoint_version "3").
    A cycle's candidate "embedded:<registered model>@<version>" is the trainer's "<model>/<version>"."""
    ids = [checkpoint_version, policy_id, f"{policy_id}@{checkpoint_version}"]
    engine, _, rest = policy_id.partition(":")
    if rest and "@" in rest:
        name, _, version = rest.rpartition("@")
        ids.append(f"{name}/{version}")
    return ids


def consent_lineage(con, policy_id: str, checkpoint_version: str, now: datetime,
                    checkpoint_id: str | None = None) -> tuple[list[dict], bool | None, str]:
    """(violations, lineage_recorded, source). No weights (checkpoint_version ""): nothing was
    trained, (no violations, None). Otherwise every trained record is checked as the consent layer
    would check it for the checkpoint's tenant at `now` (revoked, expired, and any other reason a
    record may not train it), plus the registry's sticky revocation flag."""
    from ratchet.governance.consent import decide, grants_from_rows

    if not checkpoint_version and not checkpoint_id:
        return [], None, "no trained weights"
    if not has_table(con, "checkpoints"):
        return [], False, "table checkpoints does not exist"
    ids = [checkpoint_id] if checkpoint_id else checkpoint_ids(policy_id, checkpoint_version)
    ck = fetch(con, "SELECT * FROM checkpoints WHERE list_contains(?, checkpoint_id) ORDER BY created_at DESC LIMIT 1", [ids])
    if not ck:
        return [], False, f"no checkpoints row named {ids}"
    ck = ck[0]
    out: dict[tuple[str, str], dict] = {}
    if ck.get("flagged"):
        out[("(flag)", "revoked")] = {"consent_id": None, "reason": "revoked", "n_records": None,
                                      "detail": ck.get("flag_reason")}
    records = ck.get("trained_record_ids") or []
    grants = grants_from_rows(fetch(con, "SELECT * FROM consent_grants")) if has_table(con, "consent_grants") else {}
    if records:
        trajs = fetch(con, "SELECT record_id, trajectory_id, tenant_id, consent_id, started_at, ended_at "
                           "FROM trajectories WHERE list_contains(?, record_id)", [records])
        missing = len(set(records) - {t["record_id"] for t in trajs})
        if missing:
            out[("(missing)", "unknown_record")] = {"consent_id": None, "reason": "unknown_record",
                                                    "n_records": missing, "detail": "trained records not in trajectories"}
        for t in trajs:
            reason, detail = decide(t, grants, now, ck["tenant_id"])
            if reason is not None:
                v = out.setdefault((str(t.get("consent_id")), reason), {"consent_id": t.get("consent_id"), "reason": reason,
                                                                      "n_records": 0, "detail": detail})
                v["n_records"] += 1
    return list(out.values()), True, f"checkpoints row {ck['checkpoint_id']} ({len(records)} trained records)"


def gather(con, candidate: Mapping, now: datetime, checkpoint_id: str | None = None,
           judge_ids: Iterable[str] = ()) -> Evidence:
    kappa, ksrc = judge_kappa(con, judge_ids)
    rate, csrc = contamination_rate(con)
    violations, recorded, lsrc = consent_lineage(con, candidate["policy_id"], candidate["checkpoint_version"], now,
                                                 checkpoint_id)
    membership, msrc = pretraining_membership(con)
    redteam, rsrc = reward_redteam(con)
    return Evidence(judge_kappa=kappa, contamination_rate=rate, consent_violations=tuple(violations),
                    lineage_recorded=recorded, pretraining_membership=membership,
                    reward_redteam=tuple(redteam) if redteam else None,
                    sources={"judge_kappa": ksrc, "contamination_rate": csrc, "consent": lsrc,
                             "pretraining_membership": msrc, "reward_redteam": rsrc})
