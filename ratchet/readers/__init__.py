"""File discovery and raw reading: every input becomes a stream of `Raw` items (payload bytes
plus where they came from), before any format is known. Decoding errors are items too, so the
caller quarantines them with their bytes instead of losing them.

Only regular files are opened, and always with O_NONBLOCK after a stat (a FIFO named `x.jsonl`
must never block the ingest that holds the lock); every other folder entry becomes a `Skipped`
with one reason. Compression (gzip, zstd, bz2, xz) is recognised by magic bytes as well as by
name, a UTF-8 BOM is dropped, UTF-16 is decoded, and lines are measured while they are read: a
line over the record limit is quarantined from its first bytes, never held whole."""
from __future__ import annotations

import codecs
import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import orjson
import yaml

LINE_FORMATS = (".jsonl", ".ndjson")
DOC_FORMATS = (".json", ".traj")
TABLE_FORMATS = (".parquet",)
SIDECAR = "_batch.yaml"
COMPRESSED = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"))
ARCHIVES = ((b"PK\x03\x04", "a zip archive"), (b"7z\xbc\xaf\x27\x1c", "a 7z archive"))
BOM_UTF8 = b"\xef\xbb\xbf"
RAW_CAP = 1 << 20           # bytes of an over-limit record or refused file kept in `quarantine.raw`
READ_CHUNK = 1 << 20


@dataclass(slots=True)
class Raw:
    file: str
    line: int                   # 1-based line / element index / row number; 0 = the whole file
    offset: int                 # byte offset in the file (in the decoded stream for compressed/UTF-16 files)
    payload: bytes              # exactly what was read (at most RAW_CAP bytes when `size` is set)
    obj: object = None          # decoded value when the reader already decoded it (JSON docs, Parquet)
    error: tuple[str, str] | None = None  # (code, detail) when the item is bad before decoding
    size: int | None = None     # the item's true length when `payload` holds only its first bytes
    sha256: str | None = None   # ...and the sha256 of all of it


@dataclass(slots=True, frozen=True)
class Skipped:
    """A folder entry that is not read: one reason per entry, recorded in `ingest_files`."""
    path: Path
    code: str                   # symlink_loop | dangling_symlink | not_regular_file | unreadable_file | unreadable_folder | vanished
    detail: str


class SkipFile(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _stat_error(path: Path, e: OSError) -> SkipFile:
    if e.errno == errno.ELOOP:
        return SkipFile("symlink_loop", f"symbolic link loop: {e.strerror}")
    if e.errno == errno.ENOENT:
        if os.path.islink(path):
            return SkipFile("dangling_symlink", f"symbolic link to a missing target ({os.readlink(path)})")
        return SkipFile("vanished", "the file disappeared before it was read")
    if e.errno in (errno.EACCES, errno.EPERM):
        return SkipFile("unreadable_file", f"permission denied: {e.strerror}")
    if e.errno == errno.ENXIO:
        return SkipFile("not_regular_file", "a socket or a device without a reader")
    return SkipFile("unreadable_file", f"{errno.errorcode.get(e.errno, e.errno)}: {e.strerror}")


def check_regular(path: Path) -> os.stat_result:
    """stat (following links) and require a regular file; raises SkipFile with the reason."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _stat_error(path, e) from None
    if not stat.S_ISREG(st.st_mode):
        raise SkipFile("not_regular_file", f"{_kind(st.st_mode)}, not a regular file")
    return st


def open_regular(path: Path) -> BinaryIO:
    """Open a file for reading only if it is a regular file. O_NONBLOCK: if the entry was swapped
    for a FIFO after it was found, opening it returns at once and fstat refuses it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise _stat_error(path, e) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SkipFile("not_regular_file", f"{_kind(st.st_mode)}, not a regular file")
    return os.fdopen(fd, "rb")


def discover(paths: list[str | os.PathLike]) -> tuple[list[tuple[Path, Path]], list[Skipped]]:
    """Regular files under the given paths as (file, root it was found under), sorted, without
    hidden files or batch sidecars; and every other entry (link loop, dangling link, FIFO,
    socket, device, unreadable file or folder) as a `Skipped` with its reason. Symlinked folders
    are followed once (a folder already visited is a loop). A missing input path raises:
    silently ingesting nothing hides typos."""
    out: list[tuple[Path, Path]] = []
    skipped: list[Skipped] = []

    def add(f: Path, root: Path) -> None:
        try:
            check_regular(f)
        except SkipFile as s:
            skipped.append(Skipped(f, s.code, s.detail))
            return
        out.append((f, root))

    for p in map(Path, paths):
        if not os.path.lexists(p):
            raise FileNotFoundError(f"input path does not exist: {p}")
        try:
            is_dir = p.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            f = Path(os.path.abspath(p))
            f = f.resolve() if f.exists() else f  # (a link loop or dangling link is reported as it is)
            add(f, f.parent)
            continue
        root = p.resolve()
        visited: set[tuple[int, int]] = set()

        def onerror(e: OSError) -> None:
            skipped.append(Skipped(Path(e.filename or root), "unreadable_folder", f"cannot list the folder: {e.strerror}"))

        for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=True):
            st = os.stat(dirpath)
            if (st.st_dev, st.st_ino) in visited:  # reached again through a symlink: a loop
                skipped.append(Skipped(Path(dirpath), "symlink_loop", "a symlinked folder that leads back to a visited folder"))
                dirnames[:] = []
                continue
            visited.add((st.st_dev, st.st_ino))
            keep = []
            for d in sorted(dirnames):
                if d.startswith("."):
                    continue
                full = Path(dirpath) / d
                try:
                    os.stat(full)
                    keep.append(d)
                except OSError as e:
                    s = _stat_error(full, e)
                    skipped.append(Skipped(full, s.code, s.detail))
            dirnames[:] = keep
            for f in sorted(filenames):
                if not f.startswith(".") and f != SIDECAR:
                    add(Path(dirpath) / f, root)
    seen, unique = set(), []
    for f, r in out:
        if f not in seen:
            seen.add(f)
            unique.append((f, r))
    return unique, skipped


def sidecar_for(file: Path, root: Path) -> dict:
    """Attribution from the nearest `_batch.yaml` between the file's folder and the input root."""
    d = file.parent
    while True:
        s = d / SIDECAR
        if s.is_file():
            try:
                with open_regular(s) as fh:
                    data = yaml.safe_load(fh.read(1 << 20).decode("utf-8-sig")) or {}
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                raise ValueError(f"{s}: invalid YAML: {e}") from e
            except SkipFile as e:
                raise ValueError(f"{s}: cannot read the sidecar: {e.detail}") from None
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


# --------------------------------------------------------------------------- decoding JSON
# orjson reads an integer beyond 64 bits as a float (123456789012345678901234567890 becomes
# 1.2345678901234568e+29): a payload with a run of 19+ digits is read by msgspec, which keeps
# every integer exact. 19 digits: the shortest integers outside int64 (-9.3e18).
_LONG_DIGITS = re.compile(rb"\d{19}")


def loads(data: bytes):
    """JSON bytes to Python values with every integer exact (raises ValueError subclasses)."""
    if _LONG_DIGITS.search(data):
        import msgspec

        try:
            return msgspec.json.decode(data)
        except msgspec.DecodeError as e:
            raise ValueError(str(e)) from None
        except RecursionError:
            pass  # nested too deeply for msgspec: orjson says so in its own words below
    return orjson.loads(data)


def dumps(obj, sort_keys: bool = False) -> bytes:
    """JSON bytes, integers beyond 64 bits written exactly (orjson refuses them: msgspec then)."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except orjson.JSONEncodeError as e:
        if "64-bit" not in str(e):
            raise
        import msgspec

        return msgspec.json.encode(obj, order="sorted" if sort_keys else None)


# --------------------------------------------------------------------------- byte sources
def inner_name(path: Path) -> str:
    """The file name without a compression suffix: `a.jsonl.gz` -> `a.jsonl`."""
    name = path.name.lower()
    for suf in COMPRESSED:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def sniff(head: bytes) -> str | None:
    return next((kind for magic, kind in MAGIC if head.startswith(magic)), None)


class Unreadable(Exception):
    """The byte stream of a file cannot be (fully) decoded: quarantined once, where it stopped."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


def _decompressed(fh: BinaryIO, kind: str) -> Iterator[bytes]:
    if kind == "gzip":
        return _gunzip(fh)
    if kind == "zstd":
        import zstandard

        return _raw_chunks(zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True))
    if kind == "bz2":
        import bz2

        return _raw_chunks(bz2.BZ2File(fh))
    import lzma

    return _raw_chunks(lzma.LZMAFile(fh))


def _gunzip(fh: BinaryIO) -> Iterator[bytes]:
    """gzip members one after another, yielding what decompresses as it comes (gzip.GzipFile
    drops a whole read when the file ends early: everything before the cut is kept here)."""
    import zlib

    d = zlib.decompressobj(wbits=31)
    try:
        while True:
            b = fh.read(READ_CHUNK)
            if not b:
                if not d.eof:
                    raise Unreadable("corrupt_compressed", "the gzip stream ends early: the file is truncated")
                return
            while b:
                out = d.decompress(b)
                if out:
                    yield out
                if not d.eof:
                    break
                b = d.unused_data
                if not b.strip(b"\x00"):  # only padding after the last member
                    return
                d = zlib.decompressobj(wbits=31)
    except zlib.error as e:
        raise Unreadable("corrupt_compressed", f"gzip: {e}") from None


def _raw_chunks(stream, size: int = READ_CHUNK) -> Iterator[bytes]:
    while True:
        try:
            b = stream.read(size)
        except (OSError, EOFError, ValueError) as e:  # gzip/bz2/lzma/zstd corruption or truncation
            raise Unreadable("corrupt_compressed", f"{type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001  (zstandard.ZstdError and friends)
            raise Unreadable("corrupt_compressed", f"{type(e).__name__}: {e}") from None
        if not b:
            return
        yield b


def _utf16(chunks: Iterator[bytes], encoding: str) -> Iterator[bytes]:
    dec = codecs.getincrementaldecoder(encoding)("strict")
    try:
        for b in chunks:
            text = dec.decode(b)
            if text:
                yield text.encode("utf-8", "surrogatepass")
        tail = dec.decode(b"", final=True)
    except UnicodeDecodeError as e:
        raise Unreadable("invalid_utf16", f"the file is UTF-16 ({encoding}) but {e.reason} near byte {e.start}") from None
    if tail:
        yield tail.encode("utf-8", "surrogatepass")


def _encoding(head: bytes) -> str | None:
    """None (UTF-8), a UTF-16 codec name, or raise Unreadable for an encoding not read."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        raise Unreadable("unsupported_encoding", "the file is UTF-32: re-encode it as UTF-8")
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"  # the BOM says which byte order; the decoder drops it
    if len(head) >= 4 and head[0] and not head[1] and head[2] and not head[3]:
        return "utf-16-le"
    if len(head) >= 4 and not head[0] and head[1] and not head[2] and head[3]:
        return "utf-16-be"
    return None


class Source:
    """The decoded UTF-8 bytes of one regular file: decompressed, BOM dropped, UTF-16 decoded.
    `chunks()` yields them in READ_CHUNK pieces (or raises Unreadable where the stream breaks)."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = open_regular(path)
        self.size = os.fstat(self.fh.fileno()).st_size
        head = self.fh.read(8)
        self.fh.seek(0)
        self.compression = sniff(head)
        self.archive = next((what for magic, what in ARCHIVES if head.startswith(magic)), None)
        self.encoding: str | None = None
        self.bom = False
        self._first: bytes = b""
        self._it = _decompressed(self.fh, self.compression) if self.compression else _raw_chunks(self.fh)
        self._error: Unreadable | None = None
        try:
            self._first = next(self._it, b"")
            while len(self._first) < 8:  # a decompressor may hand out a few bytes at a time
                more = next(self._it, b"")
                if not more:
                    break
                self._first += more
            self.encoding = _encoding(self._first)
        except Unreadable as e:
            self._error = e

    @property
    def plain(self) -> bool:
        """Uncompressed UTF-8: byte ranges of the file can be read directly (parallel path)."""
        return self.compression is None and self.encoding is None and self._error is None

    def chunks(self) -> Iterator[bytes]:
        if self._error is not None:
            raise self._error
        first = self._first
        if self.encoding is None and first.startswith(BOM_UTF8):
            first, self.bom = first[3:], True
        it = _chain(first, self._it)
        return _utf16(it, self.encoding) if self.encoding else it

    def read_all(self, limit: int) -> bytes:
        """Every decoded byte, or raise Unreadable('record_too_large') past `limit` bytes."""
        out, n = [], 0
        for b in self.chunks():
            n += len(b)
            if n > limit:
                raise Unreadable("record_too_large", f"the document is larger than {limit / 2**20:.0f} MiB once "
                                 "decoded: split it into JSONL (one record a line) or raise max_record_mb")
            out.append(b)
        return b"".join(out)

    def head_raw(self, code: str, detail: str, line: int = 0, offset: int = 0) -> Raw:
        """A whole-file refusal: the file's first RAW_CAP bytes, its size and sha256."""
        h = hashlib.sha256()
        self.fh.seek(0)
        head = self.fh.read(RAW_CAP)
        h.update(head)
        for b in iter(lambda: self.fh.read(READ_CHUNK), b""):
            h.update(b)
        return Raw(str(self.path), line, offset, head, error=(code, detail), size=self.size, sha256=h.hexdigest())

    def close(self) -> None:
        self.fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


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


# --------------------------------------------------------------------------- readers
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
