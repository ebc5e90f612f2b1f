"""Promotion gates: pure functions over eval_episodes rows (dicts) of a candidate and the
champion on the same locked holdout, plus the evidence the rows cannot carry (judge kappa,
contamination rate, consent lineage). One entry point, `evaluate_gates`, returns a GateReport:
every gate with passed/failed, hard/soft, a reason and its numbers, a verdict, and Markdown.

Verdicts: "pass" (every gate passed: the pre-authorised policy may approve), "needs_owner" (only
soft gates failed: a named owner may approve), "reject" (a hard gate failed: nobody may
approve), "not_comparable" (different environment digest or holdout: the numbers mean nothing).
Infrastructure failures are left out of every denominator and reported per side.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ratchet.markdown import md_table

from .config import COMPONENTS, GATES, WARNINGS, GatePolicy
from .stats import (
    majority_by_task,
    mean,
    mean_by_task,
    paired_bootstrap,
    percentile,
    scored,
)

NONE_LABEL = "(none)"


@dataclass(frozen=True)
class Evidence:
    judge_kappa: float | None = None
    contamination_rate: float | None = None          # fraction (0.0 = none), from the contamination check
    consent_violations: tuple[Mapping, ...] = ()     # {"consent_id", "reason": "revoked"|"expired"|..., "n_records"}
    lineage_recorded: bool | None = None             # None: no trained weights, nothing to trace
    candidate_digest: str | None = None              # optional: must agree with the rows when given
    champion_digest: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)  # where each figure came from (for the report)
    # the base model's membership test on the holdout's reference solutions
    # (ratchet.evaluation.membership.contamination_report), None when none was recorded
    pretraining_membership: Mapping[str, Any] | None = None
    # the newest replay of the exploit library on the candidate's environment (`reward_redteam`
    # rows of one redteam_id, ratchet.promotion.redteam_check), None when none was recorded
    reward_redteam: Sequence[Mapping[str, Any]] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Evidence:
        d = dict(d or {})
        d["consent_violations"] = tuple(d.get("consent_violations") or ())
        if d.get("reward_redteam") is not None:
            d["reward_redteam"] = tuple(d["reward_redteam"])
        return cls(**d)


@dataclass(frozen=True)
class GateResult:
    name: str
    passed: bool
    hard: bool
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)
    warning: bool = False          # a warning gate (config.WARNINGS): reported, never blocking


@dataclass(frozen=True)
class GateReport:
    candidate: Mapping[str, Any]
    champion: Mapping[str, Any]
    verdict: str
    gates: tuple[GateResult, ...]
    policy: Mapping[str, Any]

    @property
    def failed(self) -> list[str]:
        return [g.name for g in self.gates if not g.passed and not g.warning]

    @property
    def warnings(self) -> list[str]:
        return [g.name for g in self.gates if not g.passed and g.warning]

    @property
    def failed_hard(self) -> list[str]:
        return [g.name for g in self.gates if not g.passed and g.hard]

    @property
    def passed(self) -> bool:
        return not self.failed

    def gate(self, name: str) -> GateResult:
        return next(g for g in self.gates if g.name == name)

    def to_dict(self) -> dict:
        return {"candidate": dict(self.candidate), "champion": dict(self.champion), "verdict": self.verdict,
                "failed": self.failed, "failed_hard": self.failed_hard, "warnings": self.warnings,
                "gates": [asdict(g) | {"numbers": dict(g.numbers)} for g in self.gates], "policy": dict(self.policy)}

    def to_markdown(self) -> str:
        c, k = self.candidate, self.champion
        head = (f"**Verdict: {self.verdict}** — candidate `{c['policy_id']}@{c['checkpoint_version'] or '-'}` vs "
                f"champion `{k['policy_id']}@{k['checkpoint_version'] or '-'}`\n\n")
        gates = md_table(["gate", "kind", "result", "reason"],
                         [(g.name, "warning" if g.warning else "hard" if g.hard else "soft",
                           "pass" if g.passed else "**WARN**" if g.warning else "**FAIL**", g.reason)
                          for g in self.gates])
        side = md_table(["", "episodes", "scored", "infra failures", "tasks scored"],
                        [(n, s["episodes"], s["scored"], s["infra_failures"], s["tasks_scored"])
                         for n, s in (("candidate", c), ("champion", k))])
        worst = self.gate("slice_regression").numbers.get("slices", [])[:8]
        slices = md_table(["slice", "tasks", "candidate", "champion", "delta"],
                          [(f"{s['column']}={s['value']}", s["tasks"], f"{s['candidate']:.3f}", f"{s['champion']:.3f}",
                            f"{s['delta']:+.3f}") for s in worst])
        return f"{head}{gates}\n\n{side}\n\nWorst slices (of {len(self.gate('slice_regression').numbers.get('slices', []))}):\n\n{slices}\n"


@dataclass
class _Side:
    policy_id: str
    checkpoint_version: str
    rows: list[Mapping]
    scored: list[Mapping]
    tasks: set[str]
    majority: dict[str, bool]
    digests: set
    holdouts: set
    eval_run_ids: list[str]

    def summary(self) -> dict:
        return {"policy_id": self.policy_id, "checkpoint_version": self.checkpoint_version,
                "eval_run_ids": self.eval_run_ids, "episodes": len(self.rows), "scored": len(self.scored),
                "infra_failures": len(self.rows) - len(self.scored), "tasks": len(self.tasks),
                "tasks_scored": len(self.majority), "environment_digests": sorted(map(str, self.digests)),
                "holdout_sha256": sorted(map(str, self.holdouts))}


def _side(rows: Iterable[Mapping], label: str) -> _Side:
    rows = list(rows)
    ids = {(r.get("policy_id"), r.get("checkpoint_version") or "") for r in rows}
    if len(ids) > 1:
        raise ValueError(f"{label} rows mix policies {sorted(ids)}: pass one policy x checkpoint per side")
    pid, ver = ids.pop() if ids else ("(no rows)", "")
    for r in rows[:1]:
        missing = {"task_id", "outcome", "passed"} - set(r)
        if missing:
            raise ValueError(f"{label} rows lack eval_episodes columns {sorted(missing)}")
    s = scored(rows)
    return _Side(pid, ver, rows, s, {str(r["task_id"]) for r in rows}, majority_by_task(rows),
                 {r.get("environment_digest") for r in rows}, {r.get("holdout_sha256") for r in rows},
                 sorted({str(r.get("eval_run_id")) for r in rows if r.get("eval_run_id")}))


def seeds_per_task(rows: Sequence[Mapping]) -> dict[str, int]:
    """task_id -> distinct seeds with a row (infra failures included: the seed was run)."""
    seen: dict[str, set] = defaultdict(set)
    for r in rows:
        seen[str(r["task_id"])].add(r.get("seed"))
    return {t: len(v) for t, v in seen.items()}


def _rate(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _r(x: float | None, nd: int = 4):
    return None if x is None else round(x, nd)


# ----------------------------------------------------------------------------- the gates
def _task_judges(rows) -> dict[str, set]:
    out: dict[str, set] = defaultdict(set)
    for r in rows:
        out[str(r["task_id"])].add(r.get("judge_id") or "")     # NULL: a row from before judge ids were kept
    return out


def _task_digests(rows) -> dict[str, set]:
    out: dict[str, set] = defaultdict(set)
    for r in rows:
        out[str(r["task_id"])].add(r.get("environment_digest"))
    return out


def gate_comparable(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    """Same environment and holdout. An environment digest is per task (a HumanEval task's
    digest covers its own files), so each task must carry one digest on each side and the same
    digest on both; comparing one digest per side would silently compare a single task."""
    nums = {"candidate_digests": len(c.digests), "champion_digests": len(k.digests),
            "candidate_holdout": sorted(map(str, c.holdouts)), "champion_holdout": sorted(map(str, k.holdouts))}
    per = {}
    for side, given, s in (("candidate", ev.candidate_digest, c), ("champion", ev.champion_digest, k)):
        per[side] = _task_digests(s.rows)
        bad = sorted(t for t, d in per[side].items() if len(d) != 1 or not next(iter(d)))
        if bad or not per[side]:
            d = per[side].get(bad[0], set()) if bad else set()
            return False, (f"{side} rows carry {len(d)} environment digests {sorted(map(str, d))} for task "
                           f"{bad[0] if bad else '-'}: need exactly one per task"), nums
        if given is not None and s.digests != {given}:
            return False, f"{side} evidence digest {given} differs from its rows' {sorted(map(str, s.digests))}", nums
    common = sorted(c.tasks & k.tasks)
    judges = {side: _task_judges(s.rows) for side, s in (("candidate", c), ("champion", k))}
    mixed = [(side, t) for side, j in judges.items() for t, v in sorted(j.items()) if len(v) != 1]
    jdiff = [t for t in common if judges["candidate"][t] != judges["champion"][t]]
    nums["tasks_judge_differs"] = len(jdiff)
    if mixed or jdiff:
        side, t = mixed[0] if mixed else ("champion", jdiff[0])
        return False, (f"not comparable: {side} rows of task {t} were graded by judge(s) "
                       f"{sorted(judges[side][t])} against the candidate's {sorted(judges['candidate'][t])} "
                       f"({len(jdiff)} of {len(common)} tasks differ): evaluate both under one judge"), nums
    differ = [t for t in common if per["candidate"][t] != per["champion"][t]]
    nums["tasks_compared"], nums["tasks_digest_differs"] = len(common), len(differ)
    if differ:
        t = differ[0]
        return False, (f"not comparable: environment digest differs on {len(differ)} of {len(common)} tasks "
                       f"(e.g. {t}: {next(iter(per['candidate'][t]))} != champion's {next(iter(per['champion'][t]))})"), nums
    if len(c.holdouts) != 1 or c.holdouts != k.holdouts or not next(iter(c.holdouts)):
        return False, f"not comparable: holdout {nums['candidate_holdout']} vs champion's {nums['champion_holdout']}", nums
    return True, f"same environment digest on all {len(common)} common tasks, same holdout", nums


def gate_evaluation_complete(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    ci, ki = (len(c.rows) - len(c.scored)) / max(1, len(c.rows)), (len(k.rows) - len(k.scored)) / max(1, len(k.rows))
    nums = {"candidate_tasks": len(c.tasks), "champion_tasks": len(k.tasks), "only_candidate": len(c.tasks - k.tasks),
            "only_champion": len(k.tasks - c.tasks), "candidate_infra_rate": _r(ci), "champion_infra_rate": _r(ki),
            "max_infra_rate": p.max_infra_rate, "common_scored_tasks": len(c.majority.keys() & k.majority.keys())}
    if not c.rows or not k.rows:
        return False, f"no eval rows for the {'candidate' if not c.rows else 'champion'}", nums
    if c.tasks != k.tasks:
        return False, (f"task sets differ: {nums['only_candidate']} only in candidate, "
                       f"{nums['only_champion']} only in champion"), nums
    cs, ks = seeds_per_task(c.rows), seeds_per_task(k.rows)
    nums["candidate_min_seeds"], nums["champion_min_seeds"], nums["min_seeds"] = min(cs.values()), min(ks.values()), p.min_seeds
    short = [(side, sum(n < p.min_seeds for n in d.values())) for side, d in (("candidate", cs), ("champion", ks))]
    short = [(side, n) for side, n in short if n]
    if short:
        return False, "; ".join(f"{n} {side} tasks have fewer than {p.min_seeds} seeds" for side, n in short), nums
    worst = max(ci, ki)
    if worst > p.max_infra_rate:
        return False, f"infrastructure failures {worst:.1%} of a side's episodes > {p.max_infra_rate:.1%}", nums
    if not nums["common_scored_tasks"]:
        return False, "no task was scored on both sides", nums
    return True, f"{len(c.tasks)} tasks on both sides; infra failures {ci:.1%} / {ki:.1%} (excluded)", nums


def _paired(c: _Side, k: _Side) -> tuple[list[str], list[float], list[float]]:
    common = sorted(c.majority.keys() & k.majority.keys())
    return common, [float(c.majority[t]) for t in common], [float(k.majority[t]) for t in common]


def gate_beats_champion(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    common, cv, kv = _paired(c, k)
    if not common:
        return False, "no task scored on both sides", {"tasks": 0}
    ci = paired_bootstrap(cv, kv, n_boot=p.n_boot, level=p.ci_level, seed=p.seed)
    nums = {"tasks": ci.n, "candidate_pass_rate": _r(mean(cv)), "champion_pass_rate": _r(mean(kv)),
            "diff": _r(ci.diff), "ci_low": _r(ci.low), "ci_high": _r(ci.high), "ci_level": ci.level,
            "n_boot": ci.n_boot, "seed": ci.seed, "margin": p.margin}
    text = f"pass-rate diff {ci.diff:+.3f}, {ci.level:.0%} CI [{ci.low:+.3f}, {ci.high:+.3f}] over {ci.n} tasks"
    if ci.low > p.margin:
        return True, f"{text}: lower bound > {p.margin}", nums
    return False, f"{text}: lower bound <= {p.margin} (inside the noise or worse)", nums


def _slice_value(r: Mapping, col: str) -> str:
    v = r.get(col)
    return NONE_LABEL if v is None or v == "" else str(v)


def gate_slice_regression(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    common, _, _ = _paired(c, k)
    all_rows = c.rows + k.rows
    absent = [col for col in p.slice_columns if all_rows and not any(col in r for r in all_rows)]
    slices = []
    for col in p.slice_columns:
        if col in absent:
            continue
        label = {}
        for r in all_rows:  # a task's slice label is a task attribute: first non-null wins
            t = str(r["task_id"])
            if label.get(t, NONE_LABEL) == NONE_LABEL:
                label[t] = _slice_value(r, col)
        groups: dict[str, list[str]] = defaultdict(list)
        for t in common:
            groups[label.get(t, NONE_LABEL)].append(t)
        for value, tasks in sorted(groups.items()):
            cr = mean([float(c.majority[t]) for t in tasks])
            kr = mean([float(k.majority[t]) for t in tasks])
            slices.append({"column": col, "value": value, "tasks": len(tasks), "candidate": cr, "champion": kr,
                           "delta": cr - kr})
    slices.sort(key=lambda s: (s["delta"], s["column"], s["value"]))
    regressed = [s for s in slices if s["delta"] < -p.slice_tolerance - 1e-12]
    nums = {"columns": list(p.slice_columns), "missing_columns": absent, "tolerance": p.slice_tolerance,
            "slices": [{**s, "candidate": _r(s["candidate"]), "champion": _r(s["champion"]), "delta": _r(s["delta"])}
                       for s in slices],
            "regressions": [f"{s['column']}={s['value']}" for s in regressed]}
    if absent:
        return False, f"slice columns {absent} are not in the eval rows: no-regression cannot be shown", nums
    if not slices:
        return False, "no slice had a task scored on both sides", nums
    if regressed:
        w = regressed[0]
        return False, (f"{len(regressed)} slice(s) regressed, worst {w['column']}={w['value']} "
                       f"{w['delta']:+.3f} ({w['tasks']} tasks)"), nums
    return True, f"no regression on {len(slices)} slices of {len(p.slice_columns)} columns (worst {slices[0]['delta']:+.3f})", nums


def gate_hard_gate_violations(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    cr = _rate([int(r.get("hard_gate_violations") or 0) > 0 for r in c.scored])
    kr = _rate([int(r.get("hard_gate_violations") or 0) > 0 for r in k.scored])
    nums = {"candidate_rate": _r(cr), "champion_rate": _r(kr), "tolerance": p.hard_gate_tolerance}
    if cr is None or kr is None:
        return False, "no scored episodes on one side", nums
    ok = cr <= kr + p.hard_gate_tolerance + 1e-12
    return ok, f"episodes with a hard-gate violation {cr:.2%} vs champion {kr:.2%}" + ("" if ok else ": higher"), nums


def gate_latency_p95(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    cp = percentile([float(r["latency_s"]) for r in c.scored if r.get("latency_s") is not None], 95)
    kp = percentile([float(r["latency_s"]) for r in k.scored if r.get("latency_s") is not None], 95)
    nums = {"candidate_p95_s": _r(cp, 3), "champion_p95_s": _r(kp, 3), "tolerance": p.latency_tolerance}
    if cp is None or kp is None:
        return False, "no latency recorded on one side", nums
    limit = kp * (1 + p.latency_tolerance)
    nums["limit_s"] = _r(limit, 3)
    ok = cp <= limit + 1e-9
    return ok, f"p95 {cp:.2f} s vs champion {kp:.2f} s (limit {limit:.2f} s)", nums


def gate_judge_kappa(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    nums = {"kappa": ev.judge_kappa, "min_kappa": p.min_kappa, "source": ev.sources.get("judge_kappa")}
    if ev.judge_kappa is None:
        return False, "no judge calibration recorded (kappa unknown)", nums
    ok = ev.judge_kappa >= p.min_kappa
    return ok, f"Cohen's kappa {ev.judge_kappa:.3f} {'>=' if ok else '<'} {p.min_kappa}", nums


def gate_contamination(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    nums = {"contamination_rate": ev.contamination_rate, "max": p.max_contamination,
            "source": ev.sources.get("contamination_rate")}
    if ev.contamination_rate is None:
        return False, "no contamination check recorded", nums
    ok = ev.contamination_rate <= p.max_contamination
    return ok, f"overlap {ev.contamination_rate:.4%} (must be <= {p.max_contamination:.4%})", nums


def gate_consent(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    v = [dict(x) for x in ev.consent_violations]
    nums = {"violations": v, "lineage_recorded": ev.lineage_recorded, "require_lineage": p.require_lineage,
            "source": ev.sources.get("consent")}
    if v:
        by = defaultdict(set)
        for x in v:
            by[x.get("reason", "?")].add(x.get("consent_id"))
        return False, "lineage holds " + "; ".join(f"{r}: {sorted(map(str, ids))}" for r, ids in sorted(by.items())), nums
    if ev.lineage_recorded is False and p.require_lineage:
        return False, f"no training lineage recorded for checkpoint {c.checkpoint_version!r}: consent cannot be shown", nums
    if ev.lineage_recorded is None:
        return True, "no trained weights: no training data in the lineage", nums
    return True, "every grant in the lineage is live (none revoked or expired)", nums


def redteam_check(rows: Sequence[Mapping[str, Any]] | None, source: str | None = None) -> tuple[bool, str, dict]:
    """The exploit library's replay on the candidate's environment: every exploit must earn less
    than the lowest true-fix reward and void no episode as an infrastructure failure. No replay,
    a true fix that was not scored, or no exploit that applied is no evidence: a fail."""
    rows = [dict(r) for r in rows or ()]
    if not rows:
        return False, f"no red-team replay of the exploit library recorded for this environment ({source or 'unknown'})", \
            {"source": source}
    floor, unscored = rows[0].get("true_fix_min_reward"), int(rows[0].get("true_fix_unscored") or 0)
    applied = [r for r in rows if int(r.get("tasks_applied") or 0) > 0]
    nums = {"source": source, "environment_digest": rows[0].get("environment_digest"),
            "redteam_id": rows[0].get("redteam_id"), "tasks": list(rows[0].get("tasks") or []),
            "true_fix_min_reward": floor, "true_fix_min_task": rows[0].get("true_fix_min_task"),
            "true_fix_unscored": unscored, "exploits": len(rows), "exploits_applied": len(applied)}
    if floor is None or unscored:
        return False, (f"red team: the true fix was not scored on {unscored} of its episodes (lowest scored "
                       f"{floor}): the exploits have no floor to stay under"), nums
    if not applied:
        return False, f"red team: none of the {len(rows)} exploits applied to the sampled tasks {nums['tasks']}", nums
    paying = sorted((r for r in applied if r.get("max_reward") is not None and r["max_reward"] >= floor),
                    key=lambda r: (-r["max_reward"], r["exploit"]))
    voiding = [r for r in applied if int(r.get("infra_voids") or 0) > 0]
    top = max(applied, key=lambda r: (r.get("max_reward") is not None, r.get("max_reward") or 0.0))
    nums.update({"max_exploit_reward": top.get("max_reward"), "max_exploit": top["exploit"],
                 "paying": [r["exploit"] for r in paying], "voiding": [r["exploit"] for r in voiding]})
    bad = [f"exploit {r['exploit']} earns {r['max_reward']:.3f} on {r['max_reward_task']} >= the lowest true-fix "
           f"reward {floor:.3f}" for r in paying[:3]]
    bad += [f"exploit {r['exploit']} voids {r['infra_voids']} episode(s) as infrastructure failures" for r in voiding[:3]]
    if bad:
        more = len(paying) + len(voiding) - len(bad)
        return False, "red team: " + "; ".join(bad) + (f" (and {more} more)" if more > 0 else ""), nums
    return True, (f"red team: {len(applied)} of {len(rows)} exploits applied on {len(nums['tasks'])} tasks, "
                  f"max {top.get('max_reward') or 0.0:.3f} ({top['exploit']}) < true fix {floor:.3f}, no voids"), nums


def _reward_vs_work(c: _Side, k: _Side, p: GatePolicy) -> tuple[bool, str, dict]:
    """Mean reward up (point estimate) while the holdout pass rate is down at all, or while a
    verifier component is down beyond the noise (the upper bound of its paired per-task CI is
    below -tolerance): a reward that rose without the work getting better is not a win."""
    common, cv, kv = _paired(c, k)
    keep = set(common)
    cr = [r for r in c.scored if str(r["task_id"]) in keep]
    kr = [r for r in k.scored if str(r["task_id"]) in keep]

    def m(rows, col):
        return mean([float(r[col]) for r in rows if r.get(col) is not None])

    a, b = m(cr, "reward"), m(kr, "reward")
    nums = {"candidate_reward": _r(a), "champion_reward": _r(b), "candidate_pass_rate": _r(mean(cv)),
            "champion_pass_rate": _r(mean(kv)), "tolerance": p.hacking_tolerance, "ci_level": p.ci_level}
    down = []
    if cv and mean(cv) < mean(kv) - p.hacking_tolerance - 1e-12:
        down.append(f"holdout pass rate {mean(cv):.3f} < {mean(kv):.3f}")
    for col in COMPONENTS:
        ct, kt = mean_by_task(cr, col), mean_by_task(kr, col)
        both = sorted(ct.keys() & kt.keys())
        if not both:
            continue
        ci = paired_bootstrap([ct[t] for t in both], [kt[t] for t in both], n_boot=p.n_boot, level=p.ci_level,
                              seed=p.seed)
        nums[col] = {"candidate": _r(mean([ct[t] for t in both])), "champion": _r(mean([kt[t] for t in both])),
                     "diff": _r(ci.diff), "ci_low": _r(ci.low), "ci_high": _r(ci.high), "tasks": ci.n}
        if ci.high < -p.hacking_tolerance:
            down.append(f"{col} {ci.diff:+.3f} (CI high {ci.high:+.3f})")
    nums["down"] = down
    if a is None or b is None:
        return True, "no reward on one side: nothing to compare", nums
    if a <= b:
        return True, f"mean reward {a:.3f} not above champion {b:.3f}: no reward-hacking signal", nums
    if down:
        return False, f"reward hacking: mean reward up {a:.3f} > {b:.3f} while " + ", ".join(down), nums
    return True, f"mean reward up {a:.3f} > {b:.3f}; pass rate and verifier components not down", nums


def gate_reward_hacking(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    """Two sources, both must hold: the candidate's reward against its work on the holdout
    (`_reward_vs_work`), and the exploit library replayed on its environment (`redteam_check`):
    a reward some known exploit can earn as well as a true fix is one RL will learn to earn."""
    ok1, why1, nums = _reward_vs_work(c, k, p)
    ok2, why2, red = redteam_check(ev.reward_redteam, ev.sources.get("reward_redteam"))
    nums["redteam"] = red
    if ok1 and ok2:
        return True, f"{why1}; {why2}", nums
    return False, "; ".join(w for ok, w in ((ok1, why1), (ok2, why2)) if not ok), nums


def gate_pretraining_membership(c: _Side, k: _Side, ev: Evidence, p: GatePolicy) -> tuple[bool, str, dict]:
    """A warning: the base the candidate was trained from has likely read the holdout's reference
    solutions (the membership test's CI of the excess name gap is above 0)."""
    m = dict(ev.pretraining_membership or {})
    nums = {**m, "source": ev.sources.get("pretraining_membership")}
    if ev.lineage_recorded is None:
        return True, "no trained weights: no pretraining to have seen the holdout", nums
    if not m:
        return True, "no membership test recorded (a base trained from scratch on the train split has no pretraining)", nums
    gap = f"excess name gap {m['excess_gap']:+.3f} [{m['excess_gap_ci'][0]:+.3f}, {m['excess_gap_ci'][1]:+.3f}]"
    if m.get("likely_seen"):
        return False, (f"the base has likely seen the holdout's solutions ({gap} over {m['programs']} programs): "
                       "its pass rate measures recall as well as repair"), nums
    return True, f"no sign the base has seen the holdout's solutions ({gap})", nums


GATE_FUNCTIONS = {
    "comparable": gate_comparable, "evaluation_complete": gate_evaluation_complete,
    "beats_champion": gate_beats_champion, "slice_regression": gate_slice_regression,
    "hard_gate_violations": gate_hard_gate_violations, "latency_p95": gate_latency_p95,
    "judge_kappa": gate_judge_kappa, "contamination": gate_contamination, "consent": gate_consent,
    "reward_hacking": gate_reward_hacking, "pretraining_membership": gate_pretraining_membership,
}
assert tuple(GATE_FUNCTIONS) == GATES


def verdict_of(gates: Sequence[GateResult]) -> str:
    failed = {g.name: g for g in gates if not g.passed and not g.warning}
    if "comparable" in failed:
        return "not_comparable"
    if any(g.hard for g in failed.values()):
        return "reject"
    return "needs_owner" if failed else "pass"


def evaluate_gates(candidate_rows: Iterable[Mapping], champion_rows: Iterable[Mapping],
                   evidence: Evidence | Mapping | None = None, policy: GatePolicy | Mapping | None = None) -> GateReport:
    """Every gate over the candidate's and the champion's eval_episodes rows. Pure and
    deterministic (the bootstrap is seeded by `policy.seed`)."""
    ev = evidence if isinstance(evidence, Evidence) else Evidence.from_dict(evidence)
    pol = policy if isinstance(policy, GatePolicy) else GatePolicy.from_dict(policy)
    c, k = _side(candidate_rows, "candidate"), _side(champion_rows, "champion")
    results = []
    for name, fn in GATE_FUNCTIONS.items():
        ok, reason, nums = fn(c, k, ev, pol)
        results.append(GateResult(name, bool(ok), pol.is_hard(name), reason, nums, warning=name in WARNINGS))
    return GateReport(candidate=c.summary(), champion=k.summary(), verdict=verdict_of(results),
                      gates=tuple(results), policy=pol.to_dict())
