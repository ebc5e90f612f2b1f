"""Format adapters: each turns one foreign record into a native contract record (a dict that
`ratchet.contract.normalise` validates). The format is detected from the record, not configured."""
from __future__ import annotations

from pathlib import Path

from ratchet.contract import SCHEMA_VERSION, RecordError

from . import anthropic, atif, chat, mini_swe_agent, swe_agent, swebench

NATIVE = "openai_chat"
FORMATS = (NATIVE, mini_swe_agent.NAME, swe_agent.NAME, atif.NAME, swebench.NAME, anthropic.NAME, *chat.NAMES)
DERIVE_IDS = frozenset((*chat.NAMES, anthropic.NAME))  # formats whose missing ids are derived (contract.normalise)


def exported_format(rec: object) -> str | None:
    """The `source_format` of a row exported from the warehouse (a `trajectories` row read back
    from Parquet or JSON): it is re-normalised as that format, so it gets its old record_id."""
    if (isinstance(rec, dict) and "record_id" in rec and rec.get("schema_version") == SCHEMA_VERSION
            and rec.get("source_format") in FORMATS and "messages" in rec):
        return rec["source_format"]
    return None


def detect(rec: object) -> str:
    """Name of the format of one decoded record; raises RecordError('unknown_format')."""
    if isinstance(rec, list):
        from ratchet.readers import is_message_list

        if is_message_list(rec):
            if mini_swe_agent.matches_messages(rec):
                return mini_swe_agent.NAME
            if anthropic.matches_messages(rec):
                return anthropic.NAME
            return chat.OPENAI_FUNCTIONS if chat.matches_functions(rec) else chat.MESSAGE_LIST
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
    if chat.matches_sharegpt(rec):
        return chat.SHAREGPT
    if anthropic.matches(rec):
        return anthropic.NAME
    if chat.matches_functions(rec.get("messages")):
        return chat.OPENAI_FUNCTIONS
    if "messages" in rec:
        return chat.OPENAI if chat.matches_openai(rec) and rec.get("schema_version") is None else NATIVE
    keys = ", ".join(sorted(map(str, rec))[:12])
    raise RecordError("unknown_format", f"no adapter recognises a record with keys [{keys}]")


def to_native(fmt: str, rec, source: Path | None, reports: dict | None = None) -> dict:
    if fmt == NATIVE:
        return rec
    if fmt in chat.NAMES:
        return chat.to_native(fmt, rec, source)
    if fmt == swebench.NAME:
        return swebench.to_native(rec, source, reports or {})
    if fmt == anthropic.NAME:
        return anthropic.to_native(rec, source)
    mod = {atif.NAME: atif, swe_agent.NAME: swe_agent, mini_swe_agent.NAME: mini_swe_agent}[fmt]
    return mod.to_native(rec, source)
