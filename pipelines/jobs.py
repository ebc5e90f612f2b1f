"""Named jobs (runs show a name and tags in the UI, never the anonymous __ASSET_JOB)."""
from dagster import AssetSelection, define_asset_job

ingest_job = define_asset_job("ingest_job", selection=AssetSelection.groups("ingest"),
                              description="Ingest the landing folder (or the configured paths).")

governance_job = define_asset_job(
    "governance_job", selection=AssetSelection.groups("tasks", "governance", "consent"),
    description="Task suite, dedup clusters, locked splits (contamination gate), consent training views.")

# Everything up to the evaluation that is not partitioned: what `make demo` and a cycle run first.
LIFECYCLE_SELECTION = AssetSelection.groups("ingest", "tasks", "governance", "consent") | AssetSelection.assets(
    "judge_calibration")
lifecycle_job = define_asset_job(
    "lifecycle_job", selection=LIFECYCLE_SELECTION,
    tags={"ratchet/stage": "lifecycle"},
    description="Ingest -> task suite -> dedup -> locked splits (contamination gate) -> consent -> judge calibration.")
