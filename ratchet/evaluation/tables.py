"""Warehouse tables of the evaluation layer (Arrow schemas -> DuckDB DDL via ratchet.contract) and
the small read/write functions the assets call. Keep table I/O here so it can move behind a store
object without touching the domain code.

  eval_episodes      one row per policy x checkpoint x task x seed (the contract: eval_contract)
  eval_summary       one row per policy x checkpoint x slice (dimension "all" = the whole holdout)
  judge_calibration  one row per calibration run (append-only: drift is read from its history)
  economics          one row per policy x checkpoint (replaced by each economics run)
  base_membership    one row per membership test of a pretrained base on the holdout's reference
                     solutions (append-only; ratchet.evaluation.membership)
Views: v_eval_latest (the newest summary of each policy over the whole holdout).

Declared like every layer (`SCHEMAS`, `VIEWS`): add "ratchet.evaluation.tables" to
ratchet.tables.LAYERS and `Warehouse.ensure_schema` creates them; `ensure(con)` does it alone.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import pyarrow as pa

from ratchet.store import fetch, insert, replace, transaction
from ratchet.tables import JSON, TS, to_table
from ratchet.tables import schema as _schema

F, I, S, B = pa.float64(), pa.int64(), pa.string(), pa.bool_()


EVAL_EPISODES = _schema(
    ("eval_id", S), ("eval_run_id", S), ("policy_id", S), ("checkpoint_version", S), ("task_id", S),
    ("seed", I), ("slice", S), ("family", S), ("difficulty", S), ("category", S), ("tenant_id", S),
    ("outcome", S), ("passed", B), ("reward", F), ("reward_tests", F), ("reward_hygiene", F),
    ("reward_judge", F), ("hard_gate_violations", I), ("hard_gates", pa.list_(S)),
    ("human_intervention", B), ("turns", I), ("tool_calls", I), ("tokens_in", I), ("tokens_out", I),
    ("latency_s", F), ("sandbox_s", F), ("policy_s", F), ("cost_usd", F), ("environment_id", S),
    ("environment_digest", S), ("holdout_sha256", S), ("started_at", TS), ("finished_at", TS), ("error", S),
    ("judge_id", S))        # who graded R_judge (rubric-v3, openai:<model>); NULL in rows from before it was kept

# Columns that may differ between two runs of the same checkpoint + seed + digest (timing, cost
# priced by time, and the run they belong to); every other column must be identical.
NON_REPRODUCIBLE = ("eval_run_id", "latency_s", "sandbox_s", "policy_s", "cost_usd", "started_at",
                    "finished_at")

EVAL_SUMMARY = _schema(
    ("computed_at", TS), ("dagster_run_id", S), ("policy_id", S), ("checkpoint_version", S),
    ("dimension", S), ("slice_value", S), ("environment_digest", S), ("holdout_sha256", S),
    ("seeds", pa.list_(I)), ("holdout_tasks", I), ("tasks", I), ("tasks_scored", I), ("tasks_passed", I), ("tasks_infra", I),
    ("pass_rate", F), ("pass_rate_ci_lo", F), ("pass_rate_ci_hi", F), ("pass_rate_display", S),
    ("episodes", I), ("episodes_scored", I), ("episodes_infra", I), ("episodes_passed", I),
    ("seed_pass_rates", S, JSON), ("seed_std", F), ("seed_range", F),
    ("baseline_policy_id", S), ("diff_vs_baseline", F), ("diff_ci_lo", F), ("diff_ci_hi", F), ("diff_tasks", I),
    ("hard_gate_rate", F), ("hard_gate_episodes", I), ("human_intervention_rate", F),
    ("human_intervention_episodes", I), ("latency_p50_s", F), ("latency_p95_s", F), ("mean_turns", F),
    ("mean_tool_calls", F), ("mean_cost_usd", F), ("n_boot", I), ("ci_seed", I))

JUDGE_CALIBRATION = _schema(
    ("computed_at", TS), ("dagster_run_id", S), ("judge_id", S), ("gold_source", S), ("items", I),
    ("kappa", F), ("kappa_ci_lo", F), ("kappa_ci_hi", F), ("agreement", F), ("judge_positive_rate", F),
    ("gold_positive_rate", F), ("warn_below", F), ("block_below", F), ("status", S),
    ("confusion", S, JSON), ("disagreements", S, JSON), ("n_boot", I), ("ci_seed", I))

ECONOMICS = _schema(
    ("computed_at", TS), ("dagster_run_id", S), ("rate_card", S), ("rate_card_json", S, JSON),
    ("policy_id", S), ("checkpoint_version", S), ("episodes", I), ("accepted_runs", I),
    ("variable_usd_total", F), ("training_usd", F), ("warm_start_usd", F), ("include_warm_start", B),
    ("production_n", I), ("variable_per_accepted_usd", F), ("sample_amortised_usd", F),
    ("production_amortised_usd", F), ("break_even_runs", I), ("baseline_policy_id", S), ("computable", B),
    ("variable_per_accepted", S), ("sample_amortised", S), ("production_amortised", S),
    ("training_investment", S), ("break_even", S))

BASE_MEMBERSHIP = _schema(
    ("checked_at", TS), ("dagster_run_id", S), ("base", S), ("holdout_sha256", S), ("programs", I),
    ("control_programs", I), ("min_k", F), ("held_out_gap", F), ("control_gap", F), ("excess_gap", F),
    ("excess_gap_ci_lo", F), ("excess_gap_ci_hi", F), ("likely_seen", B))

TABLES: dict[str, pa.Schema] = {"eval_episodes": EVAL_EPISODES, "eval_summary": EVAL_SUMMARY,
                                "judge_calibration": JUDGE_CALIBRATION, "economics": ECONOMICS,
                                "base_membership": BASE_MEMBERSHIP}
SCHEMAS = TABLES            # the name ratchet.tables.LAYERS reads from each layer

VIEWS = {
    "v_eval_latest": """
        SELECT * FROM eval_summary WHERE dimension = 'all'
        QUALIFY row_number() OVER (PARTITION BY policy_id, checkpoint_version ORDER BY computed_at DESC) = 1""",
}


def record_membership(con, report: Mapping, *, base: str, holdout_sha256: str | None, checked_at,
                      dagster_run_id: str | None = None) -> None:
    """Append one membership test (`membership.contamination_report`) of `base` on the holdout."""
    lo, hi = report["excess_gap_ci"]
    insert(con, "base_membership", [{
        "checked_at": checked_at, "dagster_run_id": dagster_run_id, "base": base, "holdout_sha256": holdout_sha256,
        "programs": report["programs"], "control_programs": report["control_programs"], "min_k": report["min_k"],
        "held_out_gap": report["held_out_gap"], "control_gap": report["control_gap"],
        "excess_gap": report["excess_gap"], "excess_gap_ci_lo": lo, "excess_gap_ci_hi": hi,
        "likely_seen": report["likely_seen"]}])


def grading(row: Mapping) -> tuple[str, str]:
    """What a row's reward was measured under: (environment digest, judge). Rows of one task under
    another judge are another evaluation (the reward differs), like rows under another digest."""
    return row.get("environment_digest"), row.get("judge_id") or ""


def ensure(con) -> None:
    """Create the evaluation tables and views (idempotent)."""
    from ratchet.tables import ddl

    from ratchet.tables import add_missing_columns

    for name in TABLES:
        con.execute(ddl(name))
        add_missing_columns(con, name)
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


# Row coercion and writes are the shared ones (ratchet.tables / ratchet.store); these names stay
# for the evaluation code that calls them.
to_arrow = to_table
replace_rows = replace
append_rows = insert


def write_episodes(con, rows: list[Mapping]) -> int:
    """Upsert by eval_id (a re-run of the same episode replaces its row), in one transaction."""
    tbl = to_table("eval_episodes", rows)
    with transaction(con):
        con.register("_eval_ids", tbl.select(["eval_id"]))
        try:
            con.execute("DELETE FROM eval_episodes WHERE eval_id IN (SELECT eval_id FROM _eval_ids)")
        finally:
            con.unregister("_eval_ids")
        return insert(con, "eval_episodes", tbl)


def episode_rows(con, policy_id: str | None = None, where: str = "", params: list | None = None) -> list[dict]:
    sql = "SELECT * FROM eval_episodes WHERE true"
    args: list = []
    if policy_id is not None:
        sql += " AND policy_id = ?"
        args.append(policy_id)
    if where:
        sql += f" AND ({where})"
        args += params or []
    return fetch(con, sql + " ORDER BY policy_id, checkpoint_version, task_id, seed", args)


def done_eval_ids(con, eval_ids: Iterable[str], *, retry_infra: bool = False) -> set[str]:
    """Which of `eval_ids` already have a row (resume); infra failures count as not done when
    `retry_infra`."""
    ids = list(eval_ids)
    if not ids:
        return set()
    con.register("_want", pa.table({"eval_id": pa.array(ids, S)}))
    try:
        sql = "SELECT e.eval_id FROM eval_episodes e JOIN _want USING (eval_id)"
        if retry_infra:
            sql += " WHERE e.outcome <> 'infra_failure'"
        return {r[0] for r in con.execute(sql).fetchall()}
    finally:
        con.unregister("_want")
