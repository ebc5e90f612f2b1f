"""Timestamps: `utc_from_iso` is the one ISO 8601 reader (every module that reads a time calls
it); `parse_ts` is the contract's, which also takes epoch seconds and refuses with RecordError."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ratchet.contract.schema import RecordError

_ZERO = timedelta(0)


def utc_from_iso(v: str | datetime) -> datetime:
    """An ISO 8601 string (or a datetime) as an aware UTC time (3.11 reads a trailing Z as UTC;
    naive is UTC). The one timestamp parser: every module that reads a time calls this."""
    t = v if isinstance(v, datetime) else datetime.fromisoformat(v)
    if t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    return t if t.utcoffset() == _ZERO else t.astimezone(UTC)


def parse_ts(v: Any, path: str) -> datetime | None:
    """ISO 8601 (a trailing Z is UTC; naive times are taken as UTC) or epoch seconds."""
    if v is None or v == "":
        return None
    try:
        if isinstance(v, bool):
            raise TypeError
        if isinstance(v, datetime):
            return utc_from_iso(v)
        if isinstance(v, (int, float)):
            return datetime.fromtimestamp(v, tz=UTC)
        if type(v) is str:
            return utc_from_iso(v)
        raise TypeError
    except (TypeError, ValueError, OverflowError, OSError):
        raise RecordError("bad_timestamp", f"{path} is not an ISO 8601 time or epoch seconds: {v!r:.60}") from None
