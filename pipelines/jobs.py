from dagster import AssetSelection, define_asset_job

ingest_job = define_asset_job("ingest_job", selection=AssetSelection.groups("ingest"),
                              description="Ingest the landing folder (or the configured paths).")
