from dagster import AssetSelection, define_asset_job

ingest_job = define_asset_job("ingest_job", selection=AssetSelection.groups("ingest"),
                              description="Ingest the landing folder (or the configured paths).")

governance_job = define_asset_job(
    "governance_job", selection=AssetSelection.groups("tasks", "governance", "consent"),
    description="Task suite, dedup clusters, locked splits (contamination gate), consent training views.")
