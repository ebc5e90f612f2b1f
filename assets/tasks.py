"""The task suite as the `tasks` table: the HumanEval repair suite (seeded AST mutants verified in
the sandbox) by default, plus a team's own tasks (Harbor task folders, SWE-bench-style instances
against local repositories), each checked against its reference fix; what a source could not
turn into a task is the `task_rejections` table (`ratchet.task_sources`)."""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from typing import Dict, List, Optional

import dagster as dg

from assets import OWNERS, table_metadata
from ratchet.markdown import md_table
from resources import WarehouseResource


class TaskSource(dg.Config):
    kind: str = "humaneval"          # humaneval | harbor | swebench
    path: Optional[str] = None       # harbor: a folder of task folders; swebench: the instances' JSONL
    repos: Optional[str] = None      # swebench: a folder of local git repositories (no network)
    limit: Optional[int] = None      # first N tasks of this source
    require_reference: bool = True   # False: a task without a reference fix is kept (fails-before checked)
    name: Optional[str] = None       # label in task_rejections and the metadata (default: kind)
    limits: Optional[Dict[str, float]] = None  # swebench: sandbox limits per instance, e.g. {verify_s: 30}


class TaskSuiteConfig(dg.Config):
    seed: int = 0
    limit: Optional[int] = None      # first N HumanEval problems (quick mode / tests); None = all 164
    per_problem: int = 8             # verified mutants kept per problem
    cache_dir: Optional[str] = None  # default $RATCHET_SUITE_CACHE or RATCHET_HOME/cache/humaneval-suite
    # None: the HumanEval suite alone (sized above). List `{kind: humaneval}` to keep it beside yours.
    sources: Optional[List[TaskSource]] = None


@dg.multi_asset(name="task_suite", pool="warehouse", specs=[
    dg.AssetSpec(
        "tasks", group_name="tasks", owners=OWNERS["tasks"], metadata=table_metadata("tasks"), kinds={"duckdb"},
        description="Verified repair tasks (HumanEval mutants by default; Harbor folders and SWE-bench-style "
                    "instances from config), replaced whole by each run; rejects go to task_rejections.")])
def task_suite(context: dg.AssetExecutionContext, config: TaskSuiteConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    from collections import Counter

    from ratchet.clock import now_utc
    from ratchet.governance.tasks import task_rows
    from ratchet.home import get_home
    from ratchet.task_sources import (
        Loaded,
        drop_duplicates,
        humaneval_rejections,
        load_source,
        parse_sources,
        rejection_rows,
        source_task_rows,
    )

    specs = parse_sources([s.model_dump() for s in config.sources] if config.sources else None)
    home = get_home(warehouse.home)
    runtime = []

    def sandbox():
        from sandboxes.runtime import LocalRuntime, SandboxUnavailable

        if not runtime:
            try:
                runtime.append(LocalRuntime())
            except SandboxUnavailable as e:
                raise SandboxUnavailable(f"checking your tasks against their reference fixes needs the sandbox: {e}") from e
        return runtime[0]

    rows, rejections, sources, meta, ids, owners = [], [], {}, {}, set(), {}
    for spec in specs:
        if spec.kind == "humaneval":
            suite, key, he_meta = _humaneval(context, config)
            meta.update(he_meta)
            loaded = Loaded(spec, list(suite.tasks), humaneval_rejections(suite.stats))
            drop_duplicates(ids, loaded, owners)
            rows += task_rows(loaded.bundles, suite_key=key)
        else:
            loaded = load_source(spec, sandbox, cache_dir=home.root / "cache" / "task-checks")
            drop_duplicates(ids, loaded, owners)
            rows += source_task_rows(loaded)
        rejections += loaded.rejections
        sources[spec.label] = {"kind": spec.kind, "path": spec.path, "accepted": len(loaded.bundles),
                               "rejected": len(loaded.rejections), "checks_reused": loaded.cached_checks}
        context.log.info(f"source {spec.label}: {len(loaded.bundles)} tasks, {len(loaded.rejections)} rejected"
                         + (f" ({dict(Counter(r.reason for r in loaded.rejections))})" if loaded.rejections else ""))
    rejected = rejection_rows(rejections, context.run_id, now_utc())
    if not rows:     # an empty suite would replace a good one: keep it, and say why nothing was accepted
        warehouse.store().replace("task_rejections", rejected)
        raise dg.Failure(description=f"no source gave a task ({len(rejections)} rejected); the tasks table is "
                                     f"left as it was; see `SELECT * FROM task_rejections`",
                         metadata={"sources": dg.MetadataValue.json(sources)})
    n = warehouse.store().replace_all({"tasks": rows, "task_rejections": rejected})["tasks"]
    shown = rejections[:20]
    rej_md = md_table(["source", "task", "reason", "detail"],
                      [(r.source, f"`{r.task}`", f"`{r.reason}`", r.detail[:160]) for r in shown])
    if len(rejections) > len(shown):
        rej_md += f"\n\n{len(rejections) - len(shown)} more: `SELECT * FROM task_rejections`"
    return dg.MaterializeResult(metadata={
        "tasks": n, "dagster/row_count": n, **meta,
        "by_slice": dg.MetadataValue.json(dict(sorted(Counter(r["slice"] for r in rows).items()))),
        "environment_ids": dg.MetadataValue.json(sorted({r["environment_id"] for r in rows})),
        "sources": dg.MetadataValue.json(sources), "tasks_rejected": len(rejections),
        "task_rejections": dg.MetadataValue.md(rej_md if rejections else "none rejected")})


def _humaneval(context, config: TaskSuiteConfig):
    """The HumanEval suite, its cache key, and the metadata the asset always reported for it."""
    from sandboxes.humaneval import build_suite
    from sandboxes.humaneval.suite import cache_key

    suite = build_suite(seed=config.seed, limit=config.limit, per_problem=config.per_problem,
                        cache_dir=config.cache_dir)
    key = cache_key(suite.params)
    context.log.info(f"tasks: {len(suite.tasks)} from {suite.stats.get('problems_used')} problems "
                     f"({'cache' if suite.cached else f'built in {suite.build_seconds:.1f} s'})")
    rejected = suite.stats.get("rejected", {})
    md = md_table(["reason", "mutants"], [(f"`{k}`", v) for k, v in sorted(rejected.items(), key=lambda kv: -kv[1])])
    return suite, key, {
        "problems": suite.stats.get("problems"), "problems_used": suite.stats.get("problems_used"),
        "problems_dropped": dg.MetadataValue.json(suite.stats.get("problems_dropped", {})),
        "generated": suite.stats.get("generated"), "rejected": dg.MetadataValue.md(md if rejected else "none rejected"),
        "suite_key": key, "cached": suite.cached, "seed": config.seed, "limit": config.limit or 0}


defs = dg.Definitions(assets=[task_suite])
