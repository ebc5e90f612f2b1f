"""JSON bytes <-> Python values with every integer exact (orjson, msgspec where it must)."""
from __future__ import annotations

import re

import orjson

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


def duplicate_key(payload: bytes, obj) -> str | None:
    """Where `payload` (JSON text that decoded to `obj`) writes one key twice in an object, as a
    path (`messages[2].content`), or None. orjson and msgspec keep the last value silently,
    DuckDB's json_extract the first, its read_json refuses: such a record means different things
    to different readers.

    The common case costs one encode and two byte counts: re-encoding the decoded value writes
    each kept key with its colon and every string as it was, and `:` is never escaped on the way
    out, so the text and its re-encoding hold as many colons exactly when no key was dropped.
    Only when they differ (or the text escapes a colon as \\u003a, or cannot be re-encoded) is
    the text parsed again, pair by pair, to name the key."""
    if b"\\u003" not in payload:
        try:
            if dumps(obj).count(b":") == payload.count(b":"):
                return None
        except (orjson.JSONEncodeError, TypeError, ValueError, RecursionError):
            pass
    return find_duplicate(payload)


class _Pairs(dict):
    """An object as the pair-by-pair parse sees it: `dups` names the keys written twice, `pairs`
    holds every pair as written (so the text can be written back with its duplicates)."""
    __slots__ = ("dups", "pairs")


def _pairs(pairs: list) -> _Pairs:
    d = _Pairs(pairs)
    d.pairs = pairs
    d.dups = [k for k in dict.fromkeys(k for k, _ in pairs) if sum(1 for kk, _ in pairs if kk == k) > 1] \
        if len(d) != len(pairs) else ()
    return d


def parse_pairs(payload: bytes):
    """`payload` parsed pair by pair (objects as `_Pairs`), or None if it is not JSON to the
    standard library. Raises RecursionError past Python's recursion limit."""
    import json

    try:
        return json.loads(payload, object_pairs_hook=_pairs)
    except ValueError:
        return None


def find_duplicate(payload: bytes) -> str | None:
    """The first duplicated key of `payload` by path (the slow, exact parse; see duplicate_key).
    Raises RecursionError for text nested beyond Python's recursion limit."""
    obj = parse_pairs(payload)
    return None if obj is None else first_duplicate(obj)


def dumps_pairs(obj) -> bytes:
    """JSON text of a `parse_pairs` value with every pair as it was written, duplicates too."""
    import json

    if isinstance(obj, _Pairs):
        return b"{" + b",".join(json.dumps(k).encode() + b":" + dumps_pairs(v) for k, v in obj.pairs) + b"}"
    if isinstance(obj, list):
        return b"[" + b",".join(dumps_pairs(v) for v in obj) + b"]"
    return dumps(obj)


def first_duplicate(obj, path: str = "") -> str | None:
    """In a value parsed by `find_duplicate`: the path of its first key written twice."""
    stack = [(obj, path)]
    while stack:
        o, p = stack.pop()
        if isinstance(o, _Pairs):
            if o.dups:
                return f"{p}.{o.dups[0]}" if p else str(o.dups[0])
            stack.extend((v, f"{p}.{k}" if p else str(k)) for k, v in reversed(list(o.items())))
        elif isinstance(o, list):
            stack.extend((v, f"{p}[{i}]") for i, v in reversed(list(enumerate(o))))
    return None


def too_deep(error: Exception) -> bool:
    """The decoder refused the text for its nesting depth, not its syntax."""
    msg = str(error)
    return "depth" in msg or "ecursion" in msg
