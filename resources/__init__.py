"""Dagster ConfigurableResources: thin, typed wrappers over the Dagster-free core."""
from .tracking import MlflowTracking
from .warehouse import WarehouseResource

__all__ = ["MlflowTracking", "WarehouseResource"]
