"""The document formats (.json, .traj): one record, an array of records, or a bare array of
chat messages (one record), read whole up to a limit."""
from __future__ import annotations

from collections.abc import Iterator

from ratchet.readers.json_codec import dumps, loads
from ratchet.readers.source import BOM_UTF8, Raw, Source, Unreadable


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
    if isinstance(obj, list) and not is_message_list(obj):
        for i, item in enumerate(obj, 1):
            yield Raw(path, i, 0, dumps(item), obj=item)
    else:
        yield Raw(path, 0, 0, data, obj=obj)
