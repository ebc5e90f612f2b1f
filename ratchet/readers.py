"""File discovery and raw reading: every input becomes a stream of `Raw` items (payload bytes
plus where they came from), before any format is known. Decoding errors are items too, so the
caller quarantines them with their bytes instead of losing them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import orjson
import yaml

LINE_FORMATS = (".jsonl", ".ndjson")
DOC_FORMATS = (".json", ".traj")
TABLE_FORMATS = (".parquet",)
SIDECAR = "_batch.yaml"


@dataclass(slots=True)
class Raw:
    file: str
    line: int                   # 1-based line / element index / row number; 0 = the whole file
    offset: int                 # byte offset in the file
    payload: bytes              # exactly what was read
    obj: object = None          # decoded value when the reader already decoded it (JSON docs, Parquet)
    error: tuple[str, str] | None = None  # (code, detail) when the item is bad before decoding


def discover(paths: list[str | os.PathLike]) -> list[tuple[Path, Path]]:
    """Files under the given paths as (file, root it was found under), sorted, without hidden
    files or batch sidecars. A missing path raises: silently ingesting nothing hides typos."""
    out: list[tuple[Path, Path]] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"input path does not exist: {p}")
        if p.is_file():
            out.append((p.resolve(), p.resolve().parent))
            continue
        root = p.resolve()
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                if not f.startswith(".") and f != SIDECAR:
                    out.append((Path(dirpath) / f, root))
    seen, unique = set(), []
    for f, r in out:
        if f not in seen:
            seen.add(f)
            unique.append((f, r))
    return unique


def sidecar_for(file: Path, root: Path) -> dict:
    """Attribution from the nearest `_batch.yaml` between the file's folder and the input root."""
    d = file.parent
    while True:
        s = d / SIDECAR
        if s.is_file():
            try:
                data = yaml.safe_load(s.read_text()) or {}
            except yaml.YAMLError as e:
                raise ValueError(f"{s}: invalid YAML: {e}") from e
            if not isinstance(data, dict):
                raise ValueError(f"{s}: must be a mapping like 'tenant_id: acme'")
            return {k: _text(s, k, data.get(k) or data.get(k.removesuffix("_id"))) for k in ("tenant_id", "consent_id")}
        if d == root or d.parent == d:
            return {}
        d = d.parent


def _text(sidecar: Path, key: str, v) -> str | None:
    """YAML reads `tenant_id: 12345` as an int and `consent_id: 2026-09-01` as a date: ids are text."""
    import datetime

    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float, datetime.date)):
        raise ValueError(f"{sidecar}: {key} must be a string, got {type(v).__name__} {v!r:.40}")
    return v.isoformat() if isinstance(v, datetime.date) else str(v)


def read_lines(path: Path) -> Iterator[Raw]:
    offset = 0
    n = 0
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            start = offset
            offset += len(line)
            body = line.rstrip(b"\r\n")
            if not body.strip():
                continue  # blank lines hold no record
            yield Raw(str(path), n, start, body)
    if n == 0:
        yield Raw(str(path), 0, 0, b"", error=("empty_file", "the file is empty: no records"))


def range_lines(path: Path, start: int, end: int, first_line: int) -> tuple[list[tuple[bytes, int, int]], bool]:
    """(payload, line number, byte offset) of the non-blank lines of one newline-aligned range
    (tuples, not `Raw`s: most lines never need one), and whether the range holds no NUL byte and
    no `\\u0000` at all (two scans of the range instead of two per line)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(end - start)
    out = []
    offset = start
    for n, line in enumerate(data.split(b"\n"), first_line):
        at = offset
        offset += len(line) + 1
        body = line.rstrip(b"\r")
        if body.strip():
            out.append((body, n, at))
    return out, b"\x00" not in data and b"\\u0000" not in data


def read_document(path: Path) -> Iterator[Raw]:
    """A JSON document: one record, or an array / id-keyed object of records."""
    data = path.read_bytes()
    if not data.strip():
        yield Raw(str(path), 0, 0, data, error=("empty_file", "the file is empty: no records"))
        return
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        yield Raw(str(path), 0, 0, data)  # the record pipeline reports the decoding error
        return
    if isinstance(obj, list):
        for i, item in enumerate(obj, 1):
            yield Raw(str(path), i, 0, orjson.dumps(item), obj=item)
    else:
        yield Raw(str(path), 0, 0, data, obj=obj)


def read_parquet(path: Path) -> Iterator[Raw]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001  (any reader failure is a quarantinable file)
        yield Raw(str(path), 0, 0, path.read_bytes(), error=("unreadable_parquet", f"{type(e).__name__}: {e}"))
        return
    n = 0
    for batch in pf.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            n += 1
            yield Raw(str(path), n, 0, orjson.dumps(row, default=str), obj=_unflatten(row))
    if n == 0:
        yield Raw(str(path), 0, 0, b"", error=("empty_file", "the Parquet file has no rows"))


def _unflatten(row: dict) -> dict:
    """Parquet rows exported from the warehouse carry JSON text in `tools` / `extra`."""
    for k in ("messages", "tools", "approvals", "extra"):
        if isinstance(row.get(k), str):
            try:
                row[k] = orjson.loads(row[k])
            except orjson.JSONDecodeError:
                pass
    return row


def read_any(path: Path) -> Iterator[Raw]:
    name = path.name.lower()
    if name.endswith(LINE_FORMATS):
        return read_lines(path)
    if name.endswith(DOC_FORMATS):
        return read_document(path)
    if name.endswith(TABLE_FORMATS):
        return read_parquet(path)
    data = path.read_bytes()
    return iter([Raw(str(path), 0, 0, data, error=(
        "unsupported_file_type", f"{path.suffix or 'no extension'}: expected .jsonl, .ndjson, .json, .traj or .parquet"))])
