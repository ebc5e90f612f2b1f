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
