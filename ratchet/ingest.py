"""Ingest: files in, `trajectories` and `quarantine` rows out, nothing lost.

Every record read ends in exactly one of: accepted (a new `trajectories` row), quarantined (a
`quarantine` row with the raw payload, file, line and reason) or duplicate (its content is
already in the warehouse, or earlier in the same batch). So `read == accepted + quarantined +
duplicates` for every ingest, and re-ingesting a file adds nothing: ids are content hashes.

A batch is atomic: its parts and quarantine rows are staged under `.staging-<batch>` and made
visible together with its `ingest_batches` row in one transaction (`Warehouse.commit_batch`); an
aborted or killed batch leaves nothing visible, and the next ingest removes its debris. Folder
entries that are not regular files are skipped with a reason (`ingest_files.status = 'skipped'`).
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
from ratchet.readers import (LINE_FORMATS, Raw, SkipFile, Source, _read, check_regular, discover, inner_name,
                             long_line_raw, open_regular, sidecar_for, unflatten)
from ratchet.readers import loads as _loads
from ratchet.warehouse import QUARANTINE_SCHEMA, STORED_SCHEMA, Warehouse, write_part

DEFAULT_MAX_RECORD_MB = 32.0
CHUNK_ROWS = 4096
CHUNK_BYTES = 64 << 20
PARALLEL_MIN_BYTES = 64 << 20   # below this a spawned pool costs more than it saves
RANGE_BYTES = 8 << 20           # one worker task: ~1.4k records of 5.8 KB
PART_ROWS = 65536               # rows of small files are gathered into parts of up to this many rows...
PART_BYTES = 96 << 20           # ...or this many bytes of Arrow data (not one part per file)
COMPACT_SMALL_PARTS = 64        # after a commit, merge tiny parts once there are this many
# "Tiny" for the automatic compaction: parts of a few small files (~86 KB per 100 one-record
# files). A large file's range parts (~1.1 MB each from 8 MiB of JSON) are never rewritten on
# the ingest's critical path: merging them re-read and re-wrote a 100k-record ingest's whole
# output in the parent and cost ~45% of its throughput (27.8k -> 15.1k/s, measured).
# `ratchet compact` merges everything below the warehouse's 32 MiB on request.
AUTO_COMPACT_BYTES = 256 << 10
SKIPPED_LISTED = 100            # skipped entries named in the summary (all are in ingest_files)


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
    skipped: int = 0                  # folder entries not read (not regular files, unreadable): see ingest_files
    skip_reasons: dict = field(default_factory=dict)
    skipped_files: list = field(default_factory=list)   # the first SKIPPED_LISTED as {file, reason_code, reason}
    superseded: int = 0               # earlier truncated_json quarantine rows this batch completed
    attribution_conflicts: int = 0    # records already stored under another tenant/consent (counted as duplicates)
    debris_removed: int = 0           # staging folders / unlisted parts of killed runs removed first
    compacted_parts: int = 0          # small lake parts merged after this batch
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
                fmt = adapters.exported_format(obj)
                if fmt is not None:  # a warehouse row read back: re-normalised as its own format
                    native = unflatten(dict(obj))
                else:
                    fmt = adapters.detect(obj)
                    native = adapters.to_native(fmt, obj, ctx.file, ctx.reports)
                if fmt == swebench.NAME and native["extra"]["report"]["found"]:
                    res.reports_joined += 1
                for k in ("tenant_id", "consent_id"):  # the record's own value wins over the batch's
                    if not native.get(k) and attribution.get(k):
                        native = {**native, k: attribution[k]}
                row = normalise(native, fmt, allow_empty_messages=fmt == swebench.NAME,
                                derive_ids=fmt in adapters.DERIVE_IDS)
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
        if res.fast:
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
    """Dedups chunks against the batch and the warehouse, stages them, keeps the counts. Nothing
    it writes is visible before `Warehouse.commit_batch`."""

    def __init__(self, wh: Warehouse, summary: IngestSummary, now: datetime, staging: Path):
        self.wh, self.s, self.now, self.staging = wh, summary, now, staging
        self.seen: set[str] = wh.trajectory_ids()
        with wh.connect() as con:
            self.seen.update(r[0] for r in con.execute("SELECT quarantine_id FROM quarantine").fetchall())
        self.per_file: Counter = Counter()
        self.qrows: list[dict] = []
        self.qbytes = 0
        self.parts: list[tuple[Path, int]] = []      # staged parts, (path, rows)
        self.qparts: list[Path] = []
        self.buffer: list[pa.Table] = []             # accepted rows of small chunks, gathered into one part
        self.buffer_rows = self.buffer_bytes = 0

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
        if res.ids is not None:
            ids = res.ids
        elif res.table is not None:
            ids = res.table.column("record_id").to_pylist()
        else:
            ids = []
        if seen.isdisjoint(ids) and len(set(ids)) == len(ids):  # the common case, in C
            seen.update(ids)
            keep, n_new = None, len(ids)
        else:
            keep = [i not in seen and not seen.add(i) for i in ids]  # first copy wins
            n_new = sum(keep)
        self._bump("duplicates", len(ids) - n_new)
        if n_new and res.staged is not None and n_new == len(ids):
            self.parts.append((res.staged, n_new))  # the common case on the parallel path: kept as written
        else:
            if n_new:
                import pyarrow.parquet as pq

                table = res.table if res.table is not None else pq.read_table(res.staged)
                table = table.filter(pa.array(keep)) if n_new < len(ids) else table
                self.buffer.append(table)
                self.buffer_rows += table.num_rows
                self.buffer_bytes += table.nbytes
                if self.buffer_rows >= PART_ROWS or self.buffer_bytes >= PART_BYTES:
                    self._flush_rows()
            if res.staged is not None:
                res.staged.unlink(missing_ok=True)
        if n_new:
            self._bump("accepted", n_new)
        for raw, code, detail, fmt in res.bad:
            self.s.quarantine_reasons[code] = self.s.quarantine_reasons.get(code, 0) + 1
            sha = raw.sha256 or hashlib.sha256(raw.payload).hexdigest()
            qid = hashlib.sha256(f"{raw.file}\0{raw.line}\0{sha}".encode()).hexdigest()
            if qid in seen:
                self._bump("duplicates", 1)
                continue
            seen.add(qid)
            self._bump("quarantined", 1)
            self.qrows.append({
                "quarantine_id": qid, "source_file": raw.file, "source_line": raw.line,
                "byte_offset": raw.offset, "detected_format": fmt, "reason_code": code, "reason": detail,
                "raw": raw.payload, "raw_sha256": sha, "raw_bytes": raw.size if raw.size is not None else len(raw.payload),
                "batch_id": self.s.batch_id, "quarantined_at": self.now})
            self.qbytes += len(raw.payload)
        if len(self.qrows) >= 1024 or self.qbytes >= 64 << 20:
            self.flush()

    def _flush_rows(self) -> None:
        if self.buffer:
            path = self.staging / f"rows-{len(self.parts):06d}.parquet"
            table = pa.concat_tables(self.buffer) if len(self.buffer) > 1 else self.buffer[0]
            write_part(table, path)
            self.parts.append((path, table.num_rows))
            self.buffer, self.buffer_rows, self.buffer_bytes = [], 0, 0

    def flush(self) -> None:
        """Stage the pending quarantine rows (a Parquet file: inserted at commit)."""
        if self.qrows:
            import pyarrow.parquet as pq

            path = self.staging / f"quarantine-{len(self.qparts):06d}.parquet"
            pq.write_table(pa.Table.from_pylist(self.qrows, schema=QUARANTINE_SCHEMA), path)
            self.qparts.append(path)
            self.qrows, self.qbytes = [], 0

    def finish(self) -> None:
        self._flush_rows()
        self.flush()


# `\u0000` escapes a NUL only after an even number of backslashes: `\\u0000` is the text \u0000.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _decode(raw: Raw, max_bytes: int):
    """Decoded object, or raise RecordError with a precise reason."""
    if raw.error:
        raise RecordError(*raw.error)
    if raw.payload[:3] == b"\xef\xbb\xbf" and raw.obj is None:  # a UTF-8 BOM (file start, or files concatenated)
        raw = Raw(raw.file, raw.line, raw.offset, raw.payload[3:])
    if len(raw.payload) > max_bytes:
        raise RecordError("record_too_large", f"{len(raw.payload) / 2**20:.1f} MiB exceeds the "
                          f"{max_bytes / 2**20:.0f} MiB limit (raise max_record_mb to accept it)")
    if b"\x00" in raw.payload or (b"\\u0000" in raw.payload and _NUL_ESCAPE.search(raw.payload)):
        raise RecordError("nul_byte", "the record contains a NUL byte (raw or \\u0000-escaped)")
    if raw.obj is not None:
        return raw.obj
    try:
        return _loads(raw.payload)
    except ValueError as e:  # orjson.JSONDecodeError, or msgspec's error for payloads with long digit runs
        try:
            raw.payload.decode("utf-8")
        except UnicodeDecodeError as u:
            raise RecordError("invalid_utf8", f"byte {u.start}: {u.reason}") from None
        msg = str(e)
        if "out of range" in msg:
            raise RecordError("out_of_range", f"a number cannot be represented: {msg}") from None
        truncated = "EOF" in msg or "end of" in msg.lower() or "truncated" in msg
        raise RecordError("truncated_json" if truncated else "invalid_json", msg) from None


def _collect_reports(files: list[tuple[Path, Path]]) -> tuple[dict, set[Path]]:
    """SWE-bench reports among the inputs are side inputs for the predictions they describe."""
    reports: dict = {}
    used: set[Path] = set()
    for f, _ in files:
        entries = _report_file(f) if f.suffix.lower() == ".json" else None
        if entries is not None:
            reports.update(entries)
            used.add(f)
    return reports, used


def _report_file(f: Path) -> dict | None:
    try:
        if check_regular(f).st_size > 256 << 20:
            return None
        with open_regular(f) as fh:
            return swebench.report_entries(orjson.loads(fh.read()))
    except (orjson.JSONDecodeError, SkipFile, OSError):
        return None


def _reports_near(files: Iterable[Path], reports: dict) -> None:
    """Predictions whose reports were not given: look for `report.json` beside them."""
    for d in {f.parent for f in files}:
        for rp in sorted(d.rglob("report.json"))[:100_000]:
            for k, v in (_report_file(rp) or {}).items():
                reports.setdefault(k, v)


def _chunks(items: Iterable, rows: int, max_bytes: int) -> Iterable[list]:
    chunk, size = [], 0
    for raw in items:
        chunk.append(raw)
        size += len(raw[0]) if type(raw) is tuple else len(raw.payload)
        if len(chunk) >= rows or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _size(f: Path) -> int:
    try:
        return check_regular(f).st_size
    except SkipFile:
        return 0


def ingest(paths: list[str | os.PathLike], warehouse: Warehouse, options: IngestOptions | None = None,
           progress: Callable[[int, int], None] | bool = False) -> IngestSummary:
    """Ingest files and folders into the warehouse; returns the batch summary.

    Large inputs are normalised by `workers` processes (default: one per core) while this process
    writes; small ones inline (a spawned worker costs ~0.5 s to start). Ingests are serialised."""
    import time

    t0 = time.perf_counter()
    opts = options or IngestOptions()
    files, skipped = discover(paths)
    workers = opts.workers or os.cpu_count() or 1
    pool = None
    if workers > 1 and any(_size(f) >= PARALLEL_MIN_BYTES for f, _ in files):
        import multiprocessing as mp

        # spawn: forking a threaded Dagster/DuckDB process is unsafe. Started first and warmed up
        # (imports) while this process opens the warehouse and reads the ids already stored.
        pool = mp.get_context("spawn").Pool(workers, initializer=_worker_init)
    try:
        warehouse.ensure_schema()
        with warehouse.ingest_lock():
            return _ingest(files, skipped, paths, warehouse, opts, progress, pool, workers, t0)
    finally:
        if pool is not None:
            pool.terminate()


def compact(warehouse: Warehouse, min_parts: int = 2) -> dict:
    """Merge the lake's small parts (what `ratchet compact` runs; ingest runs it by itself once
    COMPACT_SMALL_PARTS small parts have gathered). Serialised with ingests."""
    warehouse.ensure_schema()
    with warehouse.ingest_lock():
        removed = warehouse.clean_debris()
        return {**warehouse.compact(min_parts=min_parts), "debris_removed": removed}


_FILE_COLUMNS = ("batch_id", "source_file", "size_bytes", "mtime_ns", "sha256", "read", "accepted", "quarantined",
                 "duplicates", "status", "skip_reason", "skip_detail", "compression", "encoding")


def _ingest(files, skipped, paths, warehouse: Warehouse, opts: IngestOptions, progress, pool, workers: int,
            t0: float) -> IngestSummary:
    import shutil
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    now = datetime.now(timezone.utc)
    summary = IngestSummary(batch_id=uuid.uuid4().hex)
    summary.debris_removed = warehouse.clean_debris()
    # Attribution is resolved for every file before anything is written: a bad `_batch.yaml`
    # fails the batch whole (ValueError), never half-way through.
    attributions = {f: {k: getattr(opts, k) or v for k, v in sidecar_for(f, root).items()} | {
        k: getattr(opts, k) for k in ("tenant_id", "consent_id") if getattr(opts, k)} for f, root in files}
    staging = warehouse.trajectory_dir / f".staging-{summary.batch_id}"
    staging.mkdir(parents=True, exist_ok=True)
    hasher = ThreadPoolExecutor(1)  # file digests overlap the parsing (hashlib releases the GIL)
    bar = None
    try:
        reports, report_files = _collect_reports(files)
        files = [(f, r) for f, r in files if f not in report_files]
        writer = _Writer(warehouse, summary, now, staging)
        max_bytes = int(opts.max_record_mb * 2**20)
        total = sum(_size(f) for f, _ in files)
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="ingest", disable=progress is not True)
        file_rows: list[tuple] = []
        per_file: dict[str, Counter] = {}
        for f, root in files:
            writer.per_file = per_file.setdefault(str(f), Counter())
            attribution = {k: attributions[f].get(k) for k in ("tenant_id", "consent_id")}
            ctx = _FileContext(f, attribution, max_bytes, reports, summary.batch_id, now)
            try:
                st = check_regular(f)
                src = Source(f)
            except SkipFile as e:  # vanished or replaced since discovery
                skipped.append(_skip(f, e.code, e.detail))
                continue
            if inner_name(f).endswith((".jsonl", ".ndjson", ".json")) and _has_predictions(f):
                _reports_near([f], reports)
            if (pool is not None and src.plain and not src.archive and inner_name(f).endswith(LINE_FORMATS)
                    and src.size >= PARALLEL_MIN_BYTES):
                src.close()
                sha = hashlib.sha256()  # fed by the range splitter, which reads the file anyway
                digest = sha.hexdigest
                results = _parallel_ranges(pool, f, ctx, staging, workers, sha)
            else:
                digest = hasher.submit(_file_sha, f).result
                results = (_normalise_chunk(c, ctx) for c in _chunks(_read(src, max_bytes), CHUNK_ROWS, CHUNK_BYTES))
            for res in results:
                writer.write(res)
            file_rows.append((str(f), st.st_size, st.st_mtime_ns, digest(), "read", None, None, src.compression,
                              src.encoding))
            bar.update(st.st_size)
            if callable(progress):
                progress(bar.n, total)
        writer.finish()
        if any(any(a.values()) for a in attributions.values()) and writer.parts:
            _drop_reattributed(warehouse, writer, per_file)
        for sk in skipped:
            summary.skipped += 1
            summary.skip_reasons[sk.code] = summary.skip_reasons.get(sk.code, 0) + 1
            if len(summary.skipped_files) < SKIPPED_LISTED:
                summary.skipped_files.append({"file": str(sk.path), "reason_code": sk.code, "reason": sk.detail})
            file_rows.append((str(sk.path), None, None, None, "skipped", sk.code, sk.detail, None, None))
        summary.files = len(files)
        if not summary.consistent:  # never silently: the invariant is the product's promise
            raise RuntimeError(f"ingest invariant read == accepted + quarantined + duplicates broken: {summary.as_dict()}")
        summary.seconds = round(time.perf_counter() - t0, 3)
        table = _file_table(summary.batch_id, file_rows, per_file)
        batch_row = [summary.batch_id, opts.origin, opts.dagster_run_id, now, datetime.now(timezone.utc),
                     [str(p) for p in paths], opts.tenant_id, opts.consent_id, summary.read, summary.accepted,
                     summary.quarantined, summary.duplicates, 0, None]
        # the summary JSON is written with the counts the commit fills in
        got = warehouse.commit_batch(summary.batch_id, writer.parts, writer.qparts, batch_row, table,
                                     summary_json=lambda c: _summary_json(summary, c))
        summary.id_clashes, summary.superseded = got["id_clashes"], got["superseded"]
    finally:
        if bar is not None:
            bar.close()
        hasher.shutdown(wait=True)
        shutil.rmtree(staging, ignore_errors=True)
    if summary.accepted:
        small = _small_parts(warehouse)
        if small >= COMPACT_SMALL_PARTS:
            summary.compacted_parts = warehouse.compact(small_bytes=AUTO_COMPACT_BYTES)["merged"]
    return summary


def _summary_json(s: IngestSummary, counts: dict) -> str:
    s.id_clashes, s.superseded = counts["id_clashes"], counts["superseded"]
    return orjson.dumps(s.as_dict()).decode()


def _small_parts(wh: Warehouse) -> int:
    with wh.connect() as con:
        return con.execute("SELECT count(*) FROM lake_parts WHERE bytes < ?",
                           [AUTO_COMPACT_BYTES]).fetchall()[0][0]


def _skip(f: Path, code: str, detail: str):
    from ratchet.readers import Skipped

    return Skipped(f, code, detail)


def _file_table(batch_id: str, file_rows: list[tuple], per_file: dict) -> pa.Table:
    cols: dict[str, list] = {k: [] for k in _FILE_COLUMNS}
    for name, size, mtime, sha, status, reason, detail, compression, encoding in file_rows:
        c = per_file.get(name, Counter()) if status == "read" else Counter()
        for k, v in zip(_FILE_COLUMNS, (batch_id, name, size, mtime, sha, c["read"], c["accepted"], c["quarantined"],
                                        c["duplicates"], status, reason, detail, compression, encoding)):
            cols[k].append(v)
    types = {"size_bytes": pa.int64(), "mtime_ns": pa.int64(), "read": pa.int64(), "accepted": pa.int64(),
             "quarantined": pa.int64(), "duplicates": pa.int64()}
    return pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()})


_CONTENT_CMP = [n for n in CONTENT_NAMES if n not in ("record_id", "tenant_id", "consent_id")]


def _drop_reattributed(wh: Warehouse, writer: _Writer, per_file: dict) -> None:
    """A record already stored under another tenant/consent (the same file ingested again with
    another --tenant, or another _batch.yaml) is not a second copy: it counts as a duplicate, the
    stored attribution stands, and the summary says how many (`attribution_conflicts`)."""
    import pyarrow.parquet as pq

    files = ", ".join("'" + str(p).replace("'", "''") + "'" for p, _ in writer.parts)
    cond = " AND ".join(f'b."{n}" IS NOT DISTINCT FROM t."{n}"' for n in _CONTENT_CMP)
    with wh.connect() as con:
        hits = con.execute(f"""
            SELECT DISTINCT b.record_id, b.source_file FROM read_parquet([{files}]) b
            JOIN trajectories t ON t.trajectory_id = b.trajectory_id AND t.record_id <> b.record_id AND {cond}
            WHERE t.tenant_id IS DISTINCT FROM b.tenant_id OR t.consent_id IS DISTINCT FROM b.consent_id""").fetchall()
    if not hits:
        return
    drop = {r for r, _ in hits}
    for _, f in hits:
        c = per_file.setdefault(f, Counter())
        c["accepted"] -= 1
        c["duplicates"] += 1
    s = writer.s
    s.accepted -= len(drop)
    s.duplicates += len(drop)
    s.attribution_conflicts += len(drop)
    kept = []
    for p, _ in writer.parts:
        t = pq.read_table(p, schema=STORED_SCHEMA)
        mask = pa.array([r not in drop for r in t.column("record_id").to_pylist()])
        t = t.filter(mask)
        if t.num_rows:
            write_part(t, p)
            kept.append((p, t.num_rows))
        else:
            p.unlink()
    writer.parts = kept


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


def _split_ranges(path: Path, target: int, max_bytes: int, sha=None) -> Iterator[tuple]:
    """Newline-aligned ("range", start, end, first line) pieces of about `target` bytes, yielded
    as found so the first workers start before the whole file has been scanned, and ("long",
    start, end, line) for each line longer than `max_bytes` (read by nobody: quarantined from its
    first bytes). The file is read once here in `target`-byte blocks, to find newlines and to feed
    `sha` (the whole-file digest) from the same buffer; memory stays at one block however long a
    line is. numpy finds the newlines (~4x faster than bytes.find loops, measured)."""
    import numpy as np

    buf = bytearray(target)
    start, start_line = 0, 1      # the range being gathered
    line_start, cur_line = 0, 1   # the line being read: its offset and number
    pos = 0
    with open_regular(path) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            view = memoryview(buf)[:n]
            if sha is not None:
                sha.update(view)
            nls = np.flatnonzero(np.frombuffer(view, np.uint8) == 10)
            del view
            if len(nls):
                ends = nls + pos                       # offsets of the newlines
                starts = np.empty_like(ends)
                starts[0] = line_start
                starts[1:] = ends[:-1] + 1
                for k in np.flatnonzero(ends - starts > max_bytes).tolist():  # rare: over-limit lines
                    ls, le = int(starts[k]), int(ends[k])
                    if ls > start:
                        yield "range", start, ls, start_line
                    yield "long", ls, le, cur_line + k
                    start, start_line = le + 1, cur_line + k + 1
                last = int(ends[-1]) + 1
                if last > start:
                    yield "range", start, last, start_line
                start, start_line = last, cur_line + len(nls)
                line_start, cur_line = last, cur_line + len(nls)
            pos += n
    if pos > start:  # a last line without a newline
        if pos - line_start > max_bytes:
            if line_start > start:
                yield "range", start, line_start, start_line
            yield "long", line_start, pos, cur_line
        else:
            yield "range", start, pos, start_line


class _Done:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def _parallel_ranges(pool, path: Path, ctx: _FileContext, staging: Path, workers: int, sha=None):
    """Workers normalise ranges and stage Parquet parts; yield their results in file order
    with at most `2 * workers` ranges in flight."""
    from collections import deque

    pending: deque = deque()
    for i, (kind, start, end, line) in enumerate(_split_ranges(path, RANGE_BYTES, ctx.max_bytes, sha)):
        if kind == "long":
            raw = long_line_raw(path, start, end, line, ctx.max_bytes)
            pending.append(_Done(_ChunkResult(n_read=1, bad=[(raw, "record_too_large", raw.error[1], None)])))
        else:
            staged = staging / f"{path.name}-{i:06d}.parquet"
            pending.append(pool.apply_async(_normalise_range, (path, start, end, line, ctx, staged)))
        if len(pending) >= 2 * workers:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _has_predictions(f: Path) -> bool:
    with open_regular(f) as fh:
        head = fh.read(4096)
    return b'"model_patch"' in head and b'"instance_id"' in head


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
