"""The stored form of a record's content and its hash, shared by `contract.normalise` and the
native fast path (`ratchet.native`): canonical message JSON, tool schemas as given, and
`content_hash` / `values_hash` (the record_id)."""
from __future__ import annotations

import hashlib
from operator import itemgetter

import msgspec
import orjson

from ratchet.contract.schema import CONTENT_FIELDS, CONTENT_NAMES
from ratchet.readers.json_codec import dumps

# Stored messages are canonical, so that logs differing only in key order, whitespace or
# explicit nulls get one record_id: known keys in this order, None-valued optional keys omitted
# (`content` always written), unknown keys after them, sorted. Both ingest paths write them with
# msgspec's encoder (ratchet.native declares its structs in the same order), byte for byte.
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content", "token_ids")
_MESSAGE_KEYSET = frozenset(MESSAGE_KEYS)
_CALL_KEYSET = frozenset(("id", "type", "function"))
_FN_KEYSET = frozenset(("name", "arguments"))


def _canonical_call(c: dict) -> dict:
    fn = c["function"]
    f = {"name": fn["name"], "arguments": fn.get("arguments")}
    for k in sorted(fn.keys() - _FN_KEYSET):
        f[k] = fn[k]
    out = {"id": c["id"], "type": c.get("type", "function"), "function": f}
    for k in sorted(c.keys() - _CALL_KEYSET):
        out[k] = c[k]
    return out


def _canonical_message(m: dict) -> dict:
    out = {"role": m["role"], "content": m.get("content")}
    for k in MESSAGE_KEYS[2:]:
        v = m.get(k)
        if v is not None:
            out[k] = [_canonical_call(c) for c in v] if k == "tool_calls" and type(v) is list else v
    for k in sorted(m.keys() - _MESSAGE_KEYSET):
        out[k] = m[k]
    return out


def messages_json(msgs: list[dict]) -> str:
    """Canonical JSON text of validated messages (see MESSAGE_KEYS)."""
    return msgspec.json.encode([_canonical_message(m) for m in msgs]).decode()


_JSON_NAMES = {f.name for f in CONTENT_FIELDS if (f.metadata or {}).get(b"format") == b"json"}
_SCALAR_IDX = [i for i, n in enumerate(CONTENT_NAMES[1:]) if n not in _JSON_NAMES]
_JSON_IDX = [i for i, n in enumerate(CONTENT_NAMES[1:]) if n in _JSON_NAMES]
assert CONTENT_NAMES[0] == "record_id" and CONTENT_NAMES[1:][_JSON_IDX[0]] == "messages"
_scalar_values, _json_rest = itemgetter(*_SCALAR_IDX), itemgetter(*_JSON_IDX[1:])
_hashed_values = itemgetter(*CONTENT_NAMES[1:])


def _tools_json(tools: list) -> str | None:
    """Tool schemas as given (key order kept: it is the parameter order a model is shown)."""
    return dumps(tools).decode() if tools else None



def content_hash(row: dict, messages: bytes | None = None) -> str:
    """sha256 over the normalised content (every key but record_id): the same trajectory
    re-logged gets the same id. See `values_hash`."""
    return values_hash(_hashed_values(row), messages)


def values_hash(values: tuple, messages: bytes | None = None) -> str:
    """`content_hash` of the values in CONTENT_NAMES[1:] order (`messages`: their UTF-8, when the
    caller has it). Scalars are hashed as one JSON array in that order; the JSON-text columns
    follow as length-framed bytes (embedding them as JSON strings would escape every quote: that
    alone cost ~6 us of ~11 per 5.7 KiB record)."""
    first = messages if messages is not None else values[_JSON_IDX[0]].encode()
    blobs = [first, *(None if b is None else b.encode() for b in _json_rest(values))]
    h = hashlib.sha256(orjson.dumps([*_scalar_values(values), *(-1 if b is None else len(b) for b in blobs)]))
    for b in blobs:
        if b:
            h.update(b)
    return h.hexdigest()
