"""Data validation with great-expectations 1.x (dagster-ge does not support GX 1.x, so GX is
called directly). Returns plain results that asset checks turn into metadata."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

# What the trajectories_contract check validates, and the quarantine_rate check's inputs.
STORED_COLUMNS_SQL = """SELECT record_id, trajectory_id, task_id, source_format, schema_version, cost_usd, latency_s,
                               prompt_tokens, completion_tokens, n_turns, n_tool_calls, started_at, ended_at
                        FROM trajectories"""
LAST_BATCH_SQL = 'SELECT batch_id, "read", quarantined FROM ingest_batches ORDER BY finished_at DESC LIMIT 1'
UNEXPLAINED_QUARANTINE_SQL = "SELECT count(*) FROM quarantine WHERE reason_code IS NULL OR raw IS NULL"


@dataclass
class ValidationReport:
    success: bool
    rows: int
    results: list[dict] = field(default_factory=list)   # one per expectation

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.results if not r["success"]]


def _trajectory_expectations(formats: tuple[str, ...]):
    import great_expectations.expectations as gxe

    e = [gxe.ExpectColumnValuesToNotBeNull(column=c)
         for c in ("record_id", "trajectory_id", "task_id", "source_format", "schema_version")]
    e += [
        gxe.ExpectColumnValuesToBeUnique(column="record_id"),
        gxe.ExpectColumnValuesToMatchRegex(column="record_id", regex=r"^[0-9a-f]{64}$"),
        gxe.ExpectColumnValuesToBeInSet(column="source_format", value_set=list(formats)),
        gxe.ExpectColumnValuesToBeInSet(column="schema_version", value_set=["ratchet.trajectory/v1"]),
    ]
    e += [gxe.ExpectColumnValuesToBeBetween(column=c, min_value=0)
          for c in ("cost_usd", "latency_s", "prompt_tokens", "completion_tokens", "n_turns", "n_tool_calls")]
    e.append(gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A="ended_at", column_B="started_at", or_equal=True, ignore_row_if="either_value_is_missing"))
    return e


def validate_trajectories(df, formats: tuple[str, ...]) -> ValidationReport:
    """Run the contract expectations over a pandas frame of the scalar trajectory columns."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (ctx.data_sources.add_pandas("ratchet").add_dataframe_asset("trajectories")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": df}))
    suite = gx.ExpectationSuite(name="trajectory_contract_v1", expectations=_trajectory_expectations(formats))
    res = batch.validate(suite)
    out = []
    for r in res.results:
        cfg = r.expectation_config
        kw = cfg.kwargs
        out.append({"expectation": cfg.type, "column": kw.get("column") or f"{kw.get('column_A')}>={kw.get('column_B')}",
                    "success": bool(r.success), "unexpected_count": int(r.result.get("unexpected_count") or 0),
                    "examples": [str(x) for x in (r.result.get("partial_unexpected_list") or [])[:3]]})
    return ValidationReport(success=bool(res.success), rows=len(df), results=out)
