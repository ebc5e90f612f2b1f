"""Arrow -> DuckDB types and DDL (the one Arrow -> DuckDB DDL helper, and the `from_json`
structures the typed views use)."""
from __future__ import annotations

import pyarrow as pa


def duck_structure(t: pa.DataType):
    """DuckDB `from_json` structure for an Arrow type (used by the typed views)."""
    if pa.types.is_struct(t):
        return {f.name: duck_structure(f.type) for f in t}
    if pa.types.is_list(t):
        return [duck_structure(t.value_type)]
    return duck_type(t)


def duck_type(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ"
    return {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
            pa.bool_(): "BOOLEAN", pa.float64(): "DOUBLE", pa.binary(): "BLOB"}[t]


def duck_column_type(f: pa.Field) -> str:
    """DuckDB column type for an Arrow field: JSON for `format: json` metadata, T[] for a list."""
    if (f.metadata or {}).get(b"format") == b"json":
        return "JSON"
    if pa.types.is_list(f.type):
        return duck_column_type(pa.field(f.name, f.type.value_type)) + "[]"
    return duck_type(f.type)


def duck_ddl(name: str, schema: pa.Schema) -> str:
    """`CREATE TABLE IF NOT EXISTS` for an Arrow schema (the one Arrow -> DuckDB DDL helper)."""
    cols = ", ".join(f'"{f.name}" {duck_column_type(f)}' for f in schema)
    return f"CREATE TABLE IF NOT EXISTS {name} ({cols})"
