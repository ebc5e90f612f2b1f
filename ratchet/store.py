"""Table I/O for every stage: the store object assets get from the warehouse resource.

An asset reads through the store, calls the domain core, writes through the store, returns its
metadata; it never holds SQL or DELETEs of its own. Domain functions that must read and write in
one transaction (the holdout lock, checkpoint flags) take a connection and use the same
`insert` / `replace` / `fetch` helpers below.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping

import pyarrow as pa

from ratchet.tables import to_table

if TYPE_CHECKING:
    from ratchet.warehouse import Warehouse

Rows = Iterable[Mapping] | pa.Table


@contextmanager
def transaction(con):
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def insert(con, name: str, rows: Rows) -> int:
    tbl = to_table(name, rows)
    if tbl.num_rows:
        con.register("_store_rows", tbl)
        try:
            con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _store_rows")
        finally:
            con.unregister("_store_rows")
    return tbl.num_rows


def replace(con, name: str, rows: Rows, where: str | None = None, params: list | None = None) -> int:
    """Delete (all rows, or those matching `where`) and insert, in one transaction: readers see
    the old rows or the new ones, and a re-run with the same input leaves the same table."""
    tbl = to_table(name, rows)
    with transaction(con):
        con.execute(f"DELETE FROM {name}" + (f" WHERE {where}" if where else ""), params or [])
        insert(con, name, tbl)
    return tbl.num_rows


def fetch(con, sql: str, params: list | None = None) -> list[dict]:
    rel = con.execute(sql, params or [])
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r)) for r in rel.fetchall()]


class Store:
    """Short-lived, locked connections to one warehouse (see `Warehouse.connect`)."""

    def __init__(self, warehouse: "Warehouse"):
        self.warehouse = warehouse

    @contextmanager
    def connect(self) -> Iterator:
        with self.warehouse.connect() as con:
            yield con

    def read(self, sql: str, params: list | None = None) -> list[dict]:
        with self.connect() as con:
            return fetch(con, sql, params)

    def arrow(self, sql: str, params: list | None = None) -> pa.Table:
        with self.connect() as con:
            return con.sql(sql, params=params or None).to_arrow_table()

    def df(self, sql: str, params: list | None = None):
        with self.connect() as con:
            return con.execute(sql, params or []).df()

    def scalar(self, sql: str, params: list | None = None):
        with self.connect() as con:
            row = con.execute(sql, params or []).fetchone()
        return row[0] if row else None

    def count(self, table: str) -> int:
        return int(self.scalar(f"SELECT count(*) FROM {table}"))

    def insert(self, name: str, rows: Rows) -> int:
        with self.connect() as con:
            return insert(con, name, rows)

    def append(self, tables: Mapping[str, Rows]) -> dict[str, int]:
        """Insert into several tables in one transaction."""
        with self.connect() as con, transaction(con):
            return {name: insert(con, name, rows) for name, rows in tables.items()}

    def replace(self, name: str, rows: Rows, where: str | None = None, params: list | None = None) -> int:
        with self.connect() as con:
            return replace(con, name, rows, where, params)

    def replace_all(self, tables: Mapping[str, Rows]) -> dict[str, int]:
        """Replace several tables whole in one transaction (a reader never sees one new, one old)."""
        with self.connect() as con, transaction(con):
            out = {}
            for name, rows in tables.items():
                con.execute(f"DELETE FROM {name}")
                out[name] = insert(con, name, rows)
            return out
