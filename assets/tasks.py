"""The repair-task suite (HumanEval mutants, verified in the sandbox) as the `tasks` table."""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.
from typing import Optional

import dagster as dg

from assets import OWNERS, table_metadata
from ratchet.markdown import md_table
from resources import WarehouseResource


class TaskSuiteConfig(dg.Config):
    seed: int = 0
    limit: Optional[int] = None      # first N HumanEval problems (quick mode / tests); None = all 164
    per_problem: int = 8             # verified mutants kept per problem
    cache_dir: Optional[str] = None  # default $RATCHET_SUITE_CACHE or RATCHET_HOME/cache/humaneval-suite


@dg.multi_asset(name="task_suite", pool="warehouse", specs=[
    dg.AssetSpec(
        "tasks", group_name="tasks", owners=OWNERS["tasks"], metadata=table_metadata("tasks"), kinds={"duckdb"},
        description="Verified HumanEval repair tasks (seeded AST mutants), replaced whole by each run.")])
def task_suite(context: dg.AssetExecutionContext, config: TaskSuiteConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    from collections import Counter

    from ratchet.governance.tasks import task_rows
    from sandboxes.humaneval import build_suite
    from sandboxes.humaneval.suite import cache_key

    suite = build_suite(seed=config.seed, limit=config.limit, per_problem=config.per_problem,
                        cache_dir=config.cache_dir)
    key = cache_key(suite.params)
    rows = task_rows(suite.tasks, suite_key=key)
    n = warehouse.store().replace("tasks", rows)
    context.log.info(f"tasks: {n} from {suite.stats.get('problems_used')} problems "
                     f"({'cache' if suite.cached else f'built in {suite.build_seconds:.1f} s'})")
    rejected = suite.stats.get("rejected", {})
    md = md_table(["reason", "mutants"], [(f"`{k}`", v) for k, v in sorted(rejected.items(), key=lambda kv: -kv[1])])
    return dg.MaterializeResult(metadata={
        "tasks": n, "dagster/row_count": n, "problems": suite.stats.get("problems"), "problems_used": suite.stats.get("problems_used"),
        "problems_dropped": dg.MetadataValue.json(suite.stats.get("problems_dropped", {})),
        "generated": suite.stats.get("generated"), "rejected": dg.MetadataValue.md(md if rejected else "none rejected"),
        "by_slice": dg.MetadataValue.json(dict(sorted(Counter(r["slice"] for r in rows).items()))),
        "environment_ids": dg.MetadataValue.json(sorted({r["environment_id"] for r in rows})),
        "suite_key": key, "cached": suite.cached, "seed": config.seed, "limit": config.limit or 0})


defs = dg.Definitions(assets=[task_suite])
