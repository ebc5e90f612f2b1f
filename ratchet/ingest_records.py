"""One chunk of records from one file -> stored rows + quarantined records. Pure and picklable:
runs inline for small files and in spawned workers (`ingest_ranges`) for big ones."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from pathlib import Path

import orjson
import pyarrow as pa

from ratchet import adapters
from ratchet.adapters import swebench
from ratchet.contract import CONTENT_NAMES, RecordError, normalise
from ratchet.native import fast_values
from ratchet.readers import Raw, unflatten
from ratchet.readers import loads as _loads
from ratchet.readers.documents import DUPLICATE
from ratchet.readers.json_codec import duplicate_key, too_deep
from ratchet.warehouse import STORED_SCHEMA


@dataclass
class FileContext:
    """What a worker needs to normalise one file's records (picklable)."""
    file: Path
    attribution: dict
    max_bytes: int
    reports: dict
    batch_id: str
    now: datetime


@dataclass
class ChunkResult:
    n_read: int = 0
    table: pa.Table | None = None                # STORED_SCHEMA rows (inline path)
    staged: Path | None = None                   # ...or a Parquet part a worker wrote (parallel path)
    ids: list | None = None                      # record_ids of the staged part, in order
    bad: list = field(default_factory=list)      # (Raw, code, detail, format)
    formats: Counter = field(default_factory=Counter)
    reports_joined: int = 0
    fast: int = 0                                # rows that took the typed fast path


def normalise_chunk(items: list, ctx: FileContext, nul_free: bool = False) -> ChunkResult:
    """Decode, detect, adapt and validate a chunk of records from one file. Pure: runs in worker
    processes. Items are `Raw`s, or (payload, line, byte offset) tuples for the lines of a JSONL
    range: a `Raw` is only built for a line that leaves the fast path. `nul_free`: the caller
    found no NUL byte or `\\u0000` in the whole range, so lines need no search of their own."""
    import gc

    gc_was = gc.isenabled()
    gc.disable()  # millions of short-lived dicts: the cyclic GC alone cost ~3x in loads (measured)
    try:
        rows, lines, res = [], [], ChunkResult(n_read=len(items))
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
                obj = decode_record(raw, max_bytes)
                fmt = adapters.exported_format(obj)
                exported = fmt is not None
                if exported:  # a warehouse row read back: re-normalised as its own format
                    native = unflatten(dict(obj))
                else:
                    fmt = adapters.detect(obj)
                    native = adapters.to_native(fmt, obj, ctx.file, ctx.reports)
                if fmt == swebench.NAME and native["extra"]["report"]["found"]:
                    res.reports_joined += 1
                for k in ("tenant_id", "consent_id"):  # the record's own value wins over the batch's
                    if not native.get(k) and attribution.get(k):
                        native = {**native, k: attribution[k]}
                outcome = native.get("outcome")
                if attribution.get("accepted") is not None and (outcome is None or (
                        isinstance(outcome, dict) and outcome.get("accepted") is None)):
                    native = {**native, "outcome": {**(outcome or {}), "accepted": attribution["accepted"]}}
                if attribution.get("ended_at") and not native.get("started_at") and not native.get("ended_at"):
                    native = {**native, "ended_at": attribution["ended_at"]}
                row = normalise(native, fmt, allow_empty_messages=fmt == swebench.NAME,
                                derive_ids=fmt in adapters.DERIVE_IDS, exported=exported)
            except RecordError as e:
                res.bad.append((raw, e.code, e.detail, fmt))
                continue
            except RecursionError:
                res.bad.append((raw, "too_deep", "the record nests too deeply to read", fmt))
                continue
            except Exception as e:  # noqa: BLE001  (an adapter bug must not lose the batch: quarantine, say what)
                if isinstance(e, orjson.JSONEncodeError) and too_deep(e):
                    # orjson reads 1,024 levels and writes 255: an adapter writing part of a record
                    # (a hashed id, tool arguments) meets the second limit; the input's depth, no bug
                    res.bad.append((raw, "too_deep", f"the record nests deeper than JSON is written here "
                                    f"(255 levels): {e}", fmt))
                    continue
                res.bad.append((raw, "unexpected_error", f"{type(e).__name__}: {e}"[:500], fmt))
                continue
            res.formats[fmt] += 1
            rows.append(as_values(row))
            lines.append(line)
        res.fast = len(rows) - sum(res.formats.values())
        if res.fast:
            res.formats[adapters.NATIVE] += res.fast
        res.table = rows_table(rows, lines, ctx)
        return res
    finally:
        if gc_was:
            gc.enable()


as_values = itemgetter(*CONTENT_NAMES)  # a normalised row dict as a tuple in column order


def rows_table(rows: list[tuple], lines: list[int], ctx: FileContext) -> pa.Table:
    """Value tuples (CONTENT_NAMES order) to a table in the stored schema, column by column:
    transposing tuples with zip and converting whole columns cost ~40% less than from_pylist."""
    n, field = len(rows), STORED_SCHEMA.field
    columns = list(zip(*rows)) if rows else [()] * len(CONTENT_NAMES)
    cols = [pa.array(c, type=field(k).type) for k, c in zip(CONTENT_NAMES, columns)]
    cols += [pa.array([str(ctx.file)] * n, pa.string()), pa.array(lines, pa.int64()),
             pa.array([ctx.batch_id] * n, pa.string()), pa.array([ctx.now] * n, field("ingested_at").type)]
    return pa.Table.from_arrays(cols, schema=STORED_SCHEMA)


def normalise_range(path: Path, start: int, end: int, first_line: int, ctx: FileContext,
                     staged: Path) -> ChunkResult:
    """Worker: read one newline-aligned byte range of a JSONL file, normalise it and write the
    rows as a staged Parquet part. Only ids and bad records travel back to the parent."""
    from ratchet.readers import range_lines
    from ratchet.warehouse import write_part

    lines, nul_free = range_lines(path, start, end, first_line)
    res = normalise_chunk(lines, ctx, nul_free)
    table, res.table = res.table, None
    res.ids = table.column("record_id").to_pylist()
    if res.ids:
        write_part(table, staged)
        res.staged = staged
    return res





# `\u0000` escapes a NUL only after an even number of backslashes: `\\u0000` is the text \u0000.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def decode_record(raw: Raw, max_bytes: int):
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
        obj = _loads(raw.payload)
    except ValueError as e:  # orjson.JSONDecodeError, or msgspec's error for payloads with long digit runs
        try:
            raw.payload.decode("utf-8")
        except UnicodeDecodeError as u:
            raise RecordError("invalid_utf8", f"byte {u.start}: {u.reason}") from None
        msg = str(e)
        if too_deep(e):
            raise RecordError("too_deep", f"the record nests deeper than JSON is read here (1024 levels): {msg}") from None
        # valid JSON numbers no reader here can hold: msgspec's integers past its limit, orjson's
        # floats past a double's (1e999, read by some parsers as infinity, which JSON cannot write back)
        if "out of range" in msg or "is infinity" in msg:
            raise RecordError("out_of_range", f"a number cannot be represented: {msg}") from None
        truncated = "EOF" in msg or "end of" in msg.lower() or "truncated" in msg
        raise RecordError("truncated_json" if truncated else "invalid_json", msg) from None
    check_keys(raw.payload, obj)
    return obj


def check_keys(payload: bytes, obj) -> None:
    """Refuse a record that writes a key twice in one object (RecordError duplicate_key)."""
    try:
        dup = duplicate_key(payload, obj)
    except RecursionError:
        raise RecordError("too_deep", "the record nests too deeply to read") from None
    if dup is not None:
        raise RecordError("duplicate_key", DUPLICATE.format(dup))
