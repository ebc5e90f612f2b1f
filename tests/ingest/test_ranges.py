"""`split_ranges` cuts a large JSONL file for the worker processes: newline-aligned ranges that
cover every byte once, in order, with each range's first line number, and every line over the
record limit as a "long" piece of its own (quarantined from its first bytes, read by nobody),
whether it sits inside a block, across blocks, or ends the file without a newline."""
import hashlib

import pytest

from ratchet.ingest_ranges import split_ranges

LIMIT = 40


def _file(tmp_path, lines: list[bytes], final_newline: bool):
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    p = tmp_path / "f.jsonl"
    p.write_bytes(data)
    return p, data


def _check(pieces, data: bytes, lines: list[bytes]):
    """Pieces tile the file; each range starts a line (its number right) and holds no long line;
    the long pieces are exactly the lines over the limit."""
    at = 0
    starts = {}
    off = 0
    for i, ln in enumerate(lines, 1):
        starts[off] = i
        off += len(ln) + 1
    longs = []
    for kind, s, e, first in pieces:
        assert s == at and starts[s] == first, (kind, s, e, first)
        if kind == "long":
            longs.append(first)
            assert e - s > LIMIT
            at = e + 1 if e < len(data) else e              # the newline after a long line is its own
        else:
            assert kind == "range" and data[s:e].count(b"\n") >= (1 if e < len(data) else 0)
            assert all(len(x) <= LIMIT for x in data[s:e].split(b"\n"))
            at = e
    assert at == len(data)
    assert longs == [i for i, ln in enumerate(lines, 1) if len(ln) > LIMIT]


@pytest.mark.parametrize("final_newline", [True, False])
@pytest.mark.parametrize("target", [16, 64, 1 << 10])
def test_ranges_tile_the_file_and_set_long_lines_apart(tmp_path, target, final_newline):
    lines = [b'{"n": %d}' % i for i in range(30)]
    lines[4] = b"x" * 100            # inside the file, across blocks of 16 or 64 bytes
    lines[5] = b"y" * (LIMIT + 1)    # right after another long line
    lines[17] = b"z" * 41
    lines.append(b"w" * 90)          # the last line: long, with or without its newline
    p, data = _file(tmp_path, lines, final_newline)
    sha = hashlib.sha256()
    pieces = list(split_ranges(p, target, LIMIT, sha))
    _check(pieces, data, lines)
    assert sha.hexdigest() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("final_newline", [True, False])
def test_a_file_without_long_lines_is_ranges_only(tmp_path, final_newline):
    lines = [b'{"n": %d}' % i for i in range(50)]
    p, data = _file(tmp_path, lines, final_newline)
    pieces = list(split_ranges(p, 64, LIMIT))
    _check(pieces, data, lines)
    assert {k for k, *_ in pieces} == {"range"} and len(pieces) > 1


@pytest.mark.parametrize("first", [LIMIT, LIMIT + 1])
@pytest.mark.parametrize("target", [16, 1 << 10])
def test_a_first_or_last_line_at_the_limit_is_a_range_and_one_byte_over_is_long(tmp_path, target, first):
    """A first line one byte over the limit is long, one at the limit is a range, whether or not
    the first block holds its newline; so is a last line without a newline."""
    lines = [b"a" * first] + [b'{"n": %d}' % i for i in range(5)]
    p, data = _file(tmp_path, lines, True)
    pieces = list(split_ranges(p, target, LIMIT))
    _check(pieces, data, lines)
    assert pieces[0][0] == ("long" if first > LIMIT else "range")
    # the same bound for a last line without a newline
    lines = [b'{"n": %d}' % i for i in range(5)] + [b"a" * first]
    p, data = _file(tmp_path, lines, False)
    pieces = list(split_ranges(p, target, LIMIT))
    _check(pieces, data, lines)
    assert pieces[-1][0] == ("long" if first > LIMIT else "range")
