"""The code location `workspace.yaml` loads. Keep imports light: no torch/mlflow/GX here."""
from dagster import Definitions

from assets.consent import checkpoint_flags, consent_grants, training_views, training_views_clean
from assets.ingest import ingest_assets, quarantine_rate, trajectories_contract
from assets.splits import contamination, dedup_clusters, holdout_manifest, split_assignments
from assets.tasks import task_suite
from resources import MlflowTracking, WarehouseResource

from .jobs import governance_job, ingest_job
from .sensors import landing_sensor

defs = Definitions(
    assets=[ingest_assets, task_suite, dedup_clusters, split_assignments, holdout_manifest,
            consent_grants, training_views, checkpoint_flags],
    asset_checks=[trajectories_contract, quarantine_rate, contamination, training_views_clean],
    jobs=[ingest_job, governance_job],
    sensors=[landing_sensor],
    resources={"warehouse": WarehouseResource(), "tracking": MlflowTracking()},
)
