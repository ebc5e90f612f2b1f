"""The table format (Parquet) and rows exported from the warehouse, whose nested columns are
JSON text."""
from __future__ import annotations

from collections.abc import Iterator

import orjson

from ratchet.readers.json_codec import loads
from ratchet.readers.source import Raw, Source, Unreadable


def read_parquet(src: Source, max_bytes: int) -> Iterator[Raw]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(src.path)
    try:
        pf = pq.ParquetFile(src.fh if src.plain else pa.BufferReader(src.read_all(max(4 * max_bytes, 1 << 30))))
        batches = pf.iter_batches(batch_size=4096)
        n = 0
        for batch in batches:
            for row in batch.to_pylist():
                n += 1
                yield Raw(path, n, 0, _dump_row(row), obj=unflatten(row))
    except Unreadable as e:
        yield src.head_raw(e.code, e.detail)
        return
    except Exception as e:  # noqa: BLE001  (any reader failure is a quarantinable file)
        yield src.head_raw("unreadable_parquet", f"{type(e).__name__}: {e}"[:500])
        return
    if n == 0:
        yield Raw(path, 0, 0, b"", error=("empty_file", "the Parquet file has no rows"))


def _dump_row(row: dict) -> bytes:
    try:
        return orjson.dumps(row, default=str)
    except orjson.JSONEncodeError:
        import msgspec

        return msgspec.json.encode(row, enc_hook=str)


def unflatten(row: dict) -> dict:
    """Rows exported from the warehouse (Parquet, or DuckDB's JSON export) carry JSON text in
    `messages` / `tools` / `approvals` / `extra`."""
    for k in ("messages", "tools", "approvals", "extra"):
        if isinstance(row.get(k), str):
            try:
                row[k] = loads(row[k].encode())
            except ValueError:
                pass
    return row
