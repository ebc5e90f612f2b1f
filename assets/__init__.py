"""The lifecycle graph: one module per stage, each exporting its `defs`; asset bodies are thin
wrappers over ratchet/. Shared here: owners per group and the column schema of a table."""
from __future__ import annotations

OWNERS = {
    "ingest": ["team:data-platform"],
    "tasks": ["team:data-platform"],
    "governance": ["team:governance"],
    "consent": ["team:governance"],
    "evaluation": ["team:ml-platform"],
    "training": ["team:ml-platform"],
    "promotion": ["team:release"],
}


def table_metadata(table: str) -> dict:
    """Definition-time metadata of a warehouse asset: its columns (`dagster/column_schema`, from
    the Arrow schema the table is created from) and the DuckDB table name."""
    import dagster as dg

    return {"dagster/column_schema": dg.TableSchema(columns=[
                dg.TableColumn(f.name, str(f.type), description=(f.metadata or {}).get(b"format", b"").decode() or None)
                for f in _arrow_schema(table)]),
            "dagster/table_name": f"warehouse.main.{table}"}


def _arrow_schema(table: str):
    from ratchet.warehouse import QUARANTINE_SCHEMA, STORED_SCHEMA

    if table == "trajectories":
        return STORED_SCHEMA
    if table == "quarantine":
        return QUARANTINE_SCHEMA
    from ratchet.tables import table_schema

    return table_schema(table)
