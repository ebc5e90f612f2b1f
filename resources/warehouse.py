"""The DuckDB warehouse as a Dagster resource (the logic lives in ratchet.warehouse)."""
from __future__ import annotations

from dagster import ConfigurableResource

from ratchet.home import get_home
from ratchet.store import Store
from ratchet.warehouse import Warehouse


class WarehouseResource(ConfigurableResource):
    """DuckDB file under RATCHET_HOME. Writes are serialised by a file lock: two runs queue."""

    home: str | None = None           # default: RATCHET_HOME, else ./.ratchet
    lock_timeout_s: float = 600.0

    def get(self) -> Warehouse:
        wh = Warehouse(get_home(self.home).warehouse, lock_timeout_s=self.lock_timeout_s)
        wh.ensure_schema()
        return wh

    def store(self) -> Store:
        """Table I/O for an asset body (the schema is ensured once, here)."""
        return Store(self.get())
