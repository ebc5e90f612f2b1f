"""Landing-folder log generator: run the reference agents in the real sandbox and write what a
production harness log looks like, in the native trajectory contract (JSONL).

    python -m sandboxes.generate --out .ratchet/landing/agent-logs --tasks 100 --seed 0

Writes `OUT/<tenant>/<YYYY-MM-DD>.jsonl` (one file per tenant and day) and the consent registry
(`consent_registry.yaml` in OUT's parent, or `--registry`). Mixed in, as real logs have them:
  - tenants acme / globex / initech; consent per record: valid, expired (data older than the
    90-day retention), revoked grant, missing consent_id, unknown consent_id;
  - re-logged near-duplicates: the same task re-run later, an exact duplicate line, a copy whose
    content differs only in whitespace (same trajectory_id);
  - malformed lines: truncated JSON, a tool result without a matching call, wrong field types;
  - approval checkpoints (initech approves every write; every tenant approves the submit);
  - agents: the structured production agent (STRUCTURED_SHARE), the scripted expert, the noisy one;
  - outcome: tests_passed = R_tests, accepted = reward status "scored" and tests passed,
    human_edited seeded; usage: whitespace token counts, cost, measured latency.
Cost = prompt tokens x PRICE_PROMPT + completion tokens x PRICE_COMPLETION + sandbox time billed
per started second x PRICE_SANDBOX_S. Token counts: whitespace-separated tokens of every message
(prompt tokens = the context re-sent on each assistant turn, as an API bills it).
Deterministic for a seed except measured times (latency, ended_at, tool durations, and the
sandbox-seconds part of cost when a run crosses a billing second).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

PRICE_PROMPT = 3.0e-6          # USD per prompt token ($3 / 1M)
PRICE_COMPLETION = 15.0e-6     # USD per completion token ($15 / 1M)
PRICE_SANDBOX_S = 1.0e-4       # USD per started sandbox second ($0.36 / hour)
TENANTS = ("acme", "globex", "initech")
# Tenants differ in volume, as customers do: the largest one gets enough consented, accepted
# train-split trajectories for a demo candidate's SFT (measured at 240 tasks: 18 from the
# structured agent, against 11 with an even split of 120 tasks; pipelines/demo.py sizes the demo).
TENANT_MIX = (0.3, 0.5, 0.2)
CONSENT_MIX = (("valid", 0.70), ("expired", 0.08), ("revoked", 0.08), ("missing", 0.07), ("unknown", 0.07))
DEFAULT_AS_OF = "2026-11-28"
RETENTION_DAYS = 90
GENERATOR = "ratchet-loggen/1"
# Share of jobs run by the structured production agent (agent@v7-structured: localize ->
# propose_edits -> apply_edit -> run_tests -> submit, sandboxes.agents.prior): the trajectories the
# embedded policy's structured tool subset can imitate. The rest: expert / noisy by expert_share.
STRUCTURED_SHARE = 0.6
STRUCTURED_K = 6               # its attempt budget: more accepted trajectories per job


def count_tokens(text: str | None) -> int:
    return len(text.split()) if text else 0


def message_tokens(m: dict) -> int:
    n = count_tokens(m.get("content"))
    for c in m.get("tool_calls") or ():
        n += 1 + count_tokens(c["function"]["arguments"])
    return n


def usage(messages: list[dict], sandbox_s: float) -> tuple[int, int, float]:
    prompt = completion = context = 0
    for m in messages:
        t = message_tokens(m)
        if m["role"] == "assistant":
            prompt += context
            completion += t
        context += t
    cost = prompt * PRICE_PROMPT + completion * PRICE_COMPLETION + math.ceil(sandbox_s) * PRICE_SANDBOX_S
    return prompt, completion, round(cost, 6)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def grant_table(as_of: datetime) -> dict[tuple[str, str], dict]:
    """(tenant, kind) -> registry row. `expired` is a grant whose data is past retention."""
    rows = {}
    for t in TENANTS:
        T = t.upper()
        for kind, month, revoked in (("valid", "09", None), ("expired", "05", None),
                                     ("revoked", "08", _iso(as_of - timedelta(days=5)))):
            rows[(t, kind)] = {"consent_id": f"CONSENT-{T}-TRN-2026-{month}", "tenant_id": t,
                               "scopes": ["execute", "train", "eval"], "retention_days": RETENTION_DAYS,
                               "granted_at": f"2026-{month}-01T00:00:00Z", "revoked_at": revoked}
    return rows


@dataclass
class Job:
    index: int
    task_id: str
    agent: str
    tenant: str
    consent: str            # valid | expired | revoked | missing | unknown
    started_at: datetime
    seed: int
    rerun_of: int | None = None


def _agent(x: float, structured_share: float, expert_share: float) -> str:
    if x < structured_share:
        return "structured"
    return "expert" if x < structured_share + (1 - structured_share) * expert_share else "noisy"


def plan(task_ids: list[str], seed: int, as_of: datetime, expert_share: float = 0.6,
         structured_share: float = STRUCTURED_SHARE) -> list[Job]:
    rng = random.Random(f"plan:{seed}")
    kinds, weights = zip(*CONSENT_MIX)
    jobs = []
    # Every consent case and tenant appears at least once, then the mix decides.
    consents = list(kinds) + rng.choices(kinds, weights, k=max(0, len(task_ids) - len(kinds)))
    tenants = list(TENANTS) + rng.choices(TENANTS, TENANT_MIX, k=max(0, len(task_ids) - len(TENANTS)))
    rng.shuffle(consents)
    rng.shuffle(tenants)
    for i, tid in enumerate(task_ids):
        consent = consents[i]
        days = rng.randint(100, 130) if consent == "expired" else rng.randint(6, 13) if consent == "revoked" \
            else rng.randint(0, 13)
        start = as_of - timedelta(days=days) + timedelta(seconds=rng.randint(8 * 3600, 19 * 3600))
        jobs.append(Job(i, tid, _agent(rng.random(), structured_share, expert_share), tenants[i],
                        consent, start, seed * 100_003 + i))
    for k, src in enumerate(rng.sample(jobs, max(1, len(jobs) // 20))):   # the same task re-run later
        later = min(src.started_at + timedelta(days=1, minutes=7), as_of + timedelta(hours=23))
        jobs.append(Job(len(task_ids) + k, src.task_id, "expert", src.tenant, src.consent, later,
                        src.seed + 7, rerun_of=src.index))
    return jobs


# --------------------------------------------------------------------------- running (workers)
_RUNTIME = None
_BUNDLES: dict = {}


def _init_worker(bundles: dict, root) -> None:
    global _RUNTIME, _BUNDLES
    from sandboxes.runtime import LocalRuntime
    _BUNDLES, _RUNTIME = bundles, LocalRuntime(root)


def _run_job(job: Job):
    from sandboxes.agents import run_agent
    from sandboxes.agents.prior import Prior

    # The production agent ranks candidates by SBFL order only (an empty prior): a prior fit here
    # would count fix kinds of tasks that governance may later put in validation or holdout.
    kw = {"prior": Prior.from_counts({}), "k": STRUCTURED_K} if job.agent == "structured" else {}
    return job.index, run_agent(job.agent, _BUNDLES[job.task_id], seed=job.seed, runtime=_RUNTIME, **kw)


def run_jobs(jobs: list[Job], bundles: dict, workers: int, root=None) -> dict:
    if workers <= 1:
        _init_worker(bundles, root)
        return dict(map(_run_job, jobs))
    import multiprocessing as mp
    import warnings
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # spawn: a forked pool inherits the caller's threads' locks and signal handlers (pytest, Dagster).
    # ProcessPoolExecutor, not multiprocessing.Pool: a full test run hung with this
    # pool's workers blocked on its task queue's lock after one of them died holding it; the
    # executor raises BrokenProcessPool instead, and the jobs without a result run here.
    out: dict = {}
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                               initargs=(bundles, root))
    try:
        futures = {pool.submit(_run_job, j): j for j in jobs}
        for f in as_completed(futures):
            k, run = f.result()
            out[k] = run
    except BrokenProcessPool as e:
        warnings.warn(f"generate: a worker process died ({e}); running the rest in this process")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    left = [j for j in jobs if j.index not in out]
    if left:
        _init_worker(bundles, root)
        out.update(map(_run_job, left))
    return out


# --------------------------------------------------------------------------- records
def to_record(job: Job, run, bundle, grants: dict, seed: int) -> dict:
    from ratchet.contract import Approval, Message, ToolCall, Trajectory

    rng = random.Random(f"rec:{seed}:{job.index}")
    msgs = [Message(m["role"], m.get("content"), name=m.get("name"), tool_call_id=m.get("tool_call_id"),
                    tool_calls=[ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                                for c in m.get("tool_calls") or ()]) for m in run.messages]
    start = job.started_at
    end = start + timedelta(seconds=run.latency_s)
    reward = run.reward
    accepted = run.accepted
    approvals, t = [], start
    for st in run.steps:
        t += timedelta(seconds=st.duration_s)
        writes = st.tool in ("edit", "apply_edit") and isinstance(st.arguments, dict)
        if writes and job.tenant == "initech":
            bad = any(f in str(st.arguments.get("path", "")) for f in ("test_",))
            approvals.append(Approval(st.index, f"oncall@{job.tenant}.example", "rejected" if bad else "approved",
                                      _iso(t), "edits a test file" if bad else None))
        if st.tool == "submit":
            approvals.append(Approval(st.index, f"lead@{job.tenant}.example", "approved" if accepted else "rejected",
                                      _iso(t), None if accepted else (reward.status if reward else "no reward")))
    consent = None if job.consent == "missing" else \
        f"CONSENT-{job.tenant.upper()}-TRN-2026-13" if job.consent == "unknown" else \
        grants[(job.tenant, job.consent)]["consent_id"]
    prompt, completion, cost = usage(run.messages, run.sandbox_s)
    day = start.strftime("%Y%m%d")
    tid = hashlib.sha256(f"{seed}:{job.index}:{job.task_id}".encode()).hexdigest()[:12]
    return Trajectory(
        trajectory_id=f"{job.tenant}-{day}-{tid}", task_id=bundle.task_id, messages=msgs,
        tenant_id=job.tenant, consent_id=consent, repo=bundle.repo, issue_id=bundle.issue_id,
        agent_id=run.agent_id, started_at=_iso(start), ended_at=_iso(end), tools=run.tools,
        approvals=approvals, patch=run.patch or None, tests_passed=run.tests_passed, accepted=accepted,
        human_edited=bool(accepted and rng.random() < 0.3), prompt_tokens=prompt,
        completion_tokens=completion, cost_usd=cost, latency_s=round(run.latency_s, 3),
        environment_id=bundle.environment_id, environment_digest=bundle.environment_digest,
        extra={"reward": None if reward is None else {"value": reward.value, "status": reward.status,
                                                       "components": reward.components},
               "attempts": run.attempts, "fixed_at": run.fixed_at, "notes": run.notes,
               "rerun_of": job.rerun_of, "tool_durations_s": [round(s.duration_s, 4) for s in run.steps],
               "generator": {"name": GENERATOR, "seed": seed}},
    ).to_record()


def _dumps(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"))


def _whitespace_copy(rec: dict) -> dict:
    """The same trajectory re-logged by a shipper that re-wrapped text: whitespace-only changes."""
    rec = json.loads(json.dumps(rec))
    for m in rec["messages"]:
        if m.get("content"):
            m["content"] = m["content"].replace("\n", " \n") + "\n"
    return rec


def _malformed(kind: str, rec: dict) -> str:
    rec = json.loads(json.dumps(rec))
    if kind == "truncated_json":
        line = _dumps(rec)
        return line[: len(line) // 2]
    if kind == "orphan_tool_result":
        i = next(i for i, m in enumerate(rec["messages"]) if m.get("tool_calls"))
        del rec["messages"][i]               # the call is lost, its result stays
    elif kind == "wrong_type_outcome":
        rec["outcome"]["tests_passed"] = "yes"
    elif kind == "wrong_type_usage":
        rec["usage"]["prompt_tokens"] = str(rec["usage"]["prompt_tokens"])
    return _dumps(rec)


MALFORMED = {"truncated_json": "truncated_json", "orphan_tool_result": "orphan_tool_result",
             "wrong_type_outcome": "wrong_type", "wrong_type_usage": "wrong_type"}


def generate(out, n_tasks: int = 100, seed: int = 0, *, registry=None, as_of: str = DEFAULT_AS_OF,
             workers: int | None = None, suite=None, expert_share: float = 0.6,
             structured_share: float = STRUCTURED_SHARE, sandbox_root=None) -> dict:
    """Run the agents and write the landing folder + consent registry; returns a summary dict."""
    import os

    import yaml

    from sandboxes.humaneval import build_suite

    t0 = time.monotonic()
    out = Path(out)
    as_of_dt = datetime.fromisoformat(as_of).replace(tzinfo=timezone.utc)
    suite = suite or build_suite(seed=0)
    pool = sorted(suite.tasks, key=lambda b: b.task_id)
    tasks = random.Random(f"tasks:{seed}").sample(pool, min(n_tasks, len(pool)))
    bundles = {b.task_id: b for b in tasks}
    jobs = plan([b.task_id for b in tasks], seed, as_of_dt, expert_share, structured_share)
    runs = run_jobs(jobs, bundles, workers or min(2, os.cpu_count() or 1), sandbox_root)
    grants = grant_table(as_of_dt)

    files: dict[str, list[tuple[str, str, dict]]] = {}   # rel path -> [(sort key, line, meta)]
    recs = []
    for job in jobs:
        rec = to_record(job, runs[job.index], bundles[job.task_id], grants, seed)
        rel = f"{job.tenant}/{job.started_at:%Y-%m-%d}.jsonl"
        files.setdefault(rel, []).append((rec["started_at"], _dumps(rec), {}))
        recs.append((rel, rec))
    rng = random.Random(f"defects:{seed}")
    picks = rng.sample(range(len(recs)), min(len(recs), 4 + len(MALFORMED) + len(recs) // 50))
    for k, i in enumerate(picks):
        rel, rec = recs[i]
        if k < 2:      # exact duplicate line, re-logged a little later
            files[rel].append((rec["started_at"] + "~dup", _dumps(rec), {"kind": "exact_duplicate"}))
        elif k < 4:
            files[rel].append((rec["started_at"] + "~ws", _dumps(_whitespace_copy(rec)), {"kind": "whitespace_copy"}))
        else:
            kind = list(MALFORMED)[(k - 4) % len(MALFORMED)]
            files[rel].append((rec["started_at"] + "~bad", _malformed(kind, rec),
                               {"kind": kind, "expected_code": MALFORMED[kind]}))
    defects, n_lines = [], 0
    out.mkdir(parents=True, exist_ok=True)
    for rel, rows in sorted(files.items()):
        rows.sort(key=lambda r: r[0])
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("".join(line + "\n" for _, line, _ in rows))
        n_lines += len(rows)
        defects += [{"file": rel, "line": n, **meta} for n, (_, _, meta) in enumerate(rows, 1) if meta]

    used = {(j.tenant, j.consent) for j in jobs if j.consent in ("valid", "expired", "revoked")}
    reg = Path(registry) if registry else out.resolve().parent / "consent_registry.yaml"
    reg.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted((grants[k] for k in used), key=lambda g: g["consent_id"])
    reg.write_text("# Consent grants referenced by the generated logs (sandboxes.generate).\n"
                   f"# `*-2026-05` grants hold data older than their {RETENTION_DAYS}-day retention "
                   f"as of {as_of}; `*-2026-08` grants are revoked.\n"
                   + yaml.safe_dump({"as_of": as_of, "grants": rows}, sort_keys=False))
    done = [runs[j.index] for j in jobs]
    return {
        "out": str(out), "registry": str(reg), "files": sorted(files), "lines": n_lines,
        "trajectories": len(jobs), "tasks": len(tasks), "reruns": sum(j.rerun_of is not None for j in jobs),
        "by_tenant": _count(j.tenant for j in jobs), "by_agent": _count(r.agent_id for r in done),
        "by_consent": _count(j.consent for j in jobs),
        "tests_passed": sum(bool(r.tests_passed) for r in done), "accepted": sum(r.accepted for r in done),
        "gate_violations": sum(r.reward is not None and r.reward.status == "gate_violation" for r in done),
        "infra_failures": sum(r.reward is not None and r.reward.status == "infra_failure" for r in done),
        "defects": defects, "seconds": round(time.monotonic() - t0, 2),
    }


# The foreign-format logs: the shell agent (bash + str_replace_editor) on a few tasks, written as
# SWE-agent `.traj` and Harbor ATIF files the way those harnesses leave them, with a `_batch.yaml`
# naming the tenant and its valid grant (those formats carry neither). Ingest reads them through
# its adapters. Neither format records whether the run was accepted either, and SFT trains on
# accepted work only: runs whose fix was accepted go to an `accepted/` folder whose sidecar says
# `accepted: true`, the others to `failed/` (`accepted: false`), as a reviewed export would.
FOREIGN_FORMATS = (("swe-agent", ".traj"), ("atif", ".json"))
FOREIGN_TENANT = TENANTS[TENANT_MIX.index(max(TENANT_MIX))]    # the largest tenant: the demo's candidate


def generate_foreign(out, n_tasks: int = 12, seed: int = 0, *, as_of: str = DEFAULT_AS_OF, suite=None,
                     tenant: str = FOREIGN_TENANT, runtime=None) -> dict:
    """Run the shell agent on `n_tasks` suite tasks and write each run in both foreign formats under
    OUT/swe-agent and OUT/atif (half the runs each, so no trajectory is logged twice); returns counts.
    The agent's prior is empty (SBFL order), as the production agent's: a prior fit here would count
    fix kinds of tasks governance may later put in the holdout."""
    from sandboxes.agents import run_agent
    from sandboxes.agents.prior import Prior
    from sandboxes.foreign_logs import atif_traj, swe_agent_traj
    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime

    out = Path(out)
    as_of_dt = datetime.fromisoformat(as_of).replace(tzinfo=timezone.utc)
    suite = suite or build_suite(seed=0)
    pool = sorted(suite.tasks, key=lambda b: b.task_id)
    tasks = random.Random(f"foreign:{seed}").sample(pool, min(n_tasks, len(pool)))
    consent = grant_table(as_of_dt)[(tenant, "valid")]["consent_id"]
    runtime = runtime or LocalRuntime()
    writers = {"swe-agent": lambda run, b, i: swe_agent_traj(run, b),
               "atif": lambda run, b, i: atif_traj(run, b, started=as_of_dt - timedelta(days=1, minutes=-7 * i))}
    counts = {fmt: 0 for fmt, _ in FOREIGN_FORMATS}
    accepted = {fmt: 0 for fmt, _ in FOREIGN_FORMATS}
    for fmt, _ in FOREIGN_FORMATS:
        for verdict in ("accepted", "failed"):
            (out / fmt / verdict).mkdir(parents=True, exist_ok=True)
            # SWE-agent files carry no timestamps (consent would count them expired): the folder says
            # the runs' day, as an export of a day's runs would
            (out / fmt / verdict / "_batch.yaml").write_text(
                f"tenant_id: {tenant}\nconsent_id: {consent}\naccepted: {str(verdict == 'accepted').lower()}\n"
                + (f"ended_at: {as_of_dt.date().isoformat()}\n" if fmt == "swe-agent" else ""))
    for i, b in enumerate(tasks):
        run = run_agent("shell", b, seed=seed * 100_003 + i, prior=Prior.from_counts({}), runtime=runtime)
        fmt, ext = FOREIGN_FORMATS[i % len(FOREIGN_FORMATS)]
        verdict = "accepted" if run.accepted else "failed"
        (out / fmt / verdict / f"{b.task_id.replace('/', '__')}{ext}").write_text(
            json.dumps(writers[fmt](run, b, i), indent=1))
        counts[fmt] += 1
        accepted[fmt] += bool(run.accepted)
    return {"out": str(out), "tenant": tenant, "consent_id": consent, "by_format": counts, "accepted": accepted}


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandboxes.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="landing folder to write (one JSONL per tenant/day)")
    ap.add_argument("--tasks", type=int, default=100, help="suite tasks to run (plus ~5%% re-runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--registry", help="consent registry path (default: OUT/../consent_registry.yaml)")
    ap.add_argument("--as-of", default=DEFAULT_AS_OF, help="the logs' 'today' (YYYY-MM-DD)")
    ap.add_argument("--workers", type=int, default=None, help="parallel episodes (default: min(2, cores))")
    a = ap.parse_args(argv)
    summary = generate(a.out, a.tasks, a.seed, registry=a.registry, as_of=a.as_of, workers=a.workers)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
