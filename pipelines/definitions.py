"""The code location `workspace.yaml` loads. Keep imports light: no torch/mlflow/GX here."""
from dagster import Definitions

from assets.ingest import ingest_assets, quarantine_rate, trajectories_contract
from resources import MlflowTracking, WarehouseResource

from .jobs import ingest_job
from .sensors import landing_sensor

defs = Definitions(
    assets=[ingest_assets],
    asset_checks=[trajectories_contract, quarantine_rate],
    jobs=[ingest_job],
    sensors=[landing_sensor],
    resources={"warehouse": WarehouseResource(), "tracking": MlflowTracking()},
)
