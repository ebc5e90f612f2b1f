"""The line formats (JSONL, NDJSON): lines measured while they are read, so a line over the
record limit is quarantined from its first bytes and never held whole; and the byte ranges of a
plain file that parallel workers read."""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

from ratchet.readers.files import open_regular
from ratchet.readers.source import RAW_CAP, READ_CHUNK, Raw, Unreadable


def too_large(n: int, max_bytes: int) -> str:
    return (f"{n / 2**20:.1f} MiB exceeds the {max_bytes / 2**20:.0f} MiB limit (raise max_record_mb to accept it); "
            f"the first {min(n, RAW_CAP)} bytes are kept")


NONBLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")  # a byte that bytes.strip() keeps
BLANK_LINE = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")  # a newline, then a blank line (searched newline to newline)
DENSE = 64                    # fewer bytes a line than this on average: skip blank runs in C


def iter_lines(chunks: Iterator[bytes], file: str, max_bytes: int, offset: int = 0) -> Iterator:
    """(payload, line number, byte offset) for each non-blank line, measured while read: a line
    over `max_bytes` becomes a `Raw` with error record_too_large holding its first RAW_CAP bytes,
    its length and sha256, and is never held whole. A stream that breaks becomes a `Raw` error
    at the line where it broke. Memory: about one chunk plus one line up to the limit; runs of
    blank lines are counted, not split into lists (1 MB of gzip holds a billion newlines)."""
    n = 0                         # lines finished (or being drained, once `long` is set)
    parts: list[bytes] = []       # the start of the current line (no newline seen yet)...
    plen = 0                      # ...and its length
    long: list | None = None      # [head, sha, length, line, offset] while draining an over-limit line
    at = offset                   # where the current line starts
    any_line = False
    try:
        for chunk in chunks:
            pos = 0
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
                pos = i + 1
            last = chunk.rfind(b"\n", pos)
            if last >= 0:
                any_line = True
                if parts:             # the line begun in earlier chunks ends here
                    i = chunk.find(b"\n", pos)
                    parts.append(chunk[pos:i])
                    line = b"".join(parts)
                    parts, plen = [], 0
                    n += 1
                    start, at = at, at + len(line) + 1
                    item = _line(file, line, n, start, max_bytes)
                    if item is not None:
                        yield item
                    pos = i + 1
                if pos <= last:
                    for item in _whole_lines(chunk, pos, last + 1, n, at, file, max_bytes):
                        if type(item) is int:
                            n, at = item, at + last + 1 - pos
                        else:
                            yield item
                pos = last + 1
            if pos < len(chunk):
                tail = chunk[pos:] if pos else chunk
                parts.append(tail)
                plen += len(tail)
                if plen > max_bytes:
                    n += 1
                    any_line = True
                    sha, head = hashlib.sha256(), b""
                    for p in parts:
                        sha.update(p)
                        if len(head) < RAW_CAP:
                            head += p[: RAW_CAP - len(head)]
                    long = [head, sha, plen, n, at]
                    parts, plen = [], 0
    except Unreadable as e:
        if long is not None:
            yield _long_raw(file, long, max_bytes)
        elif parts:
            yield Raw(file, n + 1, at, b"".join(parts))  # what was read of the line the stream broke in
        yield Raw(file, n + 1 + bool(parts), at + plen, b"", error=(e.code, e.detail))
        return
    if long is not None:
        yield _long_raw(file, long, max_bytes)
    elif parts:
        n += 1
        any_line = True
        item = _line(file, b"".join(parts), n, at, max_bytes)
        if item is not None:
            yield item
    if not any_line:
        yield Raw(file, 0, 0, b"", error=("empty_file", "the file is empty: no records"))


def _line(file: str, line: bytes, n: int, start: int, max_bytes: int):
    """One whole line: (payload, n, start), a record_too_large `Raw`, or None when blank."""
    body = line[:-1] if line.endswith(b"\r") else line
    if len(body) > max_bytes:
        return Raw(file, n, start, body[:RAW_CAP], error=("record_too_large", too_large(len(body), max_bytes)),
                   size=len(body), sha256=hashlib.sha256(body).hexdigest())
    return (body, n, start) if body.strip() else None


def _whole_lines(chunk: bytes, pos: int, end: int, n: int, at: int, file: str, max_bytes: int) -> Iterator:
    """The items of the whole lines in chunk[pos:end] (which ends with a newline), numbered from
    n + 1 at offset `at`; last, the number of the last of them (an int). Lines of normal length
    are split; where they are short on average, runs of blank lines are found with regex searches
    and counted with bytes.count, and the runs of other lines between them are split: a chunk of
    newlines costs a few C calls, not one Python step a line."""
    sparse = chunk.count(b"\n", pos, end) * DENSE <= end - pos
    for s, e, blank in ((pos, end, False),) if sparse else _runs(chunk, pos, end, max_bytes):
        if blank:
            n += chunk.count(b"\n", s, e)
            at += e - s
            continue
        for line in chunk[s:e - 1].split(b"\n"):
            n += 1
            body = line[:-1] if line.endswith(b"\r") else line
            if len(body) <= max_bytes and body.strip():
                yield body, n, at
            elif len(body) > max_bytes:
                yield _line(file, line, n, at, max_bytes)
            at += len(line) + 1
    yield n


def _runs(chunk: bytes, p: int, end: int, max_bytes: int) -> Iterator[tuple[int, int, bool]]:
    """chunk[p:end] (whole lines) as (start, end, blank) runs of blank and of other lines. A blank
    run longer than `max_bytes` is handed back as not blank, so its lines are measured one by one
    (a blank line over the limit is still record_too_large)."""
    while p < end:
        m = NONBLANK.search(chunk, p, end)
        s = end if m is None else chunk.rfind(b"\n", p, m.start()) + 1 or p  # where its line starts
        if s > p:
            yield p, s, s - p <= max_bytes
        if m is None:
            return
        b = BLANK_LINE.search(chunk, s, end)  # the lines from s run up to the next blank one
        p = end if b is None else b.start() + 1
        yield s, p, False


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
