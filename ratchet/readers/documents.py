"""The document formats (.json, .traj): one record, an array of records, or a bare array of
chat messages (one record), read whole up to a limit."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator

from ratchet.readers.json_codec import (
    duplicate_key,
    dumps,
    dumps_pairs,
    first_duplicate,
    loads,
    parse_pairs,
)
from ratchet.readers.source import BOM_UTF8, RAW_CAP, Raw, Source, Unreadable

DUPLICATE = ("the key {} is written twice in one object: readers disagree on which value wins (this one kept "
             "the last), so the record is kept here as it came")


def is_message_list(obj) -> bool:
    """A bare JSON array of chat messages (one conversation), not an array of records."""
    return (isinstance(obj, list) and bool(obj) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "messages" not in m and "conversations" not in m
        for m in obj))


def read_document(src: Source, max_bytes: int) -> Iterator[Raw]:
    """A JSON document: one record, an array of records, or a bare array of chat messages (one
    record). Documents are read whole, up to max(4 x the record limit, 128 MiB) once decoded."""
    path = str(src.path)
    try:
        data = src.read_all(max(4 * max_bytes, 128 << 20))
    except Unreadable as e:
        yield src.head_raw(e.code, e.detail)
        return
    if data.startswith(BOM_UTF8):
        data = data[3:]
    if not data.strip():
        yield Raw(path, 0, 0, data, error=("empty_file", "the file is empty: no records"))
        return
    try:
        obj = loads(data)
    except ValueError:
        yield Raw(path, 0, 0, data)  # the record pipeline reports the decoding error
        return
    many = isinstance(obj, list) and not is_message_list(obj)
    try:
        dup = duplicate_key(data, obj)
    except RecursionError:
        yield _refused(path, data, "too_deep", "the document nests too deeply to read")
        return
    pairs = parse_pairs(data) if dup is not None and many else None  # which elements repeat a key
    if dup is not None and not (isinstance(pairs, list) and len(pairs) == len(obj)):
        yield _refused(path, data, "duplicate_key", DUPLICATE.format(dup))
        return
    if many:
        for i, item in enumerate(obj, 1):
            bad = first_duplicate(pairs[i - 1]) if pairs is not None else None
            if bad is not None:
                yield Raw(path, i, 0, dumps_pairs(pairs[i - 1]), error=("duplicate_key", DUPLICATE.format(bad)))
                continue
            try:
                text = dumps(item)
            except Exception:  # noqa: BLE001  (nested past what the encoder writes)
                yield _refused(path, data, "too_deep", f"element {i} nests too deeply to read", line=i)
                continue
            yield Raw(path, i, 0, text, obj=item)
    else:
        yield Raw(path, 0, 0, data, obj=obj)


def _refused(path: str, data: bytes, code: str, detail: str, line: int = 0) -> Raw:
    """The whole document refused: kept whole if it is small, else its first RAW_CAP bytes with
    its length and digest (as any over-limit item)."""
    if len(data) <= RAW_CAP:
        return Raw(path, line, 0, data, error=(code, detail))
    return Raw(path, line, 0, data[:RAW_CAP], error=(code, f"{detail}; the document's first bytes are kept"),
               size=len(data), sha256=hashlib.sha256(data).hexdigest())
