"""File discovery and raw reading: every input becomes a stream of `Raw` items (payload bytes
plus where they came from), before any format is known. Decoding errors are items too, so the
caller quarantines them with their bytes instead of losing them.

Only regular files are opened, and always with O_NONBLOCK after a stat (a FIFO named `x.jsonl`
must never block the ingest that holds the lock); every other folder entry becomes a `Skipped`
with one reason. Compression (gzip, zstd, bz2, xz) is recognised by magic bytes as well as by
name, a UTF-8 BOM is dropped, UTF-16 is decoded, and lines are measured while they are read: a
line over the record limit is quarantined from its first bytes, never held whole.

One module per concern (every name stays importable from `ratchet.readers`): `files` (discovery,
safe opening, the batch sidecar), `source` (decoding a file's bytes; `Raw`), `json_codec`
(`loads`/`dumps`), and a reader per format family: `lines` (.jsonl, .ndjson), `documents`
(.json, .traj), `tables` (.parquet). `read_any` picks the reader."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ratchet.readers.documents import is_message_list, read_document
from ratchet.readers.files import (
    SIDECAR,
    SkipFile,
    Skipped,
    check_regular,
    discover,
    open_regular,
    sidecar_for,
)
from ratchet.readers.json_codec import dumps, loads
from ratchet.readers.lines import iter_lines, long_line_raw, range_lines, too_large
from ratchet.readers.source import (
    ARCHIVES,
    BOM_UTF8,
    COMPRESSED,
    MAGIC,
    RAW_CAP,
    READ_CHUNK,
    Raw,
    Source,
    Unreadable,
    inner_name,
    sniff,
)
from ratchet.readers.tables import read_parquet, unflatten

LINE_FORMATS = (".jsonl", ".ndjson")
DOC_FORMATS = (".json", ".traj")
TABLE_FORMATS = (".parquet",)

__all__ = [
    "ARCHIVES", "BOM_UTF8", "COMPRESSED", "DOC_FORMATS", "LINE_FORMATS", "MAGIC", "RAW_CAP", "READ_CHUNK",
    "SIDECAR", "TABLE_FORMATS", "Raw", "SkipFile", "Skipped", "Source", "Unreadable", "check_regular",
    "discover", "dumps", "inner_name", "is_message_list", "iter_lines", "loads", "long_line_raw",
    "open_regular", "range_lines", "read_any", "read_document", "read_parquet", "sidecar_for", "sniff",
    "too_large", "unflatten",
]


def read_any(path: Path, max_bytes: int = 32 << 20) -> Iterator[Raw]:
    """Every item of one regular file (raises SkipFile if it is not one, or cannot be opened)."""
    src = Source(path)
    return _read(src, max_bytes)


def _read(src: Source, max_bytes: int) -> Iterator[Raw]:
    with src:
        name = inner_name(src.path)
        if src.archive:
            yield src.head_raw("unsupported_file_type", f"{src.archive}: unpack it and ingest the files inside")
        elif src._error is not None:
            yield src.head_raw(src._error.code, src._error.detail)
        elif name.endswith(LINE_FORMATS):
            yield from iter_lines(src.chunks(), str(src.path), max_bytes)
        elif name.endswith(DOC_FORMATS):
            yield from read_document(src, max_bytes)
        elif name.endswith(TABLE_FORMATS):
            yield from read_parquet(src, max_bytes)
        else:
            yield src.head_raw("unsupported_file_type", f"{Path(name).suffix or 'no extension'}: expected .jsonl, "
                               ".ndjson, .json, .traj or .parquet (optionally .gz, .zst, .bz2 or .xz)")
