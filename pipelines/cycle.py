"""The recurring improvement run: one cycle per tick, each against the champion
of the day.

    improvement_schedule (weekly by default; RATCHET_HOME/cycle.yaml, RATCHET_CYCLE_CRON)
      adds candidate partition "<tenant>:cycle-<time>" and runs improvement_job [candidate]:
        ingest -> task suite -> dedup -> locked splits -> consent -> judge calibration
        -> base_policy -> sft_checkpoint -> rl_checkpoint
    cycle_sensor, on that run's success: holdout_eval_job for the current champion x seeds
      (finished episodes are skipped, so a champion already evaluated under this environment costs
      nothing); when those succeeded, for the candidate x seeds; then the references x seeds (the
      cycle's SFT checkpoint and the prompted baseline: the scorecard's columns, never promoted;
      cycle.yaml `references`); after those, evaluation_report_job
    promotion_sensor (assets/promotion.py), on the candidate's holdout_eval events: promotion

Every request carries a run key derived from the cycle, so repeated ticks launch nothing twice.
`run_cycle` drives the same requests in-process (the demo, the tests): the schedule's request,
then whatever the cycle sensor and the promotion sensor would request, in order.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import dagster as dg

from assets.evaluation import POLICIES, evaluation_report_job, holdout_eval_job, register_policies
from assets.training import CANDIDATES, train_candidate_job

from .jobs import LIFECYCLE_SELECTION, lifecycle_job

TRAIN_OPS = ("base_policy", "sft_checkpoint", "rl_checkpoint")
CYCLE, STAGE, PHASE, EXPECT = "ratchet/cycle", "ratchet/stage", "ratchet/cycle_phase", "ratchet/cycle_evals"
CANDIDATE, CHAMPION, CHECKPOINT = "ratchet/candidate", "ratchet/champion", "ratchet/checkpoint_id"
ROLE = "ratchet/role"              # "reference": evaluated for the scorecard, never a promotion candidate
RUN_KEY = "ratchet/run_key"        # in-process runs carry their request's run key (the daemon keeps its own)

improvement_job = dg.define_asset_job(
    "improvement_job", selection=LIFECYCLE_SELECTION | dg.AssetSelection.assets(*TRAIN_OPS),
    partitions_def=CANDIDATES, tags={STAGE: "improvement"},
    description="One improvement cycle up to a trained candidate: ingest -> governance -> base_policy -> SFT -> RL.")


def _settings():
    from ratchet.cycle import CycleSettings
    from ratchet.home import get_home

    return CycleSettings.load(get_home().root)


def cycle_start(instance: dg.DagsterInstance, settings, when: datetime, trigger: str) -> dg.RunRequest:
    """The first run of a cycle: improvement_job for a new candidate partition (train_candidate
    when `lifecycle: false`), or lifecycle_job when the candidate is a configured policy id."""
    from ratchet.cycle import candidate_key

    key = candidate_key(settings.tenant, when)
    tags = {CYCLE: key, "ratchet/trigger": trigger, "ratchet/tenant": settings.tenant,
            "ratchet/candidate_source": settings.candidate}
    if settings.trains:
        if not instance.has_dynamic_partition(CANDIDATES.name, key):
            instance.add_dynamic_partitions(CANDIDATES.name, [key])
        job = improvement_job if settings.lifecycle else train_candidate_job
        ops = {k: v for k, v in settings.ops.items() if settings.lifecycle or k in TRAIN_OPS}
        return dg.RunRequest(run_key=f"cycle-{key}", job_name=job.name, partition_key=key,
                             run_config={"ops": ops}, tags=tags)
    ops = {k: v for k, v in settings.ops.items() if k not in TRAIN_OPS}
    return dg.RunRequest(run_key=f"cycle-{key}", job_name=lifecycle_job.name, run_config={"ops": ops}, tags=tags)


def _candidate(home, run: dg.DagsterRun, settings) -> tuple[str, dict, str]:
    """(policy id, engine kwargs, checkpoint id) of the cycle's candidate."""
    from ratchet.cycle import checkpoint_policy_id, read_pointer, register_policy

    if run.tags.get("ratchet/candidate_source", "train") != "train":
        pid = run.tags["ratchet/candidate_source"]
        return pid, {}, ""
    ptr = read_pointer(home.checkpoints, run.tags[CYCLE], "rl")
    pid = checkpoint_policy_id(ptr["model_name"], ptr["version"])
    kw = {**settings.policy_kwargs, "path": ptr["path"]}
    register_policy(home.root, pid, kw)
    return pid, kw, ptr["checkpoint_id"]


def _champion(home) -> str:
    from ratchet.promotion.config import baseline_policy_id
    from ratchet.promotion.state import current_champion
    from ratchet.warehouse import Warehouse

    wh = Warehouse(home.warehouse)
    wh.ensure_schema()
    with wh.connect() as con:
        from ratchet.promotion import tables

        tables.ready(con)
        row = current_champion(con)
    if row:
        return row["policy_id"] + (f"@{row['checkpoint_version']}" if row["checkpoint_version"]
                                   and "@" not in row["policy_id"] else "")
    return baseline_policy_id(home.root)


def _trained(run: dg.DagsterRun) -> bool:
    return run.tags.get("ratchet/candidate_source", "train") == "train"


def _references(home, cycle: str, settings, trained: bool) -> list[tuple[str, dict]]:
    """(policy id, engine kwargs) of a trained cycle's references: its SFT checkpoint and the
    prompted baseline (the base_policy its candidate started from). A configuration-change
    candidate trained nothing and has none."""
    from ratchet.cycle import base_policy_id, checkpoint_dir, checkpoint_policy_id, read_pointer, register_policy

    out = []
    for ref in settings.references if trained else ():
        parts = (cycle, "sft") if ref == "sft" else ("base",)
        if not (checkpoint_dir(home.checkpoints, *parts) / "latest.json").exists():
            continue
        ptr = read_pointer(home.checkpoints, *parts)
        pid = (checkpoint_policy_id(ptr["model_name"], ptr["version"]) if ref == "sft"
               else base_policy_id(ptr["path"]))
        kw = {**settings.policy_kwargs, "path": ptr["path"]}
        register_policy(home.root, pid, kw)
        out.append((pid, kw))
    return out


def _eval_runs(cycle: str, phase: str, pid: str, kw: dict, settings, tags: dict,
               expect: int | None = None) -> list[dg.RunRequest]:
    cfg = {**settings.holdout_eval, "policy_kwargs_json": json.dumps(kw)}
    if settings.eval_task_limit:
        cfg["task_limit"] = settings.eval_task_limit
    return [dg.RunRequest(run_key=f"{cycle}-eval-{pid}-{s}", job_name=holdout_eval_job.name,
                          partition_key=dg.MultiPartitionKey({"policy": pid, "seed": s}),
                          run_config={"ops": {"holdout_eval": {"config": cfg}}},
                          tags={**tags, PHASE: phase, EXPECT: str(expect or len(settings.seeds))})
            for s in settings.seeds]


def eval_requests(instance: dg.DagsterInstance, run: dg.DagsterRun, settings) -> list[dg.RunRequest]:
    """After a cycle's training (or lifecycle) run: the champion on the locked holdout first (every
    configured seed; finished episodes are skipped), then the candidate. The order matters: the
    candidate's eval events trigger the promotion, which must find the champion's rows in place."""
    from ratchet.cycle import policy_kwargs
    from ratchet.home import get_home

    home = get_home()
    cycle = run.tags[CYCLE]
    cand, cand_kw, ckpt = _candidate(home, run, settings)
    champ = _champion(home)
    register_policies(instance, [cand, champ] + [p for p, _ in _references(home, cycle, settings, _trained(run))])
    tags = {CYCLE: cycle, STAGE: "holdout_eval", CANDIDATE: cand, CHECKPOINT: ckpt, CHAMPION: champ,
            "ratchet/trigger": "cycle_sensor", "ratchet/candidate_source": run.tags.get("ratchet/candidate_source", "train")}
    if champ == cand:
        return _eval_runs(cycle, "candidate", cand, cand_kw, settings, tags)
    return _eval_runs(cycle, "champion", champ, policy_kwargs(home.root, champ), settings, tags)


def _phase_done(instance, run: dg.DagsterRun) -> bool:
    done = instance.get_runs_count(dg.RunsFilter(
        tags={CYCLE: run.tags[CYCLE], STAGE: "holdout_eval", PHASE: run.tags[PHASE]},
        statuses=[dg.DagsterRunStatus.SUCCESS]))
    return done >= int(run.tags.get(EXPECT, "0"))


def after_eval(instance: dg.DagsterInstance, run: dg.DagsterRun, settings) -> list[dg.RunRequest]:
    """After a cycle's holdout_eval run: once the champion's phase is complete, the candidate's;
    once the candidate's is complete, the references' (if any); then the reports."""
    from ratchet.cycle import policy_kwargs
    from ratchet.home import get_home

    if not _phase_done(instance, run):
        return []
    cycle, cand = run.tags[CYCLE], run.tags[CANDIDATE]
    tags = {k: v for k, v in run.tags.items() if k.startswith("ratchet/") and k not in (PHASE, EXPECT)}
    if run.tags[PHASE] == "champion":
        return _eval_runs(cycle, "candidate", cand, policy_kwargs(get_home().root, cand), settings, tags)
    if run.tags[PHASE] == "candidate":
        # the references come after the candidate, so the promotion decision never waits for them;
        # one that is the champion or the candidate already has its rows
        refs = [(p, kw) for p, kw in _references(get_home(), cycle, settings, _trained(run))
                if p not in (cand, run.tags.get(CHAMPION))]
        if refs:
            n = len(refs) * len(settings.seeds)
            return [r for p, kw in refs for r in _eval_runs(cycle, "reference", p, kw, settings,
                                                            {**tags, ROLE: "reference"}, expect=n)]
    from ratchet.cycle import registered_checkpoints

    # economics prices each learned policy's training from its checkpoint's measured compute
    eco = {"economics": {"config": {"checkpoints_json": json.dumps(registered_checkpoints(get_home().root))}}}
    return [dg.RunRequest(run_key=f"{cycle}-report", job_name=evaluation_report_job.name, run_config={"ops": eco},
                          tags={CYCLE: cycle, STAGE: "evaluation_report", "ratchet/trigger": "cycle_sensor"})]


def followups(instance: dg.DagsterInstance, run: dg.DagsterRun, settings=None) -> list[dg.RunRequest]:
    """What the cycle sensor requests after `run` succeeded (nothing for runs outside a cycle)."""
    if CYCLE not in run.tags:
        return []
    if run.tags.get(STAGE) == "holdout_eval":
        return after_eval(instance, run, settings or _settings())
    if run.job_name in (improvement_job.name, train_candidate_job.name, lifecycle_job.name):
        return eval_requests(instance, run, settings or _settings())
    return []


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS, name="cycle_sensor", minimum_interval_seconds=30,
    monitored_jobs=[improvement_job, train_candidate_job, lifecycle_job, holdout_eval_job],
    request_jobs=[holdout_eval_job, evaluation_report_job], default_status=dg.DefaultSensorStatus.RUNNING,
    description="Moves an improvement cycle on: after its training run, evaluates the candidate and the "
                "champion on the locked holdout; after the last of those, the reports. Runs outside a "
                "cycle (no ratchet/cycle tag) request nothing.")
def cycle_sensor(context: dg.RunStatusSensorContext):
    reqs = followups(context.instance, context.dagster_run)
    return reqs or dg.SkipReason(f"run {context.dagster_run.run_id[:8]} needs no cycle follow-up")


def _cron() -> str:
    try:
        return _settings().cron
    except Exception:  # a broken cycle.yaml must not break the code location: the tick reports it
        from ratchet.cycle import DEFAULT_CRON
        return DEFAULT_CRON


@dg.schedule(cron_schedule=_cron(), job=improvement_job, name="improvement_schedule",
             execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.RUNNING,
             description="The recurring improvement run (weekly by default; cron in RATCHET_HOME/cycle.yaml or "
                         "RATCHET_CYCLE_CRON): a new candidate partition, ingest -> governance -> SFT -> RL; "
                         "cycle_sensor and promotion_sensor take it from there.")
def improvement_schedule(context: dg.ScheduleEvaluationContext):
    when = context.scheduled_execution_time or datetime.now(timezone.utc)
    return cycle_start(context.instance, _settings(), when, trigger="improvement_schedule")


def run_cycle(instance: dg.DagsterInstance, defs: dg.Definitions, *, when: datetime | None = None,
              settings=None, log=print, run_config: dict | None = None) -> dict:
    """One cycle in-process, through the schedule's own request and the sensors' own follow-ups.
    Like the daemon, a request whose run key already has a successful run is not launched again,
    so a re-run (or a killed demo) resumes the cycle instead of training a second candidate.
    `run_config` is merged into every run's (the demo's console logger level).
    Returns {"candidate", "runs": [(job, ok)], "promotion": the promotion's metadata, "ok"}."""
    from assets.promotion import promotion_job, promotion_sensor

    given, settings = settings, settings or _settings()
    when = when or datetime.now(timezone.utc)
    # Without explicit settings this is the schedule's own evaluation (cycle.yaml), as a tick would run it.
    start = (improvement_schedule(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))
             if given is None else cycle_start(instance, settings, when, trigger="run_cycle"))
    runs, queue, promo, seen = [], [start], {}, set()
    cursor = _latest_eval_event(instance)
    while queue:
        req = queue.pop(0)
        if req.run_key in seen:        # the daemon drops a repeated run key the same way
            continue
        seen.add(req.run_key)
        done = _succeeded(instance, req.run_key)
        if done is not None:
            log(f"{req.job_name} {req.partition_key or ''}: done before (run {done.run_id[:8]}), resumed")
            queue += followups(instance, done, settings)
            continue
        t0 = time.monotonic()
        res = _execute(instance, defs, req, extra=run_config)
        runs.append((req.job_name, res.success))
        log(f"{req.job_name} {req.partition_key or ''}: {'ok' if res.success else 'FAILED'} "
            f"in {time.monotonic() - t0:.0f} s")
        if not res.success:
            break
        queue += followups(instance, res.dagster_run, settings)
        if req.job_name == holdout_eval_job.name:
            ctx = dg.build_sensor_context(instance=instance, cursor=cursor)
            out = promotion_sensor(ctx)
            cursor = ctx.cursor
            for p in out if isinstance(out, list) else []:
                pres = _execute(instance, defs, p, promotion_job.name, extra=run_config)
                runs.append((promotion_job.name, pres.success))
                if pres.success:
                    md = _metadata(pres.asset_materializations_for_node("promotion")[-1])
                    log(f"promotion: {md.get('state')} ({md.get('verdict')})")
                    if _decided(md) or not promo:     # later "already the champion" events keep the decision
                        promo = md
    cycle = start.tags[CYCLE]
    return {"candidate": cycle, "runs": runs, "promotion": promo or _last_promotion(instance, cycle),
            "ok": all(ok for _, ok in runs)}


def _decided(md: dict) -> bool:
    return md.get("state") != "waiting" and md.get("verdict") != "already the champion"


def _metadata(mat) -> dict:
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def _succeeded(instance, run_key: str | None):
    if not run_key:
        return None
    runs = instance.get_runs(dg.RunsFilter(tags={RUN_KEY: run_key}, statuses=[dg.DagsterRunStatus.SUCCESS]), limit=1)
    return runs[0] if runs else None


def _last_promotion(instance, cycle: str) -> dict:
    """The newest decided promotion of this cycle's candidate (a resumed cycle reports it again)."""
    for rec in instance.fetch_materializations(dg.AssetKey("promotion"), limit=50, ascending=False).records:
        run = instance.get_run_by_id(rec.run_id)
        md = _metadata(rec.event_log_entry.asset_materialization)
        if run is not None and run.tags.get(CYCLE) == cycle and _decided(md):
            return md
    return {}


def _latest_eval_event(instance) -> str | None:
    recs = instance.fetch_materializations(dg.AssetKey("holdout_eval"), limit=1, ascending=False).records
    return str(recs[0].storage_id) if recs else None


def _execute(instance, defs, req: dg.RunRequest, default_job: str | None = None, extra: dict | None = None):
    job = defs.resolve_job_def(req.job_name or default_job)
    tags = {**req.tags, **({RUN_KEY: req.run_key} if req.run_key else {})}
    return job.execute_in_process(instance=instance, run_config={**(extra or {}), **(req.run_config or {})},
                                  tags=tags, partition_key=req.partition_key, raise_on_error=False)


defs = dg.Definitions(jobs=[improvement_job], schedules=[improvement_schedule], sensors=[cycle_sensor])
__all__ = ["POLICIES", "cycle_sensor", "defs", "improvement_job", "improvement_schedule", "run_cycle"]
