"""The line formats (JSONL, NDJSON): lines measured while they are read, so a line over the
record limit is quarantined from its first bytes and never held whole; and the byte ranges of a
plain file that parallel workers read."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from ratchet.readers.files import open_regular
from ratchet.readers.source import RAW_CAP, READ_CHUNK, Raw, Unreadable


def too_large(n: int, max_bytes: int) -> str:
    return (f"{n / 2**20:.1f} MiB exceeds the {max_bytes / 2**20:.0f} MiB limit (raise max_record_mb to accept it); "
            f"the first {min(n, RAW_CAP)} bytes are kept")


def iter_lines(chunks: Iterator[bytes], file: str, max_bytes: int, offset: int = 0) -> Iterator:
    """(payload, line number, byte offset) for each non-blank line, measured while read: a line
    over `max_bytes` becomes a `Raw` with error record_too_large holding its first RAW_CAP bytes,
    its length and sha256, and is never held whole. A stream that breaks becomes a `Raw` error
    at the line where it broke. Memory: about one chunk plus one line up to the limit."""
    n = 0
    pending = b""                 # the start of the current line (no newline seen yet)
    long: list | None = None      # [head, sha, length, line, offset] while draining an over-limit line
    at = offset
    any_line = False
    try:
        for chunk in chunks:
            if long is not None:
                i = chunk.find(b"\n")
                part = chunk if i < 0 else chunk[:i]
                if len(long[0]) < RAW_CAP:
                    long[0] += part[: RAW_CAP - len(long[0])]
                long[1].update(part)
                long[2] += len(part)
                if i < 0:
                    continue
                yield _long_raw(file, long, max_bytes)
                at = long[4] + long[2] + 1
                long = None
                chunk = chunk[i + 1:]
            data = pending + chunk if pending else chunk
            lines = data.split(b"\n")
            pending = lines.pop()
            for line in lines:
                n += 1
                any_line = True
                start = at
                at += len(line) + 1
                body = line[:-1] if line.endswith(b"\r") else line
                if len(body) > max_bytes:
                    yield Raw(file, n, start, body[:RAW_CAP], error=("record_too_large", too_large(len(body), max_bytes)),
                              size=len(body), sha256=hashlib.sha256(body).hexdigest())
                elif body.strip():
                    yield body, n, start
            if len(pending) > max_bytes:
                n += 1
                any_line = True
                long = [pending[:RAW_CAP], hashlib.sha256(pending), len(pending), n, at]
                pending = b""
    except Unreadable as e:
        if long is not None:
            yield _long_raw(file, long, max_bytes)
        elif pending:
            yield Raw(file, n + 1, at, pending)  # what was read of the line the stream broke in
        yield Raw(file, n + 1 + bool(pending), at + len(pending), b"", error=(e.code, e.detail))
        return
    if long is not None:
        yield _long_raw(file, long, max_bytes)
    elif pending:
        n += 1
        any_line = True
        body = pending[:-1] if pending.endswith(b"\r") else pending
        if body.strip():
            yield body, n, at
    if not any_line:
        yield Raw(file, 0, 0, b"", error=("empty_file", "the file is empty: no records"))


def _long_raw(file: str, long: list, max_bytes: int) -> Raw:
    head, sha, length, line, offset = long
    body = head[:-1] if length <= RAW_CAP and head.endswith(b"\r") else head
    return Raw(file, line, offset, body, error=("record_too_large", too_large(length, max_bytes)),
               size=length, sha256=sha.hexdigest())


def range_lines(path: Path, start: int, end: int, first_line: int) -> tuple[list[tuple[bytes, int, int]], bool]:
    """(payload, line number, byte offset) of the non-blank lines of one newline-aligned range
    of a plain file (tuples, not `Raw`s: most lines never need one), and whether the range holds
    no NUL byte and no `\\u0000` at all (two scans of the range instead of two per line)."""
    with open_regular(path) as fh:
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


def long_line_raw(path: Path, start: int, end: int, line: int, max_bytes: int) -> Raw:
    """An over-limit line of a plain file as a `Raw`: its first RAW_CAP bytes, length and sha256,
    read in READ_CHUNK pieces."""
    h = hashlib.sha256()
    with open_regular(path) as fh:
        fh.seek(start)
        head = fh.read(min(RAW_CAP, end - start))
        h.update(head)
        left = end - start - len(head)
        while left > 0:
            b = fh.read(min(READ_CHUNK, left))
            if not b:
                break
            h.update(b)
            left -= len(b)
    n = end - start
    return Raw(str(path), line, start, head, error=("record_too_large", too_large(n, max_bytes)), size=n,
               sha256=h.hexdigest())
