"""Every warehouse table outside ingest, by layer: each layer's `tables` module declares Arrow
schemas (`SCHEMAS`) and analyst views (`VIEWS`); DDL and row coercion derive from the schemas,
so a column is declared once. `Warehouse.ensure_schema` creates all of them, in LAYERS order
(a later layer's views may read an earlier layer's tables)."""
from __future__ import annotations

import importlib
import json
from typing import Iterable, Mapping

import pyarrow as pa

JSON = {"format": "json"}                # a VARCHAR column holding JSON (dicts / lists are dumped)
TS = pa.timestamp("us", tz="UTC")
STR_LIST = pa.list_(pa.string())

LAYERS = ("ratchet.governance.tables", "ratchet.evaluation.tables", "ratchet.promotion.tables",
          "ratchet.analyst_views")


def schema(*fields) -> pa.Schema:
    """(name, type[, metadata]) triples -> an Arrow schema."""
    return pa.schema([pa.field(n, t, metadata=m[0] if m else None) for n, t, *m in fields])


def _layers():
    return [importlib.import_module(m) for m in LAYERS]


def schemas() -> dict[str, pa.Schema]:
    out: dict[str, pa.Schema] = {}
    for layer in _layers():
        clash = out.keys() & layer.SCHEMAS.keys()
        if clash:
            raise ValueError(f"{layer.__name__} redeclares tables {sorted(clash)}")
        out.update(layer.SCHEMAS)
    return out


def table_schema(name: str) -> pa.Schema:
    try:
        return schemas()[name]
    except KeyError:
        raise KeyError(f"no warehouse table named {name!r} is declared in {', '.join(LAYERS)}") from None


def ddl(name: str) -> str:
    from ratchet.contract import duck_ddl

    return duck_ddl(name, table_schema(name))


def add_missing_columns(con, name: str) -> list[str]:
    """ALTER TABLE ADD the declared columns an older warehouse's table lacks (appended, NULL in
    old rows; writes go BY NAME): a column added to a layer's schema reaches existing homes."""
    from ratchet.contract.ddl import duck_column_type

    have = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                                      [name]).fetchall()}
    added = [f for f in table_schema(name) if f.name not in have]
    for f in added:
        con.execute(f'ALTER TABLE {name} ADD COLUMN IF NOT EXISTS "{f.name}" {duck_column_type(f)}')
    return [f.name for f in added]


def ensure_all(con) -> None:
    """CREATE TABLE IF NOT EXISTS every declared table (adding columns declared since it was
    created), then (re)create the views."""
    layers = _layers()
    for layer in layers:
        for name in layer.SCHEMAS:
            con.execute(ddl(name))
            add_missing_columns(con, name)
        for sql in getattr(layer, "INDEXES", {}).values():
            con.execute(sql)
    for layer in layers:
        for name, sql in getattr(layer, "VIEWS", {}).items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def to_table(name: str, rows: Iterable[Mapping] | pa.Table) -> pa.Table:
    """Rows (dicts, extra keys ignored) -> an Arrow table with the table's exact schema."""
    sch = table_schema(name)
    if isinstance(rows, pa.Table):
        return rows.select(sch.names).cast(sch)
    cols: dict[str, list] = {n: [] for n in sch.names}
    for r in rows:
        for n in sch.names:
            v = r.get(n)
            if v is not None and (sch.field(n).metadata or {}).get(b"format") == b"json" and not isinstance(v, str):
                v = json.dumps(v, sort_keys=True, default=str)
            cols[n].append(v)
    return pa.table({n: pa.array(cols[n], sch.field(n).type) for n in sch.names}, schema=sch)
