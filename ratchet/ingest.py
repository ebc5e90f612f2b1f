"""Ingest: files in, `trajectories` and `quarantine` rows out, nothing lost.

Every record read ends in exactly one of: accepted (a new `trajectories` row), quarantined (a
`quarantine` row with the raw payload, file, line and reason) or duplicate (its content is
already in the warehouse, or earlier in the same batch). So `read == accepted + quarantined +
duplicates` for every ingest, and re-ingesting a file adds nothing: ids are content hashes, and
a record stored before under other (or no) batch attribution is a duplicate too.

A batch is atomic: its parts and quarantine rows are staged under `.staging-<batch>` and made
visible together with its `ingest_batches` row in one transaction (`Warehouse.commit_batch`); an
aborted or killed batch leaves nothing visible, and the next ingest removes its debris; its
spawned workers die with it. Folder entries that are not regular files, and hidden ones, are
skipped with a reason (`ingest_files.status = 'skipped'`);
SWE-bench reports read as side inputs of predictions are recorded with status `side_input`.
"""
from __future__ import annotations

import hashlib
import os
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

import orjson
import pyarrow as pa

from ratchet.adapters import swebench
from ratchet.contract import CONTENT_NAMES
from ratchet.ingest_ranges import parallel_ranges, worker_init
from ratchet.ingest_records import FileContext, normalise_chunk
from ratchet.ingest_writer import BatchWriter
from ratchet.readers import (
    LINE_FORMATS,
    SkipFile,
    Source,
    Unreadable,
    _read,
    check_regular,
    discover,
    inner_name,
    open_regular,
    sidecar_for,
)
from ratchet.warehouse import STORED_SCHEMA, Warehouse, write_part

DEFAULT_MAX_RECORD_MB = 32.0
CHUNK_ROWS = 4096  # pragma: no mutate (a batch size: any value stores the same rows)
CHUNK_BYTES = 64 << 20  # pragma: no mutate (a batch size: any value stores the same rows)
# below this a spawned pool costs more than it saves
PARALLEL_MIN_BYTES = 64 << 20  # pragma: no mutate (a speed threshold: both paths store the same rows)
# after a commit, merge tiny parts once there are this many
COMPACT_SMALL_PARTS = 64  # pragma: no mutate (a file layout threshold: the rows read back are the same)
# "Tiny" for the automatic compaction: parts of a few small files (~86 KB per 100 one-record
# files). A large file's range parts (~1.1 MB each from 8 MiB of JSON) are never rewritten on
# the ingest's critical path: merging them re-read and re-wrote a 100k-record ingest's whole
# output in the parent and cost ~45% of its throughput (27.8k -> 15.1k/s, measured).
# `ratchet compact` merges everything below the warehouse's 32 MiB on request.
AUTO_COMPACT_BYTES = 256 << 10  # pragma: no mutate (a file layout threshold: the rows read back are the same)
SKIPPED_LISTED = 100            # skipped entries named in the summary (all are in ingest_files)


@dataclass
class IngestOptions:
    tenant_id: str | None = None      # batch attribution for records that carry none
    consent_id: str | None = None
    max_record_mb: float = DEFAULT_MAX_RECORD_MB
    origin: str = "cli"               # cli | dagster | sensor | bench
    # normalising processes for large inputs; 0 = one per core
    workers: int = 0  # pragma: no mutate (a speed setting: any worker count stores the same rows)
    dagster_run_id: str | None = None
    # Files under the landing folder are recorded (ingest_files.landing_file, the quarantine id)
    # by their path relative to it, so a moved or copied home knows what it read. Default: the
    # landing folder of the home the warehouse is in (RATCHET_HOME/warehouse.duckdb -> ./landing).
    landing: str | None = None


@dataclass
class IngestSummary:
    batch_id: str
    read: int = 0
    accepted: int = 0
    quarantined: int = 0
    duplicates: int = 0
    # accepted records whose trajectory_id already had other content
    id_clashes: int = 0  # pragma: no mutate (set on every path that returns the summary: the default is never read)
    files: int = 0  # pragma: no mutate (set on every path that returns the summary: the default is never read)
    reports_joined: int = 0
    fast_path: int = 0                # accepted or duplicate records decoded by the typed fast path
    by_format: dict = field(default_factory=dict)
    quarantine_reasons: dict = field(default_factory=dict)
    skipped: int = 0                  # folder entries not read (not regular files, unreadable): see ingest_files
    skip_reasons: dict = field(default_factory=dict)
    skipped_files: list = field(default_factory=list)   # the first SKIPPED_LISTED as {file, reason_code, reason}
    # earlier truncated_json quarantine rows this batch completed
    superseded: int = 0  # pragma: no mutate (set on every path that returns the summary: the default is never read)
    attribution_conflicts: int = 0    # records already stored under another tenant/consent (counted as duplicates)
    # staging folders / unlisted parts of killed runs removed first
    debris_removed: int = 0  # pragma: no mutate (set on every path that returns the summary: the default is never read)
    compacted_parts: int = 0          # small lake parts merged after this batch
    seconds: float = 0.0  # pragma: no mutate (set on every path that returns the summary: the default is never read)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def consistent(self) -> bool:
        return self.read == self.accepted + self.quarantined + self.duplicates


def _collect_reports(files: list[tuple[Path, Path]]) -> tuple[dict, set[Path]]:
    """SWE-bench reports among the inputs are side inputs for the predictions they describe."""
    reports: dict = {}
    used: set[Path] = set()
    for f, _ in files:
        entries = _report_file(f) if inner_name(f).lower().endswith(".json") else None
        if entries is not None:
            reports.update(entries)
            used.add(f)
    return reports, used


REPORT_MAX_BYTES = 32 << 20     # a SWE-bench report or run summary is kilobytes to a few MB
REPORT_SNIFF_BYTES = 64 << 10


def _report_file(f: Path) -> dict | None:
    """A SWE-bench report's entries, or None. Every `.json` input is asked, so the file is
    sniffed first (its first 64 KiB: a JSON object naming `resolved...`) and parsed whole only
    then: parsing a large array of records just to learn it is not a report held ~7x its size."""
    try:
        if check_regular(f).st_size > REPORT_MAX_BYTES:
            return None
        with Source(f) as src:   # decoded: a gzipped or UTF-16 report is a report too
            got, n = [], 0
            chunks = src.chunks()
            for b in chunks:
                got.append(b)
                n += len(b)
                if n >= REPORT_SNIFF_BYTES:
                    break
            if not _looks_like_report(b"".join(got)[:REPORT_SNIFF_BYTES]):
                return None
            for b in chunks:
                got.append(b)
                n += len(b)
                if n > REPORT_MAX_BYTES:   # decoded size too: a small gzip can inflate
                    return None
            return swebench.report_entries(orjson.loads(b"".join(got)))
    except (orjson.JSONDecodeError, Unreadable, SkipFile, OSError):
        return None


def _looks_like_report(head: bytes) -> bool:
    """A report (`{"<instance>": {..., "resolved": ...}}`) or a run summary (`{"total_instances":
    ..., "resolved_ids": [...]}`) starts as an object and names a `resolved` key early on."""
    body = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return body.startswith(b"{") and (b'"resolved' in head or b'"total_instances"' in head
                                      or b'"submitted_instances"' in head)


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


def worker_count(opts: IngestOptions) -> int:
    """Normalising processes for large inputs: `workers`, or one per core when it is 0."""
    return opts.workers or os.cpu_count() or 1


def ingest(paths: list[str | os.PathLike], warehouse: Warehouse, options: IngestOptions | None = None,
           progress: Callable[[int, int], None] | bool = False) -> IngestSummary:
    """Ingest files and folders into the warehouse; returns the batch summary.

    Large inputs are normalised by `workers` processes (default: one per core) while this process
    writes; small ones inline (a spawned worker costs ~0.5 s to start). Ingests are serialised."""
    import time

    t0 = time.perf_counter()
    opts = options or IngestOptions()
    files, skipped = discover(paths)
    workers = worker_count(opts)
    pool = None
    if workers > 1 and any(_size(f) >= PARALLEL_MIN_BYTES for f, _ in files):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        # spawn: forking a threaded Dagster/DuckDB process is unsafe. ProcessPoolExecutor, not
        # multiprocessing.Pool: a Pool whose worker dies waits forever (a full test run hung so);
        # the executor raises BrokenProcessPool and the range runs here instead.
        # Started first and warmed up (imports) while this process opens the warehouse.
        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=worker_init)
        for _ in range(workers):
            pool.submit(int)            # one no-op per worker starts them all now
    try:
        warehouse.ensure_schema()
        with warehouse.ingest_lock():
            return _ingest(files, skipped, paths, warehouse, opts, progress, pool, workers, t0)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)   # ranges are bounded (RANGE_BYTES)


def compact(warehouse: Warehouse, min_parts: int = 2) -> dict:
    """Merge the lake's small parts (what `ratchet compact` runs; ingest runs it by itself once
    COMPACT_SMALL_PARTS small parts have gathered). Serialised with ingests."""
    warehouse.ensure_schema()
    with warehouse.ingest_lock():
        removed = warehouse.clean_debris()
        return {**warehouse.compact(min_parts=min_parts), "debris_removed": removed}


_FILE_COLUMNS = ("batch_id", "source_file", "size_bytes", "mtime_ns", "sha256", "read", "accepted", "quarantined",
                 "duplicates", "status", "skip_reason", "skip_detail", "compression", "encoding", "landing_file")


def landing_folder(warehouse: Warehouse, opts: IngestOptions) -> Path:
    return Path(opts.landing) if opts.landing else warehouse.path.parent / "landing"


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
    attributions = {f: {k: getattr(opts, k, None) or v for k, v in sidecar_for(f, root).items()} | {
        k: getattr(opts, k) for k in ("tenant_id", "consent_id") if getattr(opts, k)} for f, root in files}
    staging = warehouse.trajectory_dir / f".staging-{summary.batch_id}"
    staging.mkdir(parents=True, exist_ok=True)
    hasher = ThreadPoolExecutor(1)  # file digests overlap the parsing (hashlib releases the GIL)
    bar = None
    try:
        reports, report_files = _collect_reports(files)
        files = [(f, r) for f, r in files if f not in report_files]
        file_rows: list[tuple] = []
        for f in sorted(report_files):  # read as side inputs of predictions: recorded, so no one re-reads them
            st = check_regular(f)
            file_rows.append((str(f), st.st_size, st.st_mtime_ns, _file_sha(f), "side_input", None, None, None, None))
        landing = landing_folder(warehouse, opts)
        writer = BatchWriter(warehouse, summary, now, staging, landing=landing)
        max_bytes = int(opts.max_record_mb * 2**20)
        total = sum(_size(f) for f, _ in files)
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="ingest", disable=progress is not True)
        done = 0  # counted here: a disabled bar (a callback asked for, no bar) keeps no count
        per_file: dict[str, Counter] = {}
        for f, root in files:
            writer.per_file = per_file.setdefault(str(f), Counter())
            attribution = {k: attributions[f].get(k) for k in ("tenant_id", "consent_id", "accepted", "ended_at")}
            ctx = FileContext(f, attribution, max_bytes, reports, summary.batch_id, now)
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
                results = parallel_ranges(pool, f, ctx, staging, workers, sha)
            else:
                digest = hasher.submit(_file_sha, f).result
                results = (normalise_chunk(c, ctx) for c in _chunks(_read(src, max_bytes), CHUNK_ROWS, CHUNK_BYTES))
            for res in results:
                writer.write(res)
            file_rows.append((str(f), st.st_size, st.st_mtime_ns, digest(), "read", None, None, src.compression,
                              src.encoding))
            bar.update(st.st_size)
            done += st.st_size
            if callable(progress):
                progress(done, total)
        writer.finish()
        if writer.parts and writer.stored:  # (an empty warehouse holds nothing to be a duplicate of)
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
        table = _file_table(summary.batch_id, file_rows, per_file, landing)
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


def _file_table(batch_id: str, file_rows: list[tuple], per_file: dict, landing: Path) -> pa.Table:
    from ratchet.landing import landing_key

    cols: dict[str, list] = {k: [] for k in _FILE_COLUMNS}
    for name, size, mtime, sha, status, reason, detail, compression, encoding in file_rows:
        c = per_file.get(name, Counter()) if status == "read" else Counter()
        for k, v in zip(_FILE_COLUMNS, (batch_id, name, size, mtime, sha, c["read"], c["accepted"], c["quarantined"],
                                        c["duplicates"], status, reason, detail, compression, encoding,
                                        landing_key(name, landing))):
            cols[k].append(v)
    types = {"size_bytes": pa.int64(), "mtime_ns": pa.int64(), "read": pa.int64(), "accepted": pa.int64(),
             "quarantined": pa.int64(), "duplicates": pa.int64()}
    return pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()})


_CONTENT_CMP = [n for n in CONTENT_NAMES if n not in ("record_id", "tenant_id", "consent_id")]


def _drop_reattributed(wh: Warehouse, writer: BatchWriter, per_file: dict) -> None:
    """A record already stored under another tenant/consent, or under one where this ingest gives
    none (the same file ingested again with another --tenant, another _batch.yaml, or no
    attribution at all), is not a second copy: it counts as a duplicate, the stored attribution
    stands, and the summary says how many (`attribution_conflicts`).

    Two steps, so an ingest pays for the full comparison only when it can matter: the batch's
    (trajectory_id, record_id) pairs against the lake's (two narrow columns), then the content
    of the few rows whose trajectory_id is stored with another record_id."""
    import pyarrow.parquet as pq

    files = ", ".join("'" + str(p).replace("'", "''") + "'" for p, _ in writer.parts)
    cond = " AND ".join(f'b."{n}" IS NOT DISTINCT FROM t."{n}"' for n in _CONTENT_CMP)
    with wh.connect() as con:
        candidates = con.execute(f"""
            SELECT DISTINCT b.record_id FROM (SELECT record_id, trajectory_id FROM read_parquet([{files}])) b
            JOIN (SELECT trajectory_id, record_id FROM trajectories) t
              ON t.trajectory_id = b.trajectory_id AND t.record_id <> b.record_id""").fetchall()
        if not candidates:
            return
        hits = con.execute(f"""
            SELECT DISTINCT b.record_id, b.source_file
            FROM (SELECT * FROM read_parquet([{files}]) WHERE record_id IN (SELECT unnest(?))) b
            JOIN trajectories t ON t.trajectory_id = b.trajectory_id AND t.record_id <> b.record_id AND {cond}
            WHERE t.tenant_id IS DISTINCT FROM b.tenant_id OR t.consent_id IS DISTINCT FROM b.consent_id""",
                           [[r for r, in candidates]]).fetchall()
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


def _has_predictions(f: Path) -> bool:
    """Whether the file's first 4 KiB, decoded (a gzipped or UTF-16 predictions file too), name a
    SWE-bench prediction: then the reports beside it are looked for."""
    from ratchet.readers.source import _encoding, sniff

    def named(head: bytes) -> bool:
        return b'"model_patch"' in head and b'"instance_id"' in head

    try:
        with open_regular(f) as fh:
            head = fh.read(4096)
        if sniff(head[:8]) is None and _encoding(head) is None:
            return named(head)   # plain UTF-8 (most files): the raw head is the decoded one
        got = b""
        with Source(f) as src:
            for b in src.chunks():
                got += b
                if len(got) >= 4096:
                    break
    except (Unreadable, SkipFile, OSError):
        return False
    return named(got[:4096])


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
