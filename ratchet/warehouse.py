"""The DuckDB warehouse: one file under RATCHET_HOME, every table and view analysts query.

Trajectories are the one large, append-only table: they live as a Parquet dataset beside the
DuckDB file (`lake/trajectories/*.parquet`, one zstd part per ingest chunk, written atomically)
and `trajectories` is a DuckDB view over it. Measured on 5.8 KB records: a native DuckDB insert
plus checkpoint cost ~45-60 us/row, a zstd Parquet part ~12 us/row at a third of the size.
Every other table is a native DuckDB table.

DuckDB allows one writing process per file; a second process that opens it fails instead of
waiting. `Warehouse.connect()` therefore serialises every connection through an exclusive
`flock` on a sidecar lock file, so two runs (a sensor-launched ingest and a CLI query, two
Dagster steps) queue instead of corrupting or crashing each other. Connections are short-lived.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import orjson
import pyarrow as pa

from ratchet.contract import APPROVAL, MESSAGE, TRAJECTORY_SCHEMA, duck_ddl, duck_structure

# What is stored: `id_clash` is derived by the view (same trajectory_id, other content).
STORED_SCHEMA = pa.schema([f for f in TRAJECTORY_SCHEMA if f.name != "id_clash"])

QUARANTINE_SCHEMA = pa.schema([
    pa.field("quarantine_id", pa.string(), nullable=False),  # sha256(file, line, raw payload)
    pa.field("source_file", pa.string()),
    pa.field("source_line", pa.int64()),     # 1-based line (JSONL), element index (JSON array), row (Parquet)
    pa.field("byte_offset", pa.int64()),
    pa.field("detected_format", pa.string()),
    pa.field("reason_code", pa.string()),
    pa.field("reason", pa.string()),
    pa.field("raw", pa.binary()),            # the payload exactly as read (bytes: invalid UTF-8 survives)
    pa.field("raw_sha256", pa.string()),
    pa.field("raw_bytes", pa.int64()),
    pa.field("batch_id", pa.string()),
    pa.field("quarantined_at", pa.timestamp("us", tz="UTC")),
])

INGEST_BATCHES_DDL = """
CREATE TABLE IF NOT EXISTS ingest_batches (
  batch_id VARCHAR PRIMARY KEY, origin VARCHAR, dagster_run_id VARCHAR,
  started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, paths VARCHAR[], tenant_id VARCHAR,
  consent_id VARCHAR, "read" BIGINT, accepted BIGINT, quarantined BIGINT, duplicates BIGINT,
  id_clashes BIGINT, summary JSON)
"""
INGEST_FILES_DDL = """
CREATE TABLE IF NOT EXISTS ingest_files (
  batch_id VARCHAR, source_file VARCHAR, size_bytes BIGINT, mtime_ns BIGINT, sha256 VARCHAR,
  "read" BIGINT, accepted BIGINT, quarantined BIGINT, duplicates BIGINT)
"""
_MSG = orjson.dumps(duck_structure(pa.list_(MESSAGE))).decode()
_APPROVAL = orjson.dumps(duck_structure(pa.list_(APPROVAL))).decode()
_MSG_COLS = ", ".join(f"m.{f.name} AS {f.name}" for f in MESSAGE)
VIEWS = {
    "v_quarantine_reasons": """
        SELECT reason_code, count(*) AS records, count(DISTINCT source_file) AS files,
               any_value(reason) AS example FROM quarantine GROUP BY 1 ORDER BY 2 DESC""",
    "v_trajectories_by_format": """
        SELECT source_format, count(*) AS trajectories, avg(n_turns) AS mean_turns,
               avg(n_tool_calls) AS mean_tool_calls, sum(cost_usd) AS cost_usd
        FROM trajectories GROUP BY 1 ORDER BY 2 DESC""",
    # One typed row per message / tool call / approval (from_json with the contract's shapes).
    "v_messages": f"""
        SELECT record_id, trajectory_id, tenant_id, task_id, idx, {_MSG_COLS} FROM (
          SELECT record_id, trajectory_id, tenant_id, task_id,
                 generate_subscripts(ms, 1) - 1 AS idx, unnest(ms) AS m
          FROM (SELECT *, from_json(messages, '{_MSG}') AS ms FROM trajectories))""",
    "v_tool_calls": """
        SELECT m.record_id, m.trajectory_id, m.tenant_id, m.idx, c.id AS call_id,
               c.function.name AS tool, c.function.arguments AS arguments
        FROM v_messages m, unnest(m.tool_calls) AS v(c)""",
    "v_approvals": f"""
        SELECT t.record_id, t.trajectory_id, t.tenant_id, a.*
        FROM trajectories t, unnest(from_json(t.approvals, '{_APPROVAL}')) AS u(a)""",
    "v_id_clashes": """
        SELECT trajectory_id, count(*) AS versions, list(record_id) AS record_ids,
               list(source_file) AS files FROM trajectories WHERE id_clash GROUP BY 1""",
}


# Dictionary encoding only where values repeat, min/max statistics only on short columns: on
# 5.7 KiB records this cut the Parquet write from 13.9 to 12.8 us/record at the same size (zstd).
_DICT_COLUMNS = ["schema_version", "source_format", "tenant_id", "consent_id", "repo", "agent_id",
                 "environment_id", "environment_digest", "tools", "source_file", "batch_id"]
_LONG_COLUMNS = {"messages", "tools", "approvals", "patch", "prompt_text", "extra"}


def write_part(table: pa.Table, path: Path) -> None:
    """Write trajectory rows as one zstd Parquet part in the stored schema."""
    import pyarrow.parquet as pq

    table = table.select(STORED_SCHEMA.names)
    if not table.schema.equals(STORED_SCHEMA, check_metadata=True):
        table = table.cast(STORED_SCHEMA)  # (imports pyarrow.compute: ~0.1 s, so only when needed)
    pq.write_table(table, path, compression="zstd",
                   use_dictionary=_DICT_COLUMNS,
                   write_statistics=[n for n in STORED_SCHEMA.names if n not in _LONG_COLUMNS])


class WarehouseLockTimeout(TimeoutError):
    pass


class Warehouse:
    def __init__(self, path: str | os.PathLike, lock_timeout_s: float = 600.0):
        self.path = Path(path)
        self.lake = self.path.parent / "lake"
        self.lock_timeout_s = lock_timeout_s
        self._local = threading.local()

    @property
    def trajectory_dir(self) -> Path:
        return self.lake / "trajectories"

    @contextmanager
    def ingest_lock(self) -> Iterator[None]:
        """Ingests run one at a time (each dedups against what the last one wrote); queries don't wait."""
        self.trajectory_dir.mkdir(parents=True, exist_ok=True)
        with open(self.lake / ".ingest.lock", "a+") as lock:
            self._acquire(lock)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def write_trajectories(self, table: pa.Table, name: str) -> Path:
        """Append one immutable Parquet part (temp file + rename: readers never see half a file)."""
        self.trajectory_dir.mkdir(parents=True, exist_ok=True)
        final = self.trajectory_dir / f"{name}.parquet"
        tmp = final.with_name(f".{final.name}.tmp")
        write_part(table, tmp)
        os.replace(tmp, final)
        return final

    def trajectory_ids(self) -> set[str]:
        """record_ids already stored (one column of the lake: ~1 s per million rows)."""
        import pyarrow.dataset as ds

        parts = sorted(self.trajectory_dir.glob("*.parquet"))
        if not parts:
            return set()
        return set(ds.dataset(parts, format="parquet").to_table(columns=["record_id"]).column(0).to_pylist())

    @contextmanager
    def connect(self) -> Iterator["duckdb.DuckDBPyConnection"]:  # noqa: F821
        """An exclusive, short-lived connection. Re-entrant within one thread."""
        import duckdb

        held = getattr(self._local, "con", None)
        if held is not None:
            yield held
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{self.path}.lock", "a+")
        try:
            self._acquire(lock)
            con = duckdb.connect(str(self.path))
            self._local.con = con
            try:
                yield con
            finally:
                self._local.con = None
                con.close()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()

    def _acquire(self, lock) -> None:
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock.seek(0)
                lock.truncate()
                lock.write(str(os.getpid()))
                lock.flush()
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    raise WarehouseLockTimeout(
                        f"warehouse {self.path} is locked by pid {lock.read().strip() or '?'} "
                        f"for more than {self.lock_timeout_s:.0f} s") from None
                time.sleep(0.05)

    def ensure_schema(self, con=None) -> None:
        """Create the ingest tables and analyst views (idempotent). Other stages add their own."""
        with (self.connect() if con is None else _same(con)) as c:
            self.trajectory_dir.mkdir(parents=True, exist_ok=True)
            empty = self.trajectory_dir / "_empty.parquet"  # read_parquet needs one file to match
            if not empty.exists():
                self.write_trajectories(STORED_SCHEMA.empty_table(), "_empty")
            glob = str(self.trajectory_dir / "*.parquet").replace("'", "''")
            c.execute(f"""CREATE OR REPLACE VIEW trajectories AS
                SELECT * EXCLUDE (filename), count(*) OVER (PARTITION BY trajectory_id) > 1 AS id_clash
                FROM read_parquet('{glob}', filename = true)""")
            c.execute(duck_ddl("quarantine", QUARANTINE_SCHEMA))
            c.execute(INGEST_BATCHES_DDL)
            c.execute(INGEST_FILES_DDL)
            for name, sql in VIEWS.items():
                c.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")

    def query(self, sql: str, params: list | None = None) -> "pa.Table":
        with self.connect() as con:
            return con.sql(sql, params=params or None).to_arrow_table()

    def exists(self) -> bool:
        return self.path.exists()


@contextmanager
def _same(con):
    yield con
