"""The code location `workspace.yaml` loads: each assets/ module exports its layer's `defs`, merged
here with the jobs, sensors and resources. Keep imports light: no torch/mlflow/GX here."""
from dagster import Definitions

from assets import consent, evaluation, ingest, promotion, splits, tasks, training
from resources import MlflowTracking, WarehouseResource

from . import cycle
from .jobs import governance_job, ingest_job, lifecycle_job
from .sensors import landing_sensor

LAYERS = (ingest.defs, tasks.defs, splits.defs, consent.defs, training.defs, evaluation.defs, promotion.defs)

defs = Definitions.merge(
    *LAYERS, cycle.defs,
    Definitions(jobs=[ingest_job, governance_job, lifecycle_job], sensors=[landing_sensor],
                resources={"warehouse": WarehouseResource(), "tracking": MlflowTracking()}),
)
