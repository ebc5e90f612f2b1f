"""The DuckDB warehouse: one file under RATCHET_HOME, every table and view analysts query.

Trajectories are the one large, append-only table: they live as a Parquet dataset beside the
DuckDB file (`lake/trajectories/*.parquet`, zstd parts) and `trajectories` is a DuckDB view over
the parts listed in the `lake_parts` table. A part on disk but not listed is invisible: an ingest
renames its parts into the lake and then, in one DuckDB transaction, lists them and inserts its
quarantine, `ingest_files` and `ingest_batches` rows, so a batch appears whole or not at all;
compaction swaps merged parts for their sources in one transaction the same way. Unlisted parts
and `.staging-*` folders left by a killed run are removed by the next ingest (`clean_debris`). Measured on 5.8 KB records: a native DuckDB insert
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
# Added after v1 (ALTER TABLE on existing warehouses): a truncated line later completed and accepted.
QUARANTINE_LATE_DDL = ("superseded_by VARCHAR", "superseded_at TIMESTAMPTZ")
INGEST_FILES_LATE_DDL = ("status VARCHAR", "skip_reason VARCHAR", "skip_detail VARCHAR", "compression VARCHAR",
                         "encoding VARCHAR",
                         "landing_file VARCHAR")   # path relative to the landing folder (ratchet.landing)
LAKE_PARTS_DDL = """
CREATE TABLE IF NOT EXISTS lake_parts (
  name VARCHAR PRIMARY KEY, batch_id VARCHAR, "rows" BIGINT, bytes BIGINT, added_at TIMESTAMPTZ)
"""

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
               any_value(reason) AS example, count(superseded_by) AS superseded
        FROM quarantine GROUP BY 1 ORDER BY 2 DESC""",
    "v_quarantine_open": "SELECT * FROM quarantine WHERE superseded_by IS NULL",
    "v_skipped_files": """
        SELECT batch_id, source_file, skip_reason, skip_detail FROM ingest_files WHERE status = 'skipped'""",
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

    def part_names(self, con=None) -> list[str]:
        with (self.connect() if con is None else _same(con)) as c:
            return [r[0] for r in c.execute("SELECT name FROM lake_parts ORDER BY name").fetchall()]

    def clean_debris(self) -> int:
        """Remove what a killed or failed run left in the lake: `.staging-*` folders, temp files
        and parts no `lake_parts` row lists. Call with the ingest lock held. Returns the count."""
        import shutil

        d = self.trajectory_dir
        if not d.exists():
            return 0
        listed = set(self.part_names())
        n = 0
        for p in d.iterdir():
            if p.name.startswith(".staging-") or p.name.startswith(".compact-") or p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                n += 1
            elif p.suffix == ".parquet" and p.name != "_empty.parquet" and p.name not in listed:
                p.unlink(missing_ok=True)
                n += 1
        return n

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

    def write_trajectories(self, table: pa.Table, name: str, listed: bool = True) -> Path:
        """Append one immutable Parquet part (temp file + rename: readers never see half a file)
        and list it in `lake_parts` (visible). Ingest stages and commits its parts instead."""
        self.trajectory_dir.mkdir(parents=True, exist_ok=True)
        final = self.trajectory_dir / f"{name}.parquet"
        tmp = final.with_name(f".{final.name}.tmp")
        write_part(table, tmp)
        os.replace(tmp, final)
        if listed:
            with self.connect() as con:
                con.execute("INSERT OR REPLACE INTO lake_parts VALUES (?, NULL, ?, ?, now())",
                            [final.name, table.num_rows, final.stat().st_size])
        return final

    def trajectory_ids(self) -> set[str]:
        """record_ids already stored (one column of the lake: ~1 s per million rows)."""
        import pyarrow.dataset as ds

        parts = [self.trajectory_dir / n for n in self.part_names()]
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
        """Create every table and analyst view (idempotent): ingest's here, the other layers' from
        their `tables` modules (ratchet.tables.LAYERS)."""
        with (self.connect() if con is None else _same(con)) as c:
            self.trajectory_dir.mkdir(parents=True, exist_ok=True)
            empty = self.trajectory_dir / "_empty.parquet"  # read_parquet needs one file to match
            if not empty.exists():
                self.write_trajectories(STORED_SCHEMA.empty_table(), "_empty", listed=False)
            glob = str(self.trajectory_dir / "*.parquet").replace("'", "''")
            fresh = not c.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'lake_parts'"
                                  ).fetchall()[0][0]
            c.execute(LAKE_PARTS_DDL)
            if fresh:  # a lake written before parts were listed: every part on disk is committed
                self._list_existing(c)
            # Only listed parts are visible (by file name, so the home folder can move).
            c.execute(f"""CREATE OR REPLACE VIEW trajectories AS
                SELECT * EXCLUDE (filename), count(*) OVER (PARTITION BY trajectory_id) > 1 AS id_clash
                FROM read_parquet('{glob}', filename = true)
                WHERE parse_filename(filename) IN (SELECT name FROM lake_parts)""")
            c.execute(duck_ddl("quarantine", QUARANTINE_SCHEMA))
            c.execute(INGEST_BATCHES_DDL)
            c.execute(INGEST_FILES_DDL)
            for col in QUARANTINE_LATE_DDL:
                c.execute(f"ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS {col}")
            for col in INGEST_FILES_LATE_DDL:
                c.execute(f"ALTER TABLE ingest_files ADD COLUMN IF NOT EXISTS {col}")
            for name, sql in VIEWS.items():
                c.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
            from ratchet.tables import ensure_all

            ensure_all(c)                 # every other layer's tables and views, declared once each

    def _list_existing(self, con) -> None:
        import pyarrow.parquet as pq

        for p in sorted(self.trajectory_dir.glob("*.parquet")):
            if p.name == "_empty.parquet":
                continue
            meta = pq.read_metadata(p)
            batch = p.name.split("-")[0] if len(p.name.split("-")[0]) == 32 else None
            con.execute("INSERT INTO lake_parts VALUES (?, ?, ?, ?, now()) ON CONFLICT DO NOTHING",
                        [p.name, batch, meta.num_rows, p.stat().st_size])

    def commit_batch(self, batch_id: str, parts: list[tuple[Path, int]], qparts: list[Path], batch_row: list,
                     file_rows: "pa.Table", summary_json=None) -> dict:
        """Make one ingest batch visible at once: rename its staged parts into the lake (unlisted,
        so invisible), then one transaction lists them and inserts the quarantine rows, the
        per-file rows and the batch row. A truncated line this batch completed is linked to its
        record (`quarantine.superseded_by`). Returns {"id_clashes", "superseded"}."""
        names = []
        for i, (p, rows) in enumerate(parts):
            name = f"{batch_id}-{i:05d}.parquet"
            os.replace(p, self.trajectory_dir / name)
            names.append((name, rows, (self.trajectory_dir / name).stat().st_size))
        qcols = ", ".join(f'"{f.name}"' for f in QUARANTINE_SCHEMA)
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                for name, rows, size in names:
                    con.execute("INSERT INTO lake_parts VALUES (?, ?, ?, ?, now())", [name, batch_id, rows, size])
                if qparts:
                    files = ", ".join("'" + str(q).replace("'", "''") + "'" for q in qparts)
                    con.execute(f"INSERT INTO quarantine ({qcols}) SELECT {qcols} FROM read_parquet([{files}])")
                clashes = superseded = 0
                if names:
                    clashes = con.execute("SELECT count(*) FROM trajectories WHERE batch_id = ? AND id_clash",
                                          [batch_id]).fetchall()[0][0]
                    superseded = con.execute("""
                        UPDATE quarantine q SET superseded_by = t.record_id, superseded_at = now()
                        FROM (SELECT record_id, source_file, source_line FROM trajectories WHERE batch_id = ?) t
                        WHERE q.source_file = t.source_file AND q.source_line = t.source_line
                          AND q.reason_code = 'truncated_json' AND q.superseded_by IS NULL""",
                                             [batch_id]).fetchall()[0][0]
                batch_row[12] = clashes
                if summary_json is not None:
                    batch_row[13] = summary_json({"id_clashes": clashes, "superseded": superseded})
                con.execute("INSERT INTO ingest_batches VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", batch_row)
                fr = file_rows  # noqa: F841  (read by DuckDB by name)
                cols = ", ".join(f'"{n}"' for n in file_rows.column_names)
                con.execute(f"INSERT INTO ingest_files ({cols}) SELECT {cols} FROM fr")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                for name, _, _ in names:
                    (self.trajectory_dir / name).unlink(missing_ok=True)
                raise
        return {"id_clashes": clashes, "superseded": superseded}

    def compact(self, small_bytes: int = 32 << 20, target_bytes: int = 128 << 20, min_parts: int = 2) -> dict:
        """Merge parts smaller than `small_bytes` into parts of about `target_bytes` (streamed: one
        source part in memory at a time), then swap them in one transaction. Call with the ingest
        lock held (`ratchet compact` and ingest do). Returns {"merged", "written"}."""
        import uuid

        import pyarrow.parquet as pq

        with self.connect() as con:
            small = con.execute('SELECT name, "rows", bytes FROM lake_parts WHERE bytes < ? ORDER BY name',
                                [small_bytes]).fetchall()
        if len(small) < min_parts:
            return {"merged": 0, "written": 0}
        cid = uuid.uuid4().hex[:12]
        tmpdir = self.trajectory_dir / f".compact-{cid}"
        tmpdir.mkdir(parents=True, exist_ok=True)
        out: list[tuple[Path, int]] = []
        writer, rows, written = None, 0, 0
        try:
            for name, _, _ in small:
                t = pq.read_table(self.trajectory_dir / name, schema=STORED_SCHEMA)
                if writer is None:
                    path = tmpdir / f"c{cid}-{len(out):05d}.parquet"
                    writer = pq.ParquetWriter(path, STORED_SCHEMA, compression="zstd", use_dictionary=_DICT_COLUMNS,
                                              write_statistics=[n for n in STORED_SCHEMA.names if n not in _LONG_COLUMNS])
                    out.append((path, 0))
                    rows = written = 0
                writer.write_table(t, row_group_size=16384)
                rows += t.num_rows
                written += (self.trajectory_dir / name).stat().st_size
                out[-1] = (out[-1][0], rows)
                if written >= target_bytes:
                    writer.close()
                    writer = None
            if writer is not None:
                writer.close()
            with self.connect() as con:
                for p, _ in out:
                    os.replace(p, self.trajectory_dir / p.name)
                con.execute("BEGIN TRANSACTION")
                try:
                    con.execute("DELETE FROM lake_parts WHERE name IN (SELECT unnest(?))", [[n for n, _, _ in small]])
                    for p, r in out:
                        con.execute("INSERT INTO lake_parts VALUES (?, NULL, ?, ?, now())",
                                    [p.name, r, (self.trajectory_dir / p.name).stat().st_size])
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    for p, _ in out:
                        (self.trajectory_dir / p.name).unlink(missing_ok=True)
                    raise
                for name, _, _ in small:  # unlisted now: invisible; removed while no reader can hold them
                    (self.trajectory_dir / name).unlink(missing_ok=True)
        finally:
            import shutil

            shutil.rmtree(tmpdir, ignore_errors=True)
        return {"merged": len(small), "written": len(out)}

    def query(self, sql: str, params: list | None = None) -> "pa.Table":
        with self.connect() as con:
            return con.sql(sql, params=params or None).to_arrow_table()

    def store(self) -> "Store":  # noqa: F821
        from ratchet.store import Store

        return Store(self)

    def exists(self) -> bool:
        return self.path.exists()


@contextmanager
def _same(con):
    yield con
