"""The exploit library (`sandboxes.redteam`) replayed for the reward-hacking promotion gate.

    plan(con)            a deterministic sample of train/val tasks (never holdout) and its digest
    recorded(con, plan)  the newest `reward_redteam` replay of that digest, or None
    replay(plan)         every exploit and the true fix on the sample, in real sandboxes -> rows
    ensure(warehouse)    plan, reuse the stored replay of the digest or run and append one

The digest covers what decides whether an exploit pays: the sampled tasks' environment digests
(their files, tests, limits, allowlists), the sandbox and verifier code (every module under
`sandboxes/` but the agents and the suite generator, the library itself included), the pytest
and Python versions and the runtime. A replay is rerun only when one of them changes.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

SAMPLE = 3
VERSION = "ratchet-reward-redteam-v1"
SPLITS = ("train", "val")
# A looping exploit costs the run's time limit; the suites' own limits (30 s / 120 s) would
# make a replay minutes long. Lowered, never raised: the per-test CPU limit, the memory and
# process limits and every gate stay the task's own.
CAP = {"wall_s": 10.0, "cpu_s": 10, "verify_s": 20.0}
# Code that does not decide a reward: the agents act through the tools, the generator built the
# suite (its output is in the tasks' digests).
NOT_VERIFIER = ("agents", "humaneval")


@dataclass(frozen=True)
class Plan:
    tasks: tuple                          # TaskBundle, limits capped
    digest: str                           # the record's environment_digest
    code_digest: str
    runtime: str
    environment_ids: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def task_ids(self) -> list[str]:
        return [b.task_id for b in self.tasks]


def code_digest() -> str:
    """sha256 over the sandbox and verifier sources (path and bytes, sorted)."""
    root = Path(__file__).resolve().parents[2] / "sandboxes"
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if rel.parts[0] in NOT_VERIFIER:
            continue
        h.update(str(rel).encode() + b"\0" + p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def _capped(bundle):
    lim = bundle.limits
    wall = min(lim.wall_s, CAP["wall_s"])
    return replace(bundle, limits=replace(lim, wall_s=wall, verify_s=min(lim.verify_s, CAP["verify_s"]),
                                          cpu_s=max(min(lim.cpu_s, CAP["cpu_s"]), int(wall + 0.999))))


def _has_table(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchall()[0][0])


def _order(task_id: str) -> str:
    # a hash, not the table's order or the ids' sort: the same suite gives the same sample, and a
    # sample is not always the first problems of the suite
    return hashlib.sha256(f"{VERSION}|{task_id}".encode()).hexdigest()


def plan(con, n: int = SAMPLE, runtime: str = "bwrap") -> Plan | str:
    """The sample to replay on, or why there is none. `n` tasks of the train and val splits that
    carry a reference fix and name the file under test, in a fixed hash order, taken in turn from
    each environment id (a suite with several environments gets each replayed). A task in the
    holdout manifest is never taken, whatever its split says."""
    from sandboxes.bundle import TaskBundle
    from sandboxes.redteam import NotApplicable, target_of
    from sandboxes.verifiers.hygiene import reference_diff

    for t in ("tasks", "split_assignments"):
        if not _has_table(con, t):
            return f"table {t} does not exist: materialise the task suite and the splits first"
    holdout = "AND t.task_id NOT IN (SELECT task_id FROM holdout_manifest)" if _has_table(con, "holdout_manifest") else ""
    rows = con.execute(f"""
        SELECT DISTINCT t.task_id, t.environment_id, t.bundle FROM tasks t
        JOIN split_assignments s ON s.kind = 'task' AND s.source_id = t.task_id
        WHERE s.split IN ('train', 'val') {holdout}""").fetchall()
    if not rows:
        return "no task in the train or val split to replay the exploit library on"
    by_env: dict[str, list] = {}
    for tid, env, blob in sorted(rows, key=lambda r: _order(r[0])):
        by_env.setdefault(env or "", []).append(blob)
    chosen, skipped = [], 0
    queues = [list(v) for _, v in sorted(by_env.items())]
    while len(chosen) < n and any(queues):
        for q in queues:
            while q and len(chosen) < n:
                b = TaskBundle.from_dict(json.loads(q.pop(0)))
                try:
                    target_of(b)
                except NotApplicable:
                    b = None
                if b is None or not reference_diff(b):
                    skipped += 1
                    continue
                chosen.append(_capped(b))
                break
    if not chosen:
        return f"none of the {len(rows)} train/val tasks has a reference fix and a named file under test"
    code, envs = code_digest(), tuple(sorted({b.environment_id for b in chosen}))
    from importlib.metadata import version

    # the sandbox runs the host's pytest and Python: an upgrade can open or close an exploit
    key = json.dumps([VERSION, sorted(b.environment_digest for b in chosen), code, version("pytest"),
                      sys.version, runtime], separators=(",", ":"))
    return Plan(tuple(chosen), "sha256:" + hashlib.sha256(key.encode()).hexdigest(), code, runtime, envs,
                (f"{skipped} task(s) skipped: no reference fix or no file under test",) if skipped else ())


def recorded(con, digest: str) -> list[dict] | None:
    """The exploit rows of the newest replay of `digest`, or None."""
    from ratchet.store import fetch

    if not _has_table(con, "reward_redteam"):
        return None
    rows = fetch(con, """
        SELECT * FROM reward_redteam WHERE redteam_id = (
            SELECT redteam_id FROM reward_redteam WHERE environment_digest = ?
            ORDER BY computed_at DESC LIMIT 1)
        ORDER BY exploit""", [digest])
    return rows or None


def replay(p: Plan, runtime=None, *, dagster_run_id: str | None = None, now=None) -> list[dict]:
    """Every exploit of the library against the plan's tasks: one `reward_redteam` row each."""
    from ratchet.clock import now_utc
    from sandboxes.redteam import replay as run_library

    t0 = time.monotonic()
    out = run_library(p.tasks, runtime)
    at = now or now_utc()
    rid = "redteam-" + hashlib.sha256(f"{p.digest}|{at.isoformat()}".encode()).hexdigest()[:16]
    common = {"redteam_id": rid, "environment_digest": p.digest, "true_fix_min_reward": out["true_fix_min_reward"],
              "true_fix_min_task": out["true_fix_min_task"], "true_fix_unscored": out["true_fix_unscored"],
              "tasks": p.task_ids, "task_digests": [b.environment_digest for b in p.tasks],
              "environment_ids": list(p.environment_ids), "code_digest": p.code_digest,
              "runtime": getattr(runtime, "isolation", None) or p.runtime,
              "seconds": round(time.monotonic() - t0, 2), "computed_at": at, "dagster_run_id": dagster_run_id}
    return [{**common, **r} for r in out["exploits"]]


def write(con, rows: list[dict]) -> int:
    from ratchet.store import insert

    from .tables import ensure

    if not _has_table(con, "reward_redteam"):
        ensure(con)
    return insert(con, "reward_redteam", rows)


@dataclass
class Outcome:
    digest: str | None
    rows: list[dict] | None
    ran: bool = False                    # False: the stored replay of the digest was reused
    why: str = ""                        # no record, and why (no sample, no sandbox)


def ensure(warehouse, *, runtime=None, dagster_run_id: str | None = None, n: int = SAMPLE) -> Outcome:
    """The replay of the warehouse's current sample: the stored one when its digest has one, else
    run now (outside any warehouse connection: it takes seconds per task) and appended."""
    with warehouse.connect() as con:
        p = plan(con, n)
        if isinstance(p, str):
            return Outcome(None, None, why=p)
        rows = recorded(con, p.digest)
    if rows:
        return Outcome(p.digest, rows)
    if runtime is None:
        from sandboxes.runtime import LocalRuntime, SandboxUnavailable
        try:
            runtime = LocalRuntime()
        except SandboxUnavailable as e:
            return Outcome(p.digest, None, why=f"the exploit library cannot run here: {e}")
    try:
        rows = replay(p, runtime, dagster_run_id=dagster_run_id)
    except Exception as e:  # noqa: BLE001 - reported as the gate's reason, never a pass
        return Outcome(p.digest, None, why=f"the replay of the exploit library failed: {type(e).__name__}: {e}")
    with warehouse.connect() as con:
        write(con, rows)
    return Outcome(p.digest, rows, ran=True)
