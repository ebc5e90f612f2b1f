"""Byte sources: one regular file's bytes decoded to UTF-8 (decompressed by magic bytes as well
as by name: gzip, zstd, bz2, xz; a UTF-8 BOM dropped; UTF-16 decoded), and `Raw`, the item every
reader yields. A stream that breaks raises `Unreadable` where it broke."""
from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ratchet.readers.files import open_regular

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
        return _unzstd(fh)
    if kind == "bz2":
        import bz2

        return _raw_chunks(bz2.BZ2File(fh))  # BZ2File/LZMAFile.read(n) return at most n bytes
    import lzma

    return _raw_chunks(lzma.LZMAFile(fh))


def _gunzip(fh: BinaryIO) -> Iterator[bytes]:
    """gzip members one after another, yielding what decompresses as it comes (gzip.GzipFile
    drops a whole read when the file ends early: everything before the cut is kept here). At most
    READ_CHUNK bytes come out of one call: 1 MB of gzip can hold 1 GiB of newlines."""
    import zlib

    d = zlib.decompressobj(wbits=31)
    try:
        while True:
            b = fh.read(READ_CHUNK)
            if not b:
                if not d.eof:
                    raise Unreadable("corrupt_compressed", "the gzip stream ends early: the file is truncated")
                return
            while True:
                out = d.decompress(b, READ_CHUNK)
                if out:
                    yield out
                if d.eof:
                    b = d.unused_data
                    if not b.strip(b"\x00"):  # only padding after the last member
                        return
                    d = zlib.decompressobj(wbits=31)
                    continue
                b = d.unconsumed_tail
                # a full `out` may leave output inside zlib with no input left: ask again
                if not b and len(out) < READ_CHUNK:
                    break
    except zlib.error as e:
        raise Unreadable("corrupt_compressed", f"gzip: {e}") from None


ZSTD_MAGIC = 0xFD2FB528


def _zstd_extent(fh: BinaryIO) -> tuple[int, str | None]:
    """How many leading bytes of a zstd file a decoder should be fed, and what is wrong with the
    rest (None: nothing). Walks frame and block headers only (RFC 8878), seeking over block
    bodies: zstandard's stream reader ends quietly on a truncated frame and drops the output of
    the read in which it meets junk, so the file's shape is checked before it is decoded."""
    size = os.fstat(fh.fileno()).st_size
    pos = 0
    frames = 0
    try:
        while pos < size:
            fh.seek(pos)
            head = fh.read(4)
            magic = int.from_bytes(head, "little") if len(head) == 4 else None
            if magic is not None and magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable: 4-byte length, data
                n = fh.read(4)
                if len(n) < 4 or pos + 8 + int.from_bytes(n, "little") > size:
                    return size, f"the zstd stream ends early inside a skippable frame at byte {pos}"
                pos += 8 + int.from_bytes(n, "little")
                frames += 1
                continue
            if magic != ZSTD_MAGIC:
                rest = size - pos
                if rest <= READ_CHUNK and not (head + fh.read(rest)).strip(b"\x00"):
                    return pos, None  # zero padding after the last frame, as gzip allows
                return pos, f"junk after zstd frame {frames}: {rest} bytes from byte {pos} are not zstd"
            fhd = fh.read(1)
            if not fhd:
                return size, f"the zstd stream ends early in frame {frames + 1}'s header: the file is truncated"
            d = fhd[0]
            if d & 0x08:
                return pos, f"zstd frame {frames + 1} at byte {pos} has a reserved header bit set"
            single = bool(d & 0x20)
            fcs = (1 if single else 0, 2, 4, 8)[d >> 6]
            hdr = 4 + 1 + (0 if single else 1) + (0, 1, 2, 4)[d & 3] + fcs
            at = pos + hdr
            while True:
                fh.seek(at)
                bh = fh.read(3)
                if len(bh) < 3:
                    return size, f"the zstd stream ends early in frame {frames + 1}: the file is truncated"
                v = int.from_bytes(bh, "little")
                kind, n = (v >> 1) & 3, v >> 3
                if kind == 3:
                    return size, f"zstd frame {frames + 1} has a reserved block type at byte {at}"
                at += 3 + (1 if kind == 1 else n)
                if at > size:
                    return size, f"the zstd stream ends early in frame {frames + 1}: the file is truncated"
                if v & 1:
                    break
            at += 4 if d & 0x04 else 0  # the content checksum
            if at > size:
                return size, f"the zstd stream ends early in frame {frames + 1}'s checksum: the file is truncated"
            pos = at
            frames += 1
        return pos, None
    finally:
        fh.seek(0)


class _Capped:
    """The first `left` bytes of a file, for a decoder that must not read past them."""

    def __init__(self, fh: BinaryIO, left: int):
        self.fh, self.left = fh, left

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        b = self.fh.read(n) if n else b""
        self.left -= len(b)
        return b


def _unzstd(fh: BinaryIO) -> Iterator[bytes]:
    """zstd frames one after another, READ_CHUNK bytes at most a read. A file that is cut short or
    followed by junk yields everything that decodes, then raises where it breaks (like gzip)."""
    import zstandard

    end, problem = _zstd_extent(fh)
    reader = zstandard.ZstdDecompressor().stream_reader(_Capped(fh, end), read_across_frames=True)
    yield from _raw_chunks(reader)
    if problem:
        raise Unreadable("corrupt_compressed", problem)


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
