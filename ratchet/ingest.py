"""Ingest: files in, `trajectories` and `quarantine` rows out, nothing lost.

Every record read ends in exactly one of: accepted (a new `trajectories` row), quarantined (a
`quarantine` row with the raw payload, file, line and reason) or duplicate (its content is
already in the warehouse, or earlier in the same batch). So `read == accepted + quarantined +
duplicates` for every ingest, and re-ingesting a file adds nothing: ids are content hashes.
"""
from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterable, Iterator

import orjson
import pyarrow as pa

from ratchet import adapters
from ratchet.adapters import swebench
from ratchet.contract import CONTENT_NAMES, RecordError, normalise
from ratchet.native import fast_values
from ratchet.readers import Raw, discover, read_any, sidecar_for
from ratchet.warehouse import QUARANTINE_SCHEMA, STORED_SCHEMA, Warehouse

DEFAULT_MAX_RECORD_MB = 32.0
CHUNK_ROWS = 4096
CHUNK_BYTES = 64 << 20
PARALLEL_MIN_BYTES = 64 << 20   # below this a spawned pool costs more than it saves
RANGE_BYTES = 8 << 20           # one worker task: ~1.4k records of 5.8 KB


@dataclass
class IngestOptions:
    tenant_id: str | None = None      # batch attribution for records that carry none
    consent_id: str | None = None
    max_record_mb: float = DEFAULT_MAX_RECORD_MB
    origin: str = "cli"               # cli | dagster | sensor | bench
    workers: int = 0                  # normalising processes for large inputs; 0 = one per core
    dagster_run_id: str | None = None


@dataclass
class IngestSummary:
    batch_id: str
    read: int = 0
    accepted: int = 0
    quarantined: int = 0
    duplicates: int = 0
    id_clashes: int = 0               # accepted records whose trajectory_id already had other content
    files: int = 0
    reports_joined: int = 0
    fast_path: int = 0                # accepted or duplicate records decoded by the typed fast path
    by_format: dict = field(default_factory=dict)
    quarantine_reasons: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def consistent(self) -> bool:
        return self.read == self.accepted + self.quarantined + self.duplicates


@dataclass
class _FileContext:
    """What a worker needs to normalise one file's records (picklable)."""
    file: Path
    attribution: dict
    max_bytes: int
    reports: dict
    batch_id: str
    now: datetime


@dataclass
class _ChunkResult:
    n_read: int = 0
    table: pa.Table | None = None                # STORED_SCHEMA rows (inline path)
    staged: Path | None = None                   # ...or a Parquet part a worker wrote (parallel path)
    ids: list | None = None                      # record_ids of the staged part, in order
    bad: list = field(default_factory=list)      # (Raw, code, detail, format)
    formats: Counter = field(default_factory=Counter)
    reports_joined: int = 0
    fast: int = 0                                # rows that took the typed fast path


def _normalise_chunk(items: list, ctx: _FileContext, nul_free: bool = False) -> _ChunkResult:
    """Decode, detect, adapt and validate a chunk of records from one file. Pure: runs in worker
    processes. Items are `Raw`s, or (payload, line, byte offset) tuples for the lines of a JSONL
    range: a `Raw` is only built for a line that leaves the fast path. `nul_free`: the caller
    found no NUL byte or `\\u0000` in the whole range, so lines need no search of their own."""
    import gc

    gc_was = gc.isenabled()
    gc.disable()  # millions of short-lived dicts: the cyclic GC alone cost ~3x in loads (measured)
    try:
        rows, lines, res = [], [], _ChunkResult(n_read=len(items))
        fast, attribution, max_bytes, fname = fast_values, ctx.attribution, ctx.max_bytes, str(ctx.file)
        for it in items:
            if type(it) is tuple:
                raw, (p, line, offset) = None, it
            else:
                raw, p, line = it, it.payload, it.line
            if (raw is None or (raw.obj is None and raw.error is None)) and len(p) <= max_bytes and (nul_free or (
                    b"\x00" not in p and (b"\\u0000" not in p or not _NUL_ESCAPE.search(p)))):
                values = fast(p, attribution)
                if values is not None:  # a well-formed native record: one typed decode, no detour
                    rows.append(values)
                    lines.append(line)
                    continue
            if raw is None:
                raw = Raw(fname, line, offset, p)
            fmt = None
            try:
                obj = _decode(raw, max_bytes)
                fmt = adapters.detect(obj)
                native = adapters.to_native(fmt, obj, ctx.file, ctx.reports)
                if fmt == swebench.NAME and native["extra"]["report"]["found"]:
                    res.reports_joined += 1
                for k in ("tenant_id", "consent_id"):  # the record's own value wins over the batch's
                    if not native.get(k) and attribution.get(k):
                        native = {**native, k: attribution[k]}
                row = normalise(native, fmt, allow_empty_messages=fmt == swebench.NAME)
            except RecordError as e:
                res.bad.append((raw, e.code, e.detail, fmt))
                continue
            except RecursionError:
                res.bad.append((raw, "too_deep", "the record nests too deeply to read", fmt))
                continue
            except Exception as e:  # noqa: BLE001  (an adapter bug must not lose the batch: quarantine, say what)
                res.bad.append((raw, "unexpected_error", f"{type(e).__name__}: {e}"[:500], fmt))
                continue
            res.formats[fmt] += 1
            rows.append(_as_values(row))
            lines.append(line)
        res.fast = len(rows) - sum(res.formats.values())
        res.formats[adapters.NATIVE] += res.fast
        res.table = _table(rows, lines, ctx)
        return res
    finally:
        if gc_was:
            gc.enable()


_as_values = itemgetter(*CONTENT_NAMES)  # a normalised row dict as a tuple in column order


def _table(rows: list[tuple], lines: list[int], ctx: _FileContext) -> pa.Table:
    """Value tuples (CONTENT_NAMES order) to a table in the stored schema, column by column:
    transposing tuples with zip and converting whole columns cost ~40% less than from_pylist."""
    n, field = len(rows), STORED_SCHEMA.field
    columns = list(zip(*rows)) if rows else [()] * len(CONTENT_NAMES)
    cols = [pa.array(c, type=field(k).type) for k, c in zip(CONTENT_NAMES, columns)]
    cols += [pa.array([str(ctx.file)] * n, pa.string()), pa.array(lines, pa.int64()),
             pa.array([ctx.batch_id] * n, pa.string()), pa.array([ctx.now] * n, field("ingested_at").type)]
    return pa.Table.from_arrays(cols, schema=STORED_SCHEMA)


def _normalise_range(path: Path, start: int, end: int, first_line: int, ctx: _FileContext,
                     staged: Path) -> _ChunkResult:
    """Worker: read one newline-aligned byte range of a JSONL file, normalise it and write the
    rows as a staged Parquet part. Only ids and bad records travel back to the parent."""
    from ratchet.readers import range_lines
    from ratchet.warehouse import write_part

    lines, nul_free = range_lines(path, start, end, first_line)
    res = _normalise_chunk(lines, ctx, nul_free)
    table, res.table = res.table, None
    res.ids = table.column("record_id").to_pylist()
    if res.ids:
        write_part(table, staged)
        res.staged = staged
    return res


class _Writer:
    """Dedups chunks against the batch and the warehouse, writes them, keeps the counts."""

    def __init__(self, wh: Warehouse, summary: IngestSummary, now: datetime):
        self.wh, self.s, self.now = wh, summary, now
        self.seen: set[str] = wh.trajectory_ids()
        with wh.connect() as con:
            self.seen.update(r[0] for r in con.execute("SELECT quarantine_id FROM quarantine").fetchall())
        self.per_file: Counter = Counter()
        self.qrows: list[dict] = []
        self.qbytes = 0
        self.parts = 0

    def _bump(self, key: str, n: int) -> None:
        setattr(self.s, key, getattr(self.s, key) + n)
        self.per_file[key] += n

    def write(self, res: _ChunkResult) -> None:
        self._bump("read", res.n_read)
        self.s.reports_joined += res.reports_joined
        self.s.fast_path += res.fast
        for fmt, n in res.formats.items():
            self.s.by_format[fmt] = self.s.by_format.get(fmt, 0) + n
        seen = self.seen
        ids = res.ids if res.ids is not None else res.table.column("record_id").to_pylist()
        if seen.isdisjoint(ids) and len(set(ids)) == len(ids):  # the common case, in C
            seen.update(ids)
            keep, n_new = None, len(ids)
        else:
            keep = [i not in seen and not seen.add(i) for i in ids]  # first copy wins
            n_new = sum(keep)
        self._bump("duplicates", len(ids) - n_new)
        name = f"{self.s.batch_id}-{self.parts:05d}"
        if n_new and res.staged is not None and n_new == len(ids):
            os.replace(res.staged, self.wh.trajectory_dir / f"{name}.parquet")  # the common case: no copy
        elif n_new:
            import pyarrow.parquet as pq

            table = res.table if res.table is not None else pq.read_table(res.staged)
            self.wh.write_trajectories(table.filter(pa.array(keep)) if n_new < len(ids) else table, name)
        if res.staged is not None and res.staged.exists():
            res.staged.unlink()
        if n_new:
            self.parts += 1
            self._bump("accepted", n_new)
        for raw, code, detail, fmt in res.bad:
            self.s.quarantine_reasons[code] = self.s.quarantine_reasons.get(code, 0) + 1
            sha = hashlib.sha256(raw.payload).hexdigest()
            qid = hashlib.sha256(f"{raw.file}\0{raw.line}\0{sha}".encode()).hexdigest()
            if qid in seen:
                self._bump("duplicates", 1)
                continue
            seen.add(qid)
            self._bump("quarantined", 1)
            self.qrows.append({
                "quarantine_id": qid, "source_file": raw.file, "source_line": raw.line,
                "byte_offset": raw.offset, "detected_format": fmt, "reason_code": code, "reason": detail,
                "raw": raw.payload, "raw_sha256": sha, "raw_bytes": len(raw.payload),
                "batch_id": self.s.batch_id, "quarantined_at": self.now})
            self.qbytes += len(raw.payload)
        if len(self.qrows) >= 1024 or self.qbytes >= 64 << 20:
            self.flush()

    def flush(self) -> None:
        if self.qrows:
            q = pa.Table.from_pylist(self.qrows, schema=QUARANTINE_SCHEMA)  # noqa: F841
            with self.wh.connect() as con:
                con.execute("INSERT INTO quarantine SELECT * FROM q")
            self.qrows, self.qbytes = [], 0


# `\u0000` escapes a NUL only after an even number of backslashes: `\\u0000` is the text \u0000.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _decode(raw: Raw, max_bytes: int):
    """Decoded object, or raise RecordError with a precise reason."""
    if raw.error:
        raise RecordError(*raw.error)
    if len(raw.payload) > max_bytes:
        raise RecordError("record_too_large", f"{len(raw.payload) / 2**20:.1f} MiB exceeds the "
                          f"{max_bytes / 2**20:.0f} MiB limit (raise max_record_mb to accept it)")
    if b"\x00" in raw.payload or (b"\\u0000" in raw.payload and _NUL_ESCAPE.search(raw.payload)):
        raise RecordError("nul_byte", "the record contains a NUL byte (raw or \\u0000-escaped)")
    if raw.obj is not None:
        return raw.obj
    try:
        return orjson.loads(raw.payload)
    except orjson.JSONDecodeError as e:
        try:
            raw.payload.decode("utf-8")
        except UnicodeDecodeError as u:
            raise RecordError("invalid_utf8", f"byte {u.start}: {u.reason}") from None
        msg = str(e)
        truncated = "EOF" in msg or "end of" in msg.lower()
        raise RecordError("truncated_json" if truncated else "invalid_json", msg) from None


def _collect_reports(files: list[tuple[Path, Path]]) -> tuple[dict, set[Path]]:
    """SWE-bench reports among the inputs are side inputs for the predictions they describe."""
    reports: dict = {}
    used: set[Path] = set()
    for f, _ in files:
        if f.suffix.lower() != ".json" or f.stat().st_size > 256 << 20:
            continue
        try:
            entries = swebench.report_entries(orjson.loads(f.read_bytes()))
        except orjson.JSONDecodeError:
            continue
        if entries is not None:
            reports.update(entries)
            used.add(f)
    return reports, used


def _reports_near(files: Iterable[Path], reports: dict) -> None:
    """Predictions whose reports were not given: look for `report.json` beside them."""
    for d in {f.parent for f in files}:
        for rp in sorted(d.rglob("report.json"))[:100_000]:
            try:
                entries = swebench.report_entries(orjson.loads(rp.read_bytes()))
            except (orjson.JSONDecodeError, OSError):
                continue
            for k, v in (entries or {}).items():
                reports.setdefault(k, v)


def _chunks(items: Iterable[Raw], rows: int, max_bytes: int) -> Iterable[list[Raw]]:
    chunk, size = [], 0
    for raw in items:
        chunk.append(raw)
        size += len(raw.payload)
        if len(chunk) >= rows or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def ingest(paths: list[str | os.PathLike], warehouse: Warehouse, options: IngestOptions | None = None,
           progress: Callable[[int, int], None] | bool = False) -> IngestSummary:
    """Ingest files and folders into the warehouse; returns the batch summary.

    Large inputs are normalised by `workers` processes (default: one per core) while this process
    writes; small ones inline (a spawned worker costs ~0.5 s to start). Ingests are serialised."""
    import time

    t0 = time.perf_counter()
    opts = options or IngestOptions()
    files = discover(paths)
    workers = opts.workers or os.cpu_count() or 1
    pool = None
    if workers > 1 and any(f.stat().st_size >= PARALLEL_MIN_BYTES for f, _ in files):
        import multiprocessing as mp

        # spawn: forking a threaded Dagster/DuckDB process is unsafe. Started first and warmed up
        # (imports) while this process opens the warehouse and reads the ids already stored.
        pool = mp.get_context("spawn").Pool(workers, initializer=_worker_init)
    try:
        warehouse.ensure_schema()
        with warehouse.ingest_lock():
            return _ingest(files, paths, warehouse, opts, progress, pool, workers, t0)
    finally:
        if pool is not None:
            pool.terminate()


def _ingest(files, paths, warehouse: Warehouse, opts: IngestOptions, progress, pool, workers: int,
            t0: float) -> IngestSummary:
    import time

    from tqdm import tqdm

    now = datetime.now(timezone.utc)
    summary = IngestSummary(batch_id=uuid.uuid4().hex)
    staging = warehouse.trajectory_dir / f".staging-{summary.batch_id}"
    if pool is not None:
        staging.mkdir(parents=True, exist_ok=True)
    reports, report_files = _collect_reports(files)
    files = [(f, r) for f, r in files if f not in report_files]
    summary.files = len(files)
    writer = _Writer(warehouse, summary, now)
    max_bytes = int(opts.max_record_mb * 2**20)
    total = sum(f.stat().st_size for f, _ in files)
    from concurrent.futures import ThreadPoolExecutor

    hasher = ThreadPoolExecutor(1)  # file digests overlap the parsing (hashlib releases the GIL)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="ingest", disable=progress is not True)
    file_rows = []
    try:
        for f, root in files:
            writer.per_file = Counter()
            side = sidecar_for(f, root)
            attribution = {k: getattr(opts, k) or side.get(k) for k in ("tenant_id", "consent_id")}
            if f.suffix.lower() in (".jsonl", ".ndjson", ".json") and _has_predictions(f):
                _reports_near([f], reports)
            ctx = _FileContext(f, attribution, max_bytes, reports, summary.batch_id, now)
            if pool is not None and f.suffix.lower() in (".jsonl", ".ndjson") and f.stat().st_size >= PARALLEL_MIN_BYTES:
                sha = hashlib.sha256()  # fed by the range splitter, which reads the file anyway
                digest = sha.hexdigest
                results = _parallel_ranges(pool, f, ctx, staging, workers, sha)
            else:
                digest = hasher.submit(_file_sha, f).result
                results = (_normalise_chunk(c, ctx) for c in _chunks(read_any(f), CHUNK_ROWS, CHUNK_BYTES))
            for res in results:
                writer.write(res)
            writer.flush()
            st = f.stat()
            file_rows.append((f, st, writer.per_file.copy(), digest()))
            bar.update(st.st_size)
            if callable(progress):
                progress(bar.n, total)
    finally:
        bar.close()
        hasher.shutdown(wait=True)
        if pool is not None:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    summary.id_clashes = _count_clashes(warehouse, summary.batch_id) if summary.accepted else 0
    summary.seconds = round(time.perf_counter() - t0, 3)
    _record_batch(warehouse, summary, opts, [str(p) for p in paths], now, file_rows)
    if not summary.consistent:  # never silently: the invariant is the product's promise
        raise RuntimeError(f"ingest invariant read == accepted + quarantined + duplicates broken: {summary.as_dict()}")
    return summary


class _NoPandas:
    """Import finder that refuses pandas (installed in ingest workers only)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is not imported in ingest workers")
        return None


def _worker_init() -> None:
    """Runs once in each spawned worker, before its first range. pyarrow imports pandas on its
    first `pa.array` call only to test whether the input is a pandas object: 0.3 s of CPU per
    worker (measured), ~6% of a 100k-record ingest on 2 cores. A worker only ever hands it
    Python lists, so pandas is made unimportable here (ImportError: pyarrow skips the check)."""
    import sys

    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas)
    import pyarrow.parquet  # noqa: F401

    from ratchet import readers  # noqa: F401


def _split_ranges(path: Path, target: int, sha=None) -> Iterator[tuple[int, int, int]]:
    """Newline-aligned (start, end, first line number) ranges of about `target` bytes, yielded
    as found so the first workers start before the whole file has been scanned. Each range is
    read once here, to count its lines and to feed `sha` (the whole-file digest) from the same
    buffer; numpy counts newlines ~4x faster than `bytes.count` (measured, 8 MiB ranges)."""
    import numpy as np

    start, line = 0, 1
    size = path.stat().st_size
    buf = bytearray(target + (1 << 20))
    with open(path, "rb") as fh:
        while start < size:
            fh.seek(min(start + target, size))
            fh.readline()  # move to the end of the line the cut falls in
            end = min(fh.tell(), size)
            if end - start > len(buf):
                buf = bytearray(end - start)
            fh.seek(start)
            view = memoryview(buf)[: fh.readinto(memoryview(buf)[: end - start])]
            if sha is not None:
                sha.update(view)
            lines = int(np.count_nonzero(np.frombuffer(view, np.uint8) == 10))
            del view
            yield start, end, line
            start, line = end, line + lines


def _parallel_ranges(pool, path: Path, ctx: _FileContext, staging: Path, workers: int, sha=None):
    """Workers normalise ranges and stage Parquet parts; yield their results in file order
    with at most `2 * workers` ranges in flight."""
    from collections import deque

    pending: deque = deque()
    for i, (start, end, line) in enumerate(_split_ranges(path, RANGE_BYTES, sha)):
        staged = staging / f"{path.name}-{i:06d}.parquet"
        pending.append(pool.apply_async(_normalise_range, (path, start, end, line, ctx, staged)))
        if len(pending) >= 2 * workers:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _has_predictions(f: Path) -> bool:
    with open(f, "rb") as fh:
        head = fh.read(4096)
    return b'"model_patch"' in head and b'"instance_id"' in head


def _count_clashes(wh: Warehouse, batch_id: str) -> int:
    """Same trajectory_id, different content: every version is kept (distinct record_id) and
    flagged by the view's `id_clash`; count this batch's flagged records."""
    with wh.connect() as con:
        return con.execute("SELECT count(*) FROM trajectories WHERE batch_id = ? AND id_clash",
                           [batch_id]).fetchone()[0]


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record_batch(wh, s: IngestSummary, opts: IngestOptions, paths, started, file_rows) -> None:
    with wh.connect() as con:
        con.execute("INSERT INTO ingest_batches VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", [
            s.batch_id, opts.origin, opts.dagster_run_id, started, datetime.now(timezone.utc), paths,
            opts.tenant_id, opts.consent_id, s.read, s.accepted, s.quarantined, s.duplicates,
            s.id_clashes, orjson.dumps(s.as_dict()).decode()])
        for f, st, c, sha in file_rows:
            con.execute("INSERT INTO ingest_files VALUES (?,?,?,?,?,?,?,?,?)", [
                s.batch_id, str(f), st.st_size, st.st_mtime_ns, sha, c["read"],
                c["accepted"], c["quarantined"], c["duplicates"]])
