"""The one notion of "now" for governed decisions: UTC, overridable by config for replays."""
from __future__ import annotations

from datetime import datetime, timezone


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def parse_now(value: str | None) -> datetime:
    """Config `now` (ISO-8601, naive = UTC) or the current time."""
    from ratchet.contract import utc_from_iso

    return utc_from_iso(value) if value else now_utc()
