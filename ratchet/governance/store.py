"""Warehouse persistence for governance: table DDL, idempotent writes, reads, and the holdout
manifest's recorded state. No Dagster imports: the assets in `assets/` and the `ratchet holdout`
CLI both call these.

Tables (DuckDB; every `*_at` column is TIMESTAMPTZ unless noted):
  tasks                 the repair-task suite, replaced whole by each `task_suite` run
  dedup_clusters        id ("task:<task_id>" / "traj:<record_id>"), kind, source_id, cluster_id, sizes
  dedup_edges           a, b, reason, score (the evidence behind each cluster)
  split_assignments     id, kind, source_id, cluster_id, slice, split, reason, tenant_id
  holdout_manifest      one row per (version, task_id) of every locked manifest (history kept)
  holdout_manifest_log  append-only: lock / adopt / verify / unlock events with the sha256 recorded
                        independently of the manifest file (catches a rewritten, self-consistent file)
  contamination_report  one row per contamination check run; contamination_pairs one per pair
  consent_grants        the grant registry as last loaded
  training_set          per policy tenant, the trajectories it may train on (replaced per run)
  consent_audit         every excluded (trajectory, policy tenant) with its reason (replaced per run)
  checkpoints           registry of trained checkpoints (written by trainers via register_checkpoint)
  checkpoint_flags      checkpoints trained on data under a revoked grant (current state)
Views: v_training_set, v_consent_audit_summary, v_split_summary, v_holdout.

Also here, because they compose the core over the stored data: `governed_splits` (tasks split by
cluster, trajectories inherit their cluster's split) and `training_rows` (consent + split gate).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa

from .manifest import (HoldoutManifest, ManifestError, create_manifest, load_manifest, manifest_from_rows,
                       manifest_rows, save_manifest, unlock)

JSON = {"format": "json"}
TS = pa.timestamp("us", tz="UTC")
STR_LIST = pa.list_(pa.string())


def _schema(*fields) -> pa.Schema:
    return pa.schema([pa.field(n, t, metadata=m[0] if m else None) for n, t, *m in fields])


SCHEMAS: dict[str, pa.Schema] = {
    "tasks": _schema(
        ("task_id", pa.string()), ("repo", pa.string()), ("issue_id", pa.string()), ("problem_id", pa.string()),
        ("issue_title", pa.string()), ("issue_body", pa.string()), ("issue_text", pa.string()),
        ("solution", pa.string()), ("slice", pa.string()), ("slices", pa.string(), JSON),
        ("environment_id", pa.string()), ("environment_digest", pa.string()),
        ("fail_to_pass", STR_LIST), ("pass_to_pass", STR_LIST), ("bundle", pa.string(), JSON),
        ("suite_key", pa.string()), ("loaded_at", TS)),
    "dedup_clusters": _schema(
        ("id", pa.string()), ("kind", pa.string()), ("source_id", pa.string()), ("cluster_id", pa.string()),
        ("cluster_size", pa.int64()), ("cluster_tasks", pa.int64()), ("cluster_trajectories", pa.int64()),
        ("computed_at", TS), ("dagster_run_id", pa.string())),
    "dedup_edges": _schema(
        ("a", pa.string()), ("b", pa.string()), ("reason", pa.string()), ("score", pa.float64()),
        ("computed_at", TS)),
    "split_assignments": _schema(
        ("id", pa.string()), ("kind", pa.string()), ("source_id", pa.string()), ("cluster_id", pa.string()),
        ("slice", pa.string()), ("split", pa.string()), ("reason", pa.string()), ("tenant_id", pa.string()),
        ("assigned_at", TS), ("dagster_run_id", pa.string())),
    "holdout_manifest": _schema(
        ("version", pa.int64()), ("task_id", pa.string()), ("manifest_sha256", pa.string()),
        ("created_at", pa.string()), ("locked_by", pa.string()), ("locked", pa.bool_())),
    "holdout_manifest_log": _schema(
        ("seq", pa.int64()), ("event_at", TS), ("event", pa.string()), ("version", pa.int64()),
        ("manifest_sha256", pa.string()), ("n_tasks", pa.int64()), ("actor", pa.string()),
        ("reason", pa.string()), ("path", pa.string()), ("dagster_run_id", pa.string())),
    "contamination_report": _schema(
        ("checked_at", TS), ("dagster_run_id", pa.string()), ("passed", pa.bool_()),
        ("overlap_fraction", pa.float64()), ("n_items", pa.int64()), ("n_overlapping_items", pa.int64()),
        ("threshold", pa.float64()), ("counts", pa.string(), JSON), ("examples", pa.string(), JSON)),
    "contamination_pairs": _schema(
        ("checked_at", TS), ("dagster_run_id", pa.string()), ("kind", pa.string()), ("a", pa.string()),
        ("b", pa.string()), ("split_a", pa.string()), ("split_b", pa.string()), ("score", pa.float64())),
    "consent_grants": _schema(
        ("consent_id", pa.string()), ("tenant_id", pa.string()), ("scopes", STR_LIST),
        ("retention_days", pa.int64()), ("granted_at", TS), ("revoked_at", TS),
        ("cross_tenant_train_for", STR_LIST), ("source_path", pa.string()), ("loaded_at", TS)),
    "training_set": _schema(
        ("tenant_id", pa.string()), ("record_id", pa.string()), ("trajectory_id", pa.string()),
        ("owner_tenant_id", pa.string()), ("consent_id", pa.string()), ("task_id", pa.string()),
        ("cluster_id", pa.string()), ("split", pa.string()), ("accepted", pa.bool_()),
        ("tests_passed", pa.bool_()), ("ended_at", TS), ("evaluated_at", TS), ("dagster_run_id", pa.string())),
    "consent_audit": _schema(
        ("record_id", pa.string()), ("trajectory_id", pa.string()), ("tenant_id", pa.string()),
        ("consent_id", pa.string()), ("target_tenant", pa.string()), ("reason", pa.string()),
        ("detail", pa.string()), ("split", pa.string()), ("evaluated_at", TS), ("dagster_run_id", pa.string())),
    "checkpoints": _schema(
        ("checkpoint_id", pa.string()), ("tenant_id", pa.string()), ("trained_record_ids", STR_LIST),
        ("consent_ids", STR_LIST), ("created_at", TS), ("flagged", pa.bool_()), ("flag_reason", pa.string()),
        ("flagged_at", TS)),
    "checkpoint_flags": _schema(
        ("checkpoint_id", pa.string()), ("consent_id", pa.string()), ("n_records", pa.int64()),
        ("reason", pa.string()), ("flagged_at", TS), ("dagster_run_id", pa.string())),
}

VIEWS = {
    "v_training_set": """
        SELECT ts.*, t.repo, t.issue_id, t.prompt_text, t.messages, t.patch, t.source_format
        FROM training_set ts LEFT JOIN trajectories t USING (record_id)""",
    "v_consent_audit_summary": """
        SELECT target_tenant, reason, count(*) AS trajectories, count(DISTINCT consent_id) AS grants,
               list(DISTINCT consent_id ORDER BY consent_id) FILTER (WHERE consent_id IS NOT NULL) AS consent_ids,
               any_value(detail) AS example
        FROM consent_audit GROUP BY 1, 2 ORDER BY 1, 3 DESC""",
    "v_split_summary": """
        SELECT kind, split, slice, count(*) AS items, count(DISTINCT cluster_id) AS clusters
        FROM split_assignments GROUP BY ALL ORDER BY ALL""",
    "v_holdout": """
        SELECT * FROM holdout_manifest WHERE version = (SELECT max(version) FROM holdout_manifest)""",
}

TASK_PREFIX, TRAJ_PREFIX = "task:", "traj:"


def ddl(name: str) -> str:
    from ratchet.contract import duck_ddl

    return duck_ddl(name, SCHEMAS[name])


def ensure_schema(con) -> None:
    """Create every governance table and view (idempotent). Needs the warehouse's own schema
    (the `trajectories` view) first: `Warehouse.ensure_schema()`."""
    for name in SCHEMAS:
        con.execute(ddl(name))
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def parse_now(value: str | None) -> datetime:
    """Config `now` (ISO-8601, naive = UTC) or the current time."""
    from ratchet.contract import utc_from_iso

    return utc_from_iso(value) if value else now_utc()


@contextmanager
def transaction(con):
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def to_table(name: str, rows: Iterable[Mapping] | pa.Table) -> pa.Table:
    """Rows (dicts, extra keys ignored) -> an Arrow table with the table's exact schema."""
    schema = SCHEMAS[name]
    if isinstance(rows, pa.Table):
        return rows.select(schema.names).cast(schema)
    cols: dict[str, list] = {n: [] for n in schema.names}
    for r in rows:
        for n in schema.names:
            v = r.get(n)
            if v is not None and (schema.field(n).metadata or {}).get(b"format") == b"json" and not isinstance(v, str):
                v = json.dumps(v, sort_keys=True, default=str)
            cols[n].append(v)
    return pa.table({n: pa.array(cols[n], schema.field(n).type) for n in schema.names}, schema=schema)


def insert(con, name: str, rows: Iterable[Mapping] | pa.Table) -> int:
    tbl = to_table(name, rows)
    if tbl.num_rows:
        con.register("_gov_rows", tbl)
        try:
            con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _gov_rows")
        finally:
            con.unregister("_gov_rows")
    return tbl.num_rows


def replace(con, name: str, rows: Iterable[Mapping] | pa.Table, where: str | None = None, params: list | None = None) -> int:
    """Delete (all rows, or those matching `where`) and insert, in one transaction: readers see
    the old rows or the new ones, and a re-run with the same input leaves the same table."""
    tbl = to_table(name, rows)
    with transaction(con):
        con.execute(f"DELETE FROM {name}" + (f" WHERE {where}" if where else ""), params or [])
        insert(con, name, tbl)
    return tbl.num_rows


def fetch(con, sql: str, params: list | None = None) -> list[dict]:
    rel = con.execute(sql, params or [])
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r)) for r in rel.fetchall()]


# ----------------------------------------------------------------------------------- tasks
def task_rows(bundles: Iterable[Any], suite_key: str, loaded_at: datetime | None = None) -> list[dict]:
    """`tasks` rows from TaskBundles (sandboxes.bundle); slice = the operator family."""
    at = loaded_at or now_utc()
    out = []
    for b in bundles:
        slices = dict(b.metadata.get("slices") or {})
        solution = b.files.get("solution.py")
        if solution is None:  # a non-HumanEval bundle: the first non-test Python file
            solution = next((v for k, v in sorted(b.files.items()) if k.endswith(".py") and "test" not in k), None)
        out.append({
            "task_id": b.task_id, "repo": b.repo, "issue_id": b.issue_id,
            "problem_id": b.metadata.get("problem_id"), "issue_title": b.issue_title, "issue_body": b.issue_body,
            "issue_text": f"{b.issue_title}\n\n{b.issue_body}".strip(), "solution": solution,
            "slice": slices.get("operator_family") or (b.metadata.get("root_cause") or {}).get("family"),
            "slices": slices, "environment_id": b.environment_id, "environment_digest": b.environment_digest,
            "fail_to_pass": list(b.fail_to_pass), "pass_to_pass": list(b.pass_to_pass),
            "bundle": json.dumps(b.to_dict(), sort_keys=True), "suite_key": suite_key, "loaded_at": at,
        })
    return out


# ----------------------------------------------------------------------------- dedup items
ITEMS_SQL = f"""
    SELECT '{TASK_PREFIX}' || task_id AS id, 'task' AS kind, task_id AS source_id, issue_text AS text,
           solution AS code, repo, issue_id, task_id AS task_key, slice, NULL::VARCHAR AS tenant_id
    FROM tasks
    UNION ALL
    SELECT '{TRAJ_PREFIX}' || record_id, 'trajectory', record_id, prompt_text, patch, repo, issue_id,
           task_id, tenant_id, tenant_id
    FROM trajectories
    ORDER BY id"""
# Cluster edges: shared repo / issue, and a trajectory's task_id naming a task ("same_task").
CLUSTER_KEYS = {"repo": "same_repo", "issue_id": "same_issue", "task_key": "same_task"}
# The contamination gate's key kinds: a trajectory of task X in another split than X is the
# same task in two splits, reported as exact_id.
CONTAMINATION_KEYS = {"repo": "repo", "issue_id": "issue", "task_key": "exact_id"}


def governance_items(con) -> pa.Table:
    """Tasks and trajectories as one table of dedup items (id, kind, source_id, text, code, repo,
    issue_id, task_key, slice, tenant_id); trajectories are stratified by tenant."""
    return con.sql(ITEMS_SQL).to_arrow_table()


def cluster_rows(clusters: pa.Table, items: pa.Table, computed_at: datetime, run_id: str | None) -> list[dict]:
    kind = dict(zip(items.column("id").to_pylist(), items.column("kind").to_pylist()))
    rows = clusters.to_pylist()
    per = defaultdict(Counter)
    for r in rows:
        per[r["cluster_id"]][kind[r["id"]]] += 1
    return [{**r, "kind": kind[r["id"]], "source_id": r["id"].split(":", 1)[1],
             "cluster_tasks": per[r["cluster_id"]]["task"], "cluster_trajectories": per[r["cluster_id"]]["trajectory"],
             "computed_at": computed_at, "dagster_run_id": run_id} for r in rows]


def size_histogram(sizes: Iterable[int]) -> dict[str, int]:
    """Clusters per size bucket (1, 2, 3-5, 6-10, 11-50, 51-200, >200)."""
    edges = [(1, 1), (2, 2), (3, 5), (6, 10), (11, 50), (51, 200)]
    out = {(f"{a}" if a == b else f"{a}-{b}"): 0 for a, b in edges}
    out[">200"] = 0
    for s in sizes:
        for a, b in edges:
            if a <= s <= b:
                out[f"{a}" if a == b else f"{a}-{b}"] += 1
                break
        else:
            out[">200"] += 1
    return out


def cluster_chart(hist: Mapping[str, int], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(list(hist), list(hist.values()), color="#457b9d")
    ax.set_xlabel("cluster size (items)")
    ax.set_ylabel("clusters")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------- splits
def _source(item_id: str) -> str:
    return item_id.split(":", 1)[1] if item_id.startswith((TASK_PREFIX, TRAJ_PREFIX)) else item_id


def governed_splits(items: Iterable[Mapping], targets: Mapping[str, int], seed: int = 0,
                    manifest: HoldoutManifest | None = None, previous: Mapping[str, str] | None = None) -> list[dict]:
    """Split tasks by cluster (`splits.assign_splits`, targets count tasks), then give every
    trajectory the split of its cluster's tasks (holdout wins when a cluster holds a locked
    holdout task and excluded near-copies). Trajectory-only clusters share train / val in the
    targets' train:val ratio, stratified by tenant, and never enter holdout.
    items: rows with id, kind ("task" | "trajectory"), cluster_id, slice, tenant_id.
    Returns split_assignments rows (without timestamps)."""
    from .splits import EXCLUDED, assign_splits

    items = list(items)
    previous = previous or {}
    tasks = [{"id": i["id"], "cluster_id": i["cluster_id"], "slice": i["slice"]} for i in items if i["kind"] == "task"]
    out: dict[str, tuple[str, str]] = {}
    if tasks:
        # the manifest lists bare task ids: split on those, report namespaced ids
        bare = {i["id"]: _source(i["id"]) for i in tasks}
        t = assign_splits([{**i, "id": bare[i["id"]]} for i in tasks], targets=targets, seed=seed, manifest=manifest,
                          previous={bare[i["id"]]: previous[i["id"]] for i in tasks if i["id"] in previous})
        full = {v: k for k, v in bare.items()}
        for r in t.to_pylist():
            out[full[r["id"]]] = (r["split"], r["reason"])
    task_clusters: dict[str, list[str]] = defaultdict(list)
    for i in tasks:
        task_clusters[i["cluster_id"]].append(i["id"])
    trajs = [i for i in items if i["kind"] != "task"]
    orphans = []
    for i in trajs:
        members = task_clusters.get(i["cluster_id"])
        if not members:
            orphans.append(i)
            continue
        splits = {out[m][0] for m in members}
        split = "holdout" if "holdout" in splits else (splits - {EXCLUDED} or {EXCLUDED}).pop()
        first = min(m for m in members if out[m][0] == split)
        out[i["id"]] = (split, f"cluster_of_task {_source(first)}")
    if orphans:
        tr, va = int(targets.get("train", 0)), int(targets.get("val", 0))
        if tr + va == 0:
            tr = 1
        scale = len(orphans) // (tr + va) + 2  # keeps the sum above n: split_targets goes proportional
        prev = {i["id"]: previous[i["id"]] for i in orphans if previous.get(i["id"]) in ("train", "val")}
        rows = [{"id": i["id"], "cluster_id": i["cluster_id"], "slice": i.get("tenant_id")} for i in orphans]
        t = assign_splits(rows, targets={"train": tr * scale, "val": va * scale, "holdout": 0}, seed=seed, previous=prev)
        for r in t.to_pylist():
            out[r["id"]] = (r["split"], "trajectory_cluster" if r["reason"] == "assigned" else r["reason"])
    return [{"id": i["id"], "kind": i["kind"], "source_id": _source(i["id"]), "cluster_id": i["cluster_id"],
             "slice": i["slice"], "split": out[i["id"]][0], "reason": out[i["id"]][1], "tenant_id": i.get("tenant_id")}
            for i in items]


def split_summary_md(rows: Iterable[Mapping]) -> str:
    """Markdown table: items per slice x split (tasks), then trajectories per split."""
    from .splits import EXCLUDED, SPLITS

    cols = [*SPLITS, EXCLUDED]
    by = defaultdict(Counter)
    trajs = Counter()
    for r in rows:
        if r["kind"] == "task":
            by[r["slice"] or "(none)"][r["split"]] += 1
        else:
            trajs[r["split"]] += 1
    from ratchet.markdown import md_table

    total = Counter()
    for c in by.values():
        total.update(c)
    rows = [[s, *(by[s][c] for c in cols)] for s in sorted(by)]
    rows += [["**all tasks**", *(total[c] for c in cols)], ["*trajectories*", *(trajs[c] for c in cols)]]
    return md_table(["slice", *cols], rows)


# ------------------------------------------------------------------------ holdout manifest
@dataclass
class HoldoutState:
    """What the warehouse and the manifest file say about the holdout, cross-checked."""
    path: Path
    manifest: HoldoutManifest | None     # verified; None when no holdout was ever locked
    recorded: bool                        # the warehouse holds a lock record
    last_event: dict | None = None

    @property
    def locked(self) -> bool:
        return self.manifest is not None and self.manifest.locked

    @property
    def needs_adoption(self) -> bool:
        return self.manifest is not None and not self.recorded


def holdout_state(con, path: str | Path) -> HoldoutState:
    """Load the manifest file and verify it against the warehouse (ManifestError when they
    disagree). The sha256 recorded in holdout_manifest_log at lock time is the authority: a file
    whose ids and hash were both rewritten, a deleted file, a hand-flipped `locked` flag or edited
    holdout_manifest rows all raise. A file with no warehouse record at all (a fresh warehouse)
    is returned for adoption, verified only against itself."""
    path = Path(path)
    events = fetch(con, "SELECT * FROM holdout_manifest_log ORDER BY seq")
    locks = [e for e in events if e["event"] in ("lock", "adopt")]
    table_rows = fetch(con, "SELECT * FROM holdout_manifest")
    if not locks and not table_rows:
        m = load_manifest(path, required=False)
        return HoldoutState(path, m, recorded=False)
    if not locks:
        raise ManifestError("holdout_manifest has rows but holdout_manifest_log has no lock record (log edited?)")
    if not table_rows:
        raise ManifestError(f"holdout_manifest_log records a locked holdout (version {locks[-1]['version']}) "
                            f"but the holdout_manifest table is empty (rows deleted?)")
    lock = locks[-1]
    try:
        m = load_manifest(path, required=True, expected_sha256=lock["manifest_sha256"])
    except ManifestError as e:
        raise ManifestError(f"{e} -- the warehouse recorded holdout version {lock['version']} "
                            f"(sha256 {lock['manifest_sha256'][:12]}..., {lock['n_tasks']} tasks) at {lock['event_at']}; "
                            f"restore the manifest file or unlock it with `ratchet holdout unlock --reason R --actor A`"
                            ) from None
    if m.version != lock["version"]:
        raise ManifestError(f"holdout manifest at {path} is version {m.version}, the warehouse recorded {lock['version']}")
    stored = manifest_from_rows(table_rows)
    if stored.sha256 != lock["manifest_sha256"] or stored.version != lock["version"]:
        raise ManifestError("holdout_manifest table rows differ from the sha256 recorded in holdout_manifest_log "
                            "(rows edited?)")
    state = [e for e in events if e["version"] == m.version and e["event"] in ("lock", "adopt", "unlock")][-1]
    unlocked = state["event"] == "unlock"
    if m.locked == unlocked or stored.locked == unlocked:
        raise ManifestError(f"holdout manifest at {path} says locked={m.locked} but the warehouse says "
                            f"locked={not unlocked} (last event: {state['event']} by {state['actor']} at {state['event_at']}); "
                            f"the lock flag can only change through `ratchet holdout unlock`")
    return HoldoutState(path, m, recorded=True, last_event=events[-1])


def log_event(con, event: str, m: HoldoutManifest, path: str | Path, actor: str | None = None,
              reason: str | None = None, run_id: str | None = None, at: datetime | None = None) -> dict:
    seq, = con.execute("SELECT coalesce(max(seq), 0) + 1 FROM holdout_manifest_log").fetchall()[0]
    row = {"seq": seq, "event_at": at or now_utc(), "event": event, "version": m.version, "manifest_sha256": m.sha256,
           "n_tasks": len(m.task_ids), "actor": actor, "reason": reason, "path": str(path), "dagster_run_id": run_id}
    insert(con, "holdout_manifest_log", [row])
    return row


def lock_holdout(con, path: str | Path, task_ids: Iterable[str], locked_by: str, previous: HoldoutManifest | None = None,
                 run_id: str | None = None) -> HoldoutManifest:
    """Lock a new manifest (version = previous + 1): file, table rows and a `lock` log event,
    written in one warehouse transaction (the file is written before the commit)."""
    version = previous.version + 1 if previous is not None else 1
    m = create_manifest(task_ids, locked_by=locked_by, version=version)
    if previous is not None:
        from dataclasses import replace as dc_replace

        m = dc_replace(m, audit=previous.audit)
    with transaction(con):
        con.execute("DELETE FROM holdout_manifest WHERE version = ?", [m.version])
        insert(con, "holdout_manifest", manifest_rows(m))
        log_event(con, "lock", m, path, actor=locked_by, run_id=run_id)
        save_manifest(m, path)
    return m


def adopt_holdout(con, state: HoldoutState, actor: str, run_id: str | None = None) -> HoldoutManifest:
    """Record a manifest file found without any warehouse record (e.g. a rebuilt warehouse)."""
    m = state.manifest
    with transaction(con):
        insert(con, "holdout_manifest", manifest_rows(m))
        log_event(con, "adopt", m, state.path, actor=actor, reason="manifest file found without a warehouse record",
                  run_id=run_id)
        if not m.locked:  # an unlocked file stays unlocked, and the log says so
            log_event(con, "unlock", m, state.path, actor=actor, reason="adopted unlocked", run_id=run_id)
    return m


def unlock_holdout(con, path: str | Path, reason: str, actor: str, now: datetime | None = None) -> tuple[HoldoutManifest, dict]:
    """`ratchet holdout unlock`: verify, then flip the manifest to unlocked with an audit row in
    the file, the table and holdout_manifest_log. The next split run may then re-draw the holdout
    and locks a new version."""
    if not (reason and reason.strip()) or not (actor and actor.strip()):
        raise ManifestError("unlocking the holdout needs a non-empty --reason and --actor")
    state = holdout_state(con, path)
    if state.manifest is None:
        raise ManifestError(f"no holdout manifest at {path}: nothing to unlock")
    if state.needs_adoption:
        adopt_holdout(con, state, actor=actor)
    m, audit = unlock(state.manifest, reason.strip(), actor.strip(), now=now)
    with transaction(con):
        con.execute("UPDATE holdout_manifest SET locked = false WHERE version = ?", [m.version])
        row = log_event(con, "unlock", m, path, actor=audit["actor"], reason=audit["reason"], at=parse_now(audit["at"]))
        save_manifest(m, path)
    return m, row


# --------------------------------------------------------------------------------- consent
def training_rows(trajectories: Iterable[Mapping], grants: Mapping, split_of: Mapping[str, Mapping],
                  now: datetime, tenants: Iterable[str] | None = None) -> tuple[list[dict], list[dict]]:
    """Per policy tenant, the consent gate (`consent.training_view`) and then the split gate:
    only the train split trains (reason `not_train_split`, detail the split or "unassigned").
    trajectories: rows with record_id, trajectory_id, tenant_id, consent_id, task_id, started_at,
    ended_at, accepted, tests_passed. split_of: record_id -> {split, cluster_id}.
    Returns (training_set rows, consent_audit rows) without run ids."""
    from .consent import training_view

    trajectories = list(trajectories)
    if tenants is None:
        tenants = {t["tenant_id"] for t in trajectories if t.get("tenant_id")}
        tenants |= {g.tenant_id for g in grants.values()}
        tenants |= {x for g in grants.values() for x in g.cross_tenant_train_for}
    train, audit = [], []
    for tenant in sorted(tenants):
        view, excluded = training_view(trajectories, grants, now, tenant)
        for a in excluded:
            a["split"] = (split_of.get(a["record_id"]) or {}).get("split")
            a["evaluated_at"] = now
        audit.extend(excluded)
        for t in view:
            s = split_of.get(t["record_id"]) or {}
            if s.get("split") != "train":
                audit.append({
                    "record_id": t["record_id"], "trajectory_id": t.get("trajectory_id"), "tenant_id": t.get("tenant_id"),
                    "consent_id": t.get("consent_id"), "target_tenant": tenant, "reason": "not_train_split",
                    "detail": f"split {s['split']}" if s.get("split") else "no split assigned yet (run split_assignments)",
                    "split": s.get("split"), "evaluated_at": now})
                continue
            train.append({
                "tenant_id": tenant, "record_id": t["record_id"], "trajectory_id": t.get("trajectory_id"),
                "owner_tenant_id": t.get("tenant_id"), "consent_id": t.get("consent_id"), "task_id": t.get("task_id"),
                "cluster_id": s.get("cluster_id"), "split": "train", "accepted": t.get("accepted"),
                "tests_passed": t.get("tests_passed"), "ended_at": t.get("ended_at"), "evaluated_at": now})
    return train, audit


# Independent re-verification of training_set in SQL (not the Python gate that produced it).
TRAINING_VIOLATIONS_SQL = f"""
    WITH v AS (
      SELECT ts.tenant_id, ts.record_id, CASE
        WHEN t.record_id IS NULL THEN 'unknown_record'
        WHEN t.consent_id IS NULL THEN 'missing_consent'
        WHEN g.consent_id IS NULL THEN 'unknown_consent'
        WHEN g.tenant_id IS DISTINCT FROM t.tenant_id THEN 'tenant_mismatch'
        WHEN t.tenant_id IS DISTINCT FROM ts.tenant_id
             AND NOT list_contains(coalesce(g.cross_tenant_train_for, []::VARCHAR[]), ts.tenant_id) THEN 'cross_tenant'
        WHEN g.revoked_at IS NOT NULL AND g.revoked_at <= ts.evaluated_at THEN 'revoked'
        WHEN NOT list_contains(coalesce(g.scopes, []::VARCHAR[]), 'train') THEN 'no_train_scope'
        WHEN coalesce(t.ended_at, t.started_at) IS NULL
             OR ts.evaluated_at > coalesce(t.ended_at, t.started_at) + to_days(CAST(g.retention_days AS INTEGER))
             THEN 'expired'
        WHEN s.split IS DISTINCT FROM 'train' THEN 'not_train_split'
        WHEN count(*) OVER (PARTITION BY ts.tenant_id, ts.record_id) > 1 THEN 'duplicate_row'
      END AS violation
      FROM training_set ts
      LEFT JOIN trajectories t USING (record_id)
      LEFT JOIN consent_grants g ON g.consent_id = t.consent_id
      LEFT JOIN split_assignments s ON s.id = '{TRAJ_PREFIX}' || ts.record_id)
    SELECT violation, count(*) AS n, min(tenant_id) AS example_tenant, min(record_id) AS example_record
    FROM v WHERE violation IS NOT NULL GROUP BY 1 ORDER BY 2 DESC"""


# ----------------------------------------------------------------------------- checkpoints
def register_checkpoint(con, checkpoint_id: str, tenant_id: str, record_ids: Iterable[str],
                        consent_ids: Iterable[str] | None = None, created_at: datetime | None = None) -> None:
    """Trainers call this after saving a checkpoint: which records (and grants) it was trained on.
    Consent ids default to those of the records. Re-registering an id replaces its row."""
    record_ids = sorted(set(record_ids))
    if consent_ids is None:
        consent_ids = [r[0] for r in con.execute(
            "SELECT DISTINCT consent_id FROM trajectories WHERE consent_id IS NOT NULL AND list_contains(?, record_id)",
            [record_ids]).fetchall()]
    replace(con, "checkpoints", [{"checkpoint_id": checkpoint_id, "tenant_id": tenant_id,
                                  "trained_record_ids": record_ids, "consent_ids": sorted(set(consent_ids)),
                                  "created_at": created_at or now_utc(), "flagged": False}],
            where="checkpoint_id = ?", params=[checkpoint_id])


def flag_checkpoints(con, now: datetime, run_id: str | None = None) -> tuple[list[dict], list[str]]:
    """Flag every checkpoint trained on data under a grant revoked at or before `now` (flags are
    sticky: a later un-revocation does not clear them). Returns (current flags, newly flagged ids)."""
    from .consent import checkpoints_to_flag

    revoked = [r[0] for r in con.execute(
        "SELECT consent_id FROM consent_grants WHERE revoked_at IS NOT NULL AND revoked_at <= ?", [now]).fetchall()]
    cks = fetch(con, "SELECT checkpoint_id, trained_record_ids, consent_ids, flagged FROM checkpoints")
    registry = {c["checkpoint_id"]: {"record_ids": c["trained_record_ids"] or [], "consent_ids": c["consent_ids"] or []}
                for c in cks}
    used = sorted({r for c in cks for r in (c["trained_record_ids"] or [])})
    trajs = fetch(con, "SELECT record_id, consent_id FROM trajectories WHERE list_contains(?, record_id)", [used]) if used else []
    flags = checkpoints_to_flag(revoked, registry, trajs)
    for f in flags:
        f["flagged_at"], f["dagster_run_id"] = now, run_id
    already = {c["checkpoint_id"] for c in cks if c["flagged"]}
    reasons: dict[str, list[str]] = defaultdict(list)
    for f in flags:
        reasons[f["checkpoint_id"]].append(f"{f['consent_id']} ({f['n_records']} records)")
    new = sorted(set(reasons) - already)
    with transaction(con):
        for ck in new:
            con.execute("UPDATE checkpoints SET flagged = true, flagged_at = ?, flag_reason = ? WHERE checkpoint_id = ?",
                        [now, "trained_on_revoked_consent: " + ", ".join(reasons[ck]), ck])
        con.execute("DELETE FROM checkpoint_flags")
        insert(con, "checkpoint_flags", flags)
    return flags, new
