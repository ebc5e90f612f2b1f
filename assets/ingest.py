"""Stage 1: trajectory ingest (landing folder -> `trajectories` + `quarantine`)."""
# No `from __future__ import annotations`: Dagster resolves Config annotations at import time.

import dagster as dg

from assets import OWNERS, table_metadata
from ratchet.markdown import md_table
from resources import MlflowTracking, WarehouseResource


class IngestConfig(dg.Config):
    paths: list[str] = []              # files or folders; empty = the landing folder
    tenant_id: str | None = None       # attribution for records that carry none
    consent_id: str | None = None
    max_record_mb: float = 32.0


@dg.multi_asset(name="ingest", pool="warehouse", specs=[
    dg.AssetSpec(
        "trajectories", group_name="ingest", owners=OWNERS["ingest"], metadata=table_metadata("trajectories"),
        kinds={"duckdb", "parquet"},
        description="Accepted trajectories (contract v1), one row per distinct content."),
    dg.AssetSpec(
        "quarantine", group_name="ingest", owners=OWNERS["ingest"], metadata=table_metadata("quarantine"),
        kinds={"duckdb"},
        description="Every record that could not be accepted, with raw payload and reason.")])
def ingest_assets(context: dg.AssetExecutionContext, config: IngestConfig, warehouse: WarehouseResource,
                  tracking: MlflowTracking):
    from ratchet.home import get_home
    from ratchet.ingest import IngestOptions, ingest
    from ratchet.plots import ingest_chart, markdown_image

    home = get_home(warehouse.home)
    paths = config.paths or [str(home.landing)]
    wh = warehouse.get()
    opts = IngestOptions(tenant_id=config.tenant_id, consent_id=config.consent_id,
                         max_record_mb=config.max_record_mb, origin="dagster", dagster_run_id=context.run_id)
    last = [0]

    def progress(done: int, total: int) -> None:
        if total and done - last[0] >= total / 10:  # ~10 progress lines, not one per file
            last[0] = done
            context.log.info(f"ingest: {done / 2**20:.1f} / {total / 2**20:.1f} MiB")

    s = ingest(paths, wh, opts, progress=progress)
    context.log.info(f"ingest summary: {s.as_dict()}")
    chart = ingest_chart(s, home.artifacts / f"ingest-{s.batch_id}.png")
    with tracking.run("ratchet/ingest", f"ingest-{s.batch_id[:8]}", dagster_run_id=context.run_id,
                      tags={"ratchet.batch_id": s.batch_id}) as run:
        run.log_params({"paths": paths, "tenant_id": config.tenant_id, "consent_id": config.consent_id})
        run.log_metrics({k: getattr(s, k) for k in ("read", "accepted", "quarantined", "duplicates", "id_clashes")})
        run.log_dict(s.as_dict(), "ingest_summary.json")
        run.log_artifact(str(chart))
    store = warehouse.store()
    total, qtotal = store.count("trajectories"), store.count("quarantine")
    common = {"batch_id": s.batch_id, "read": s.read, "duplicates": s.duplicates,
              "mlflow_run": dg.MetadataValue.url(run.url), "mlflow_run_id": run.run_id,
              "chart": dg.MetadataValue.md(markdown_image(chart, "ingest outcome")),
              "chart_file": home.relative(chart)}
    yield dg.MaterializeResult(asset_key="trajectories", metadata={
        **common, "accepted": s.accepted, "dagster/row_count": total, "id_clashes": s.id_clashes, "rows_total": total,
        "attribution_conflicts": s.attribution_conflicts, "compacted_parts": s.compacted_parts,
        "by_format": dg.MetadataValue.json(s.by_format), "seconds": s.seconds})
    yield dg.MaterializeResult(asset_key="quarantine", metadata={
        **common, "quarantined": s.quarantined, "dagster/row_count": qtotal, "rows_total": qtotal,
        "reasons": dg.MetadataValue.md(_reasons_md(s.quarantine_reasons)),
        "skipped_files": s.skipped, "skip_reasons": dg.MetadataValue.json(s.skip_reasons),
        "superseded": s.superseded})


def _reasons_md(reasons: dict) -> str:
    if not reasons:
        return "no record quarantined"
    return md_table(["reason", "records"], [(f"`{k}`", v) for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])])


@dg.asset_check(asset=dg.AssetKey("trajectories"), blocking=True,
             description="Contract v1 expectations (great-expectations) over every stored trajectory.")
def trajectories_contract(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from ratchet.adapters import FORMATS
    from ratchet.validation import STORED_COLUMNS_SQL, validate_trajectories

    rep = validate_trajectories(warehouse.store().df(STORED_COLUMNS_SQL), FORMATS)
    return dg.AssetCheckResult(passed=rep.success, severity=dg.AssetCheckSeverity.ERROR, metadata={
        "rows": rep.rows, "expectations": len(rep.results), "failed": len(rep.failed),
        "results": dg.MetadataValue.json(rep.results)})


@dg.asset_check(asset=dg.AssetKey("quarantine"), blocking=False,
             description="Warns when the latest ingest quarantined more than 10% of what it read.")
def quarantine_rate(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from ratchet.validation import LAST_BATCH_SQL, UNEXPLAINED_QUARANTINE_SQL

    store = warehouse.store()
    last = store.read(LAST_BATCH_SQL)
    missing = store.scalar(UNEXPLAINED_QUARANTINE_SQL)
    row = last[0] if last else None
    rate = (row["quarantined"] / row["read"]) if row and row["read"] else 0.0
    return dg.AssetCheckResult(passed=rate <= 0.10 and missing == 0, severity=dg.AssetCheckSeverity.WARN,
                            metadata={"batch_id": row["batch_id"] if row else None, "rate": rate,
                                      "rows_without_reason_or_payload": missing})


defs = dg.Definitions(assets=[ingest_assets], asset_checks=[trajectories_contract, quarantine_rate])
