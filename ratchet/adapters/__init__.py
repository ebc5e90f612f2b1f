"""Format adapters: each turns one foreign record into a native contract record (a dict that
`ratchet.contract.normalise` validates). The format is detected from the record, not configured."""
from __future__ import annotations

from pathlib import Path

from ratchet.contract import RecordError

from . import atif, mini_swe_agent, swe_agent, swebench

NATIVE = "openai_chat"
FORMATS = (NATIVE, mini_swe_agent.NAME, swe_agent.NAME, atif.NAME, swebench.NAME)


def detect(rec: object) -> str:
    """Name of the format of one decoded record; raises RecordError('unknown_format')."""
    if not isinstance(rec, dict):
        raise RecordError("not_object", f"a record must be a JSON object, got {type(rec).__name__}")
    if atif.matches(rec):
        return atif.NAME
    if swe_agent.matches(rec):
        return swe_agent.NAME
    if mini_swe_agent.matches(rec):
        return mini_swe_agent.NAME
    if swebench.matches(rec):
        return swebench.NAME
    if "messages" in rec:
        return NATIVE
    keys = ", ".join(sorted(map(str, rec))[:12])
    raise RecordError("unknown_format", f"no adapter recognises a record with keys [{keys}]")


def to_native(fmt: str, rec: dict, source: Path | None, reports: dict | None = None) -> dict:
    if fmt == NATIVE:
        return rec
    if fmt == swebench.NAME:
        return swebench.to_native(rec, source, reports or {})
    mod = {atif.NAME: atif, swe_agent.NAME: swe_agent, mini_swe_agent.NAME: mini_swe_agent}[fmt]
    return mod.to_native(rec, source)
