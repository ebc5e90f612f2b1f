"""The native fast path (`ratchet.native.fast_row`) against the general path (`contract.normalise`).

The fast path is conservative: for ANY payload, if `fast_row(payload, attribution)` returns a row,
the general path (`readers.loads`: orjson, or msgspec where a run of 19+ digits may hold an integer
beyond 64 bits, as ingest reads it; the batch attribution applied as `ingest_records.normalise_chunk` applies
it, then `normalise`) must accept the same record and produce exactly the same row; whenever the
general path does not accept a record (orjson cannot read it, `normalise` raises RecordError, or it
crashes), the fast path must have returned None. The only payloads left out of the property are the
ones ingest rejects before either path runs: a raw NUL byte or a `\\u0000` escape (tested apart).

- well-formed synthetic records all take the fast path and equal `normalise`'s rows;
- a seeded differential fuzz (mutated synthetic records, serialised many ways: key order shuffled
  at every level, separators, ensure_ascii, escapes, duplicate keys written by hand);
- record ids are invariant under key order, whitespace and explicit nulls, whichever path runs,
  and the stored `messages` JSON is canonical;
- explicit regression cases for the failures the fuzz found (all fixed; each docstring says what
  was wrong).
"""
from __future__ import annotations

import json
import math
import random
import struct
from datetime import UTC, date, datetime
from functools import lru_cache
from pathlib import Path

import orjson
import pytest

from ratchet import adapters, synth
from ratchet.contract import (
    CONTENT_FIELDS,
    MESSAGE_KEYS,
    RecordError,
    content_hash,
    normalise,
)
from ratchet.native import fast_row

FIELDS = [f.name for f in CONTENT_FIELDS]
ATTRIBUTIONS = ({}, {"tenant_id": "att-tenant"}, {"consent_id": "att-consent"},
                {"tenant_id": "att-tenant", "consent_id": "att-consent"}, {"tenant_id": "", "consent_id": None})
BASE = b'{"trajectory_id":"t","task_id":"k","messages":[{"role":"user","content":"x"}]'  # + ...}


def _content(text: bytes) -> bytes:
    """A minimal record whose one message has this JSON string body (escapes as written)."""
    return b'{"trajectory_id":"t","task_id":"k","messages":[{"role":"user","content":"' + text + b'"}]}'


# --------------------------------------------------------------------------- the two paths
def _attributed(rec, attribution: dict):
    """Batch attribution exactly as ingest_records.normalise_chunk applies it on the general path."""
    if isinstance(rec, dict):
        for k in ("tenant_id", "consent_id"):
            if not rec.get(k) and attribution.get(k):
                rec = {**rec, k: attribution[k]}
    return rec


def _general(payload: bytes, attribution: dict):
    """(kind, detail, decoded): kind is ok (detail = the row), bad_json, rejected (detail = the
    RecordError code) or crashed (normalise raised something other than RecordError: a bug)."""
    from ratchet.readers import loads

    try:
        obj = loads(payload)
    except ValueError as e:  # orjson.JSONDecodeError or msgspec's, as ingest_records.decode_record catches them
        return "bad_json", str(e), None
    try:
        native = adapters.detect(obj) == adapters.NATIVE
        return "ok", normalise(_attributed(obj, attribution)), native
    except RecordError as e:
        return "rejected", e.code, None
    except Exception as e:  # noqa: BLE001
        return "crashed", f"{type(e).__name__}: {e}", None


def _strict(row: dict) -> dict:
    """A row with every value tagged by its type (5 == 5.0 == True would hide a diff), floats by
    repr (-0.0) and times by ISO text with offset (equal instants in other zones would hide one)."""
    out = {}
    for k, v in row.items():
        if isinstance(v, datetime):
            out[k] = ("datetime", v.isoformat())
        elif isinstance(v, float):
            out[k] = ("float", repr(v))
        else:
            out[k] = (type(v).__name__, v)
    return out


def _check(payload: bytes, attribution: dict) -> tuple[str | None, str]:
    """(violation or None, the general path's kind: "fast" when both accepted) for one payload."""
    fast = fast_row(payload, attribution)
    kind, detail, native = _general(payload, attribution)
    if fast is None:
        return None, kind
    if kind != "ok":
        return f"fast path accepted what the general path {kind}: {detail}"[:300], kind
    if not native:
        return "fast path accepted a record adapters.detect does not call native", kind
    if sorted(fast) != sorted(FIELDS):
        return f"fast row keys differ from CONTENT_FIELDS: {sorted(set(fast) ^ set(FIELDS))}", kind
    a, b = _strict(fast), _strict(detail)
    if a != b:
        diff = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
        return f"rows differ: {str(diff)[:600]}", kind
    if fast["record_id"] != content_hash({k: v for k, v in fast.items() if k != "record_id"}):
        return "fast record_id is not content_hash of its row", kind
    return None, "fast"


def _has_nul(payload: bytes) -> bool:
    return b"\x00" in payload or b"\\u0000" in payload


def _where(payload: bytes) -> str:
    """Where orjson stops reading a payload (a window around it), else its first bytes."""
    at = None
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as e:
        at = e.start
    if at is None:
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError as e:
            at = len(payload.decode("utf-8", "replace")[:e.pos].encode("utf-8", "surrogatepass"))
    if at is None:
        return f"payload[:300]={payload[:300]!r}"
    return f"payload[{max(0, at - 150)}:{at + 100}]={payload[max(0, at - 150):at + 100]!r} (byte {at})"


def _forget_tools() -> None:
    """Moves the tool-list caches (contract's memo, native's last raw bytes) to a fresh state
    through the public functions only."""
    fresh = {"trajectory_id": "t", "task_id": "k", "messages": [{"role": "user", "content": "x"}],
             "tools": [{"cache-reset": 0}]}
    normalise(dict(fresh))
    fast_row(orjson.dumps(fresh), {})


# --------------------------------------------------------------------------- 1. synthetic records
def _synthetic(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    return [synth.trajectory(i, rng) for i in range(n)]


def test_synthetic_records_take_the_fast_path_and_equal_the_general_path():
    for i, rec in enumerate(_synthetic(200)):
        payload = orjson.dumps(rec)
        attribution = ATTRIBUTIONS[i % len(ATTRIBUTIONS)]
        fast = fast_row(payload, attribution)
        assert fast is not None, f"record {i} left the fast path"
        general = normalise(_attributed(orjson.loads(payload), attribution))
        assert _strict(fast) == _strict(general), f"record {i}"
        assert fast["record_id"] == general["record_id"]
        assert fast["n_tool_calls"] > 0 and fast["n_turns"] >= 3 and fast["tools"] and fast["extra"] is None


def test_attribution_fills_only_empty_tenant_and_consent():
    rec = {"trajectory_id": "t", "task_id": "k", "messages": [{"role": "user", "content": "x"}],
           "tenant_id": "", "consent_id": "own"}
    row = fast_row(orjson.dumps(rec), {"tenant_id": "batch", "consent_id": "batch"})
    assert (row["tenant_id"], row["consent_id"]) == ("batch", "own")
    assert row == normalise(_attributed(rec, {"tenant_id": "batch", "consent_id": "batch"}))
    assert fast_row(orjson.dumps(rec), {})["tenant_id"] is None


# --------------------------------------------------------------------------- serialisation
class Raw:
    """A JSON token written verbatim (valid for one parser, both or neither)."""

    def __init__(self, b: bytes):
        self.b = b


RAW_TOKENS = [b"1e400", b"-1e400", b"1E2", b"-0", b"0.0e0", b"3.0", b"3.5", b"18446744073709551616",
              b"9223372036854775808", b"123456789012345678901234567890", b'"\xff"', b'"\xed\xa0\x80"',
              b'"\\ud800"', b'"\\uDC00\\uD800"', b"0.1000000000000000055511151231257827021181583404541015625",
              b"2.2250738585072011e-308", b"4.9406564584124654e-324", b"1.7976931348623159e308", b"1e-400"]
DUP_JUNK = [None, 0, 1, -1, "", "x", True, [], {}, 1.5, {"zz": 1}, [1, "x"], Raw(b"18446744073709551616")]
DUP_BAD = [Raw(b"1e400"), Raw(b"-1e999"), Raw(b'"\xff"'), Raw(b'"\xed\xa0\x80"'), Raw(b'"\\ud800"')]  # orjson: no
SHORT_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


class Writer:
    """A JSON writer for one case: key order shuffled at every level, varied separators and
    leading/trailing whitespace on one line, ensure_ascii on or off, random \\uXXXX and \\/ escapes,
    and (when asked) keys written twice."""

    def __init__(self, rng: random.Random, dup_p: float = 0.0):
        self.rng = rng
        self.shuffle = rng.random() < 0.8
        self.ascii = rng.random() < 0.5
        self.comma = rng.choice([b",", b",", b", ", b" , ", b",\t"])
        self.colon = rng.choice([b":", b":", b": ", b" : ", b":\t"])
        self.esc_p = rng.choice([0.0, 0.0, 0.05, 0.3])
        self.dup_p = dup_p
        self.top = False

    def dumps(self, obj) -> bytes:
        self.top = True
        pad = self.rng.choice([b"", b"", b" ", b"\t", b"\r", b" \t "])
        return pad + self.value(obj) + self.rng.choice([b"", b"", b" ", b"\t", b"\r"])

    def string(self, s: str) -> bytes:
        if not self.esc_p or self.rng.random() > self.esc_p:
            return json.dumps(s, ensure_ascii=self.ascii).encode("utf-8", "surrogatepass")
        rnd, out = self.rng.random, ['"']
        for c in s:
            o = ord(c)
            if c in SHORT_ESC and rnd() < 0.7:
                out.append(SHORT_ESC[c])
            elif o < 0x20 or c in '"\\' or (0xD800 <= o <= 0xDFFF and self.ascii) or (o > 0x7E and self.ascii) \
                    or rnd() < 0.1:
                if o > 0xFFFF:
                    o -= 0x10000
                    out.append(self._u(0xD800 + (o >> 10)) + self._u(0xDC00 + (o & 0x3FF)))
                else:
                    out.append(self._u(o))
            elif c == "/" and rnd() < 0.5:
                out.append("\\/")
            else:
                out.append(c)
        out.append('"')
        return "".join(out).encode("utf-8", "surrogatepass")

    def _u(self, o: int) -> str:
        h = f"{o:04x}"
        return "\\u" + (h.upper() if self.rng.random() < 0.5 else h)

    def value(self, v) -> bytes:
        if v is None:
            return b"null"
        if v is True:
            return b"true"
        if v is False:
            return b"false"
        if type(v) is int:
            return str(v).encode()
        if type(v) is float:
            return json.dumps(v).encode()
        if type(v) is str:
            return self.string(v)
        if isinstance(v, Raw):
            return v.b
        if type(v) is list:
            return b"[" + self.comma.join(self.value(x) for x in v) + b"]"
        assert type(v) is dict, type(v)
        items = list(v.items())
        if self.shuffle:
            self.rng.shuffle(items)
        top, self.top = self.top, False
        parts = [(k, self.value(x)) for k, x in items]
        if self.dup_p and parts:
            for n in range(len(parts)):
                if self.rng.random() < self.dup_p or (top and n == 0):  # the top level: at least one
                    j = self.rng.randrange(len(parts))
                    bad = top and n == 0 and self.rng.random() < 0.3  # unreadable junk: once a line
                    junk = parts[j][1] if not bad and self.rng.random() < 0.5 else \
                        self.value(self.rng.choice(DUP_BAD if bad else DUP_JUNK))  # or the key repeated as is
                    # junk first (last wins: the same record, if the parser reads the junk) or last
                    parts.insert(j if self.rng.random() < 0.75 else j + 1, (parts[j][0], junk))
        return b"{" + self.comma.join(self.string(k) + self.colon + b for k, b in parts) + b"}"


def _shuffled(v, rng: random.Random):
    if type(v) is dict:
        items = list(v.items())
        rng.shuffle(items)
        return {k: _shuffled(x, rng) for k, x in items}
    if type(v) is list:
        return [_shuffled(x, rng) for x in v]
    return v


def _serialise(rec, rng: random.Random, dup_p: float) -> bytes:
    style = rng.random()
    if not dup_p and style < 0.3:  # orjson (when it can write the value)
        try:
            return orjson.dumps(_shuffled(rec, rng))
        except (TypeError, orjson.JSONEncodeError):
            pass
    elif not dup_p and style < 0.5:  # json.dumps, ensure_ascii and separators varied
        try:
            return json.dumps(_shuffled(rec, rng), ensure_ascii=rng.random() < 0.5,
                              separators=rng.choice([(",", ":"), (", ", ": "), (" , ", " :  ")])
                              ).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):
            pass
    return Writer(rng, dup_p).dumps(rec)


# --------------------------------------------------------------------------- 2. mutations
OPT_TOP = ("schema_version", "tenant_id", "consent_id", "repo", "issue_id", "agent_id", "started_at",
           "ended_at", "tools", "approvals", "deliverable", "outcome", "usage", "environment", "extra")
ALL_TOP = ("trajectory_id", "task_id", "messages") + OPT_TOP
MSG_OPT = ("tool_calls", "tool_call_id", "name", "reasoning_content", "token_ids")
WRONG = [0, 1, -1, 7, 3.0, 3.5, -2.5, True, False, "", "x", "5", "3.0", [], [1], ["x"], {}, {"a": 1},
         None, 2**63, 2**64, 2**70, 1e308, -0.0]
UNICODE = ["é", "\u00e9t\u00e9", "😀", "\ud83d\ude00", "\ud800", "a\udc00b", "a/b", "</script>", "\x1f", "\x01x",
           "\u2028\u2029", "\ufeff", "\x7f", "\uffff", "\U0010ffff", "tab\there", "nl\nhere", 'q"uo\\te']
TIMES = ["2026-11-01T10:00:00Z", "2026-11-01T12:00:00+02:00", "2026-11-01T10:00:00", "2026-11-01 10:00:00",
         "2026-11-01T10:00:00.123456-05:30", "2026-11-01", "20261101T100000Z", "2026-11-01T10:00:00+00:00",
         1793527200, 1793527200.5, -1, 10**20, 1e300, True, "yesterday", "", " ", None, "2026-13-01T00:00:00",
         "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "2026-11-01T10:00:00 Z", [], {"t": 1}]
UNKNOWN_KEYS = ["foo", "x-meta", "Trajectory_id", "trajectory_id ", "", "ü", "record_id", "n_messages",
                "prompt_text", "source_file", "ingested_at", "environment_id", "steps", "session_id",
                "info", "instance_id", "model_patch", "trajectory", "trajectory_format", "history"]


def _msgs(r) -> list:
    m = r.get("messages")
    return [x for x in m if type(x) is dict] if type(m) is list else []


def _calls(r) -> list:
    return [c for m in _msgs(r) if type(m.get("tool_calls")) is list for c in m["tool_calls"] if type(c) is dict]


def _sub(r, key) -> dict | None:
    v = r.get(key)
    return v if type(v) is dict else None


def _rand_value(rng, depth=0):
    c = rng.randrange(8 if depth < 3 else 5)
    if c == 0:
        return rng.choice(WRONG)
    if c == 1:
        return rng.choice(UNICODE)
    if c == 2:
        return rng.choice([rng.random() * 10 ** rng.randint(-30, 30), struct_float(rng), rng.randint(-2**70, 2**70)])
    if c == 3:
        return rng.choice([None, True, False, 0, "s"])
    if c == 4:
        return "".join(rng.choice("ab /\\\"é😀\t") for _ in range(rng.randint(0, 6)))
    if c in (5, 6):
        return {rng.choice(UNKNOWN_KEYS + UNICODE): _rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return [_rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def struct_float(rng) -> float:
    """Any finite double (random bits)."""
    while True:
        f = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(f):
            return f


def _deep(n: int) -> Raw:
    return Raw(b"[" * n + b"]" * n)  # written verbatim: no recursion in the writer


def m_null_top(r, rng):
    r[rng.choice(OPT_TOP)] = None


def m_remove_top(r, rng):
    r.pop(rng.choice(OPT_TOP), None)


def m_unknown_top(r, rng):
    r[rng.choice(UNKNOWN_KEYS)] = _rand_value(rng)


def m_wrong_type_top(r, rng):
    r[rng.choice(ALL_TOP)] = rng.choice(WRONG + [_rand_value(rng)])


def m_schema_version(r, rng):
    v = rng.choice(["absent", None, "", "ratchet.trajectory/v1", "ratchet.trajectory/v2", "ATIF-v1", "atif-v1.2",
                    "RATCHET.TRAJECTORY/V1", "ratchet.trajectory/v1 ", 1, False, 0, [], {}])
    if v == "absent":
        r.pop("schema_version", None)
    else:
        r["schema_version"] = v


def m_numeric_ids(r, rng):
    k = rng.choice(["trajectory_id", "task_id", "tenant_id", "consent_id", "repo", "issue_id", "agent_id"])
    r[k] = rng.choice([0, 7, -3, 2**63, 2**64, 2**70, 1.0, 1.5, True, False])


def m_id_instead(r, rng):
    tid = r.pop("trajectory_id", "t")
    c = rng.randrange(4)
    r["id"] = [tid, 12345, "", None][c]
    if rng.random() < 0.3:
        r["trajectory_id"] = rng.choice([tid, None, "", "other"])


def m_empty_ids(r, rng):
    for _ in range(rng.randint(1, 3)):
        _empty_id(r, rng)


def _empty_id(r, rng):
    v = rng.choice(["", "", "", " ", "\t\n", "\u00a0", "\u3000", "\u200b", "x", " x "])
    k = rng.choice(["trajectory_id", "task_id", "tenant_id", "consent_id", "repo", "agent_id", "issue_id", "call",
                    "environment", "approval"])
    if k == "environment" and _sub(r, "environment") is not None:
        r["environment"][rng.choice(["id", "digest"])] = v
    elif k == "approval" and type(r.get("approvals")) is list and r["approvals"] and type(r["approvals"][0]) is dict:
        r["approvals"][0][rng.choice(["approver", "decision", "note", "at"])] = v
    elif k == "call":
        calls = _calls(r)
        if calls:
            c = rng.choice(calls)
            old, c["id"] = c.get("id"), v
            for m in _msgs(r):
                if m.get("role") == "tool" and m.get("tool_call_id") == old and rng.random() < 0.8:
                    m["tool_call_id"] = v
    else:
        r[k] = v


def m_timestamps(r, rng):
    for k in rng.sample(["started_at", "ended_at"], rng.randint(1, 2)):
        r[k] = rng.choice(TIMES)
    if rng.random() < 0.2:  # ended before started
        r["started_at"], r["ended_at"] = "2026-11-01T10:00:00Z", rng.choice(
            ["2026-11-01T09:59:59Z", "2026-11-01T11:59:00+02:00", "2026-11-01T10:00:00+00:00", "2026-11-01T10:00:00"])


FLAT = {"patch": "deliverable", "tests_passed": "outcome", "accepted": "outcome", "human_edited": "outcome",
        "prompt_tokens": "usage", "completion_tokens": "usage", "cost_usd": "usage", "latency_s": "usage",
        "environment_id": "environment", "environment_digest": "environment"}


def m_flat(r, rng):
    k = rng.choice(sorted(FLAT))
    sub = _sub(r, FLAT[k])
    inner = {"environment_id": "id", "environment_digest": "digest"}.get(k, k)
    r[k] = sub.get(inner) if sub and rng.random() < 0.7 else rng.choice(WRONG)
    c = rng.randrange(3)
    if c == 0:
        r.pop(FLAT[k], None)
    elif c == 1:
        r[FLAT[k]] = None


def m_extra(r, rng):
    c = rng.randrange(6)
    if c == 0:
        r["extra"] = rng.choice([[], "", 0, "x", [1], True, False, 1.5, None, {}])
    elif c == 1:
        r["extra"] = {"big": rng.choice([2**64, 2**70, -2**63 - 1, 10**30, 2**63, -2**63, 2**64 - 1]),
                      "n": rng.randint(-10, 10)}
    elif c == 2:
        r["extra"] = {"f": rng.choice([1e308, -0.0, 0.0, 5e-324, 1.5, 3.0, 0.1, struct_float(rng)]),
                      "g": struct_float(rng), "h": [struct_float(rng), rng.random()]}
    elif c == 3:
        r["extra"] = {"deep": _deep(rng.choice([50, 254, 255, 256, 300, 1030]))}
    elif c == 4:
        r["extra"] = {rng.choice(UNICODE + ["b", "a", "B"]): _rand_value(rng) for _ in range(rng.randint(1, 4))}
    else:
        r["extra"] = _rand_value(rng)


def m_tools(r, rng):
    r["tools"] = rng.choice([{}, "", 0, None, [], {"a": 1}, [1, "x"], [{}], "tools", False, True,
                             [{"type": "function", "function": {"name": "f", "n": rng.choice([1, 1.0, True, 2**64])}}],
                             [{"x": _rand_value(rng)}], _deep(300)])


def m_messages(r, rng):
    r["messages"] = rng.choice([[], {}, None, "", "hi", [None], [1], [[]], {"role": "user", "content": "x"}])


def m_msg_nulls(r, rng):
    for m in rng.sample(_msgs(r), min(3, len(_msgs(r)))):
        for k in rng.sample(MSG_OPT, rng.randint(1, len(MSG_OPT))):
            if m.get(k) is None:
                m[k] = None
        if rng.random() < 0.2:
            m["content"] = None


def m_msg_remove(r, rng):
    ms = _msgs(r)
    if ms:
        rng.choice(ms).pop(rng.choice(("content", "role", "tool_call_id", "tool_calls", "token_ids", "name")), None)


def m_msg_unknown(r, rng):
    ms = _msgs(r)
    if ms:
        rng.choice(ms)[rng.choice(["refusal", "audio", "function_call", "id", "weight", "x", "Role", ""])] = _rand_value(rng)


def m_msg_wrong_type(r, rng):
    ms = _msgs(r)
    if not ms:
        return
    m, k = rng.choice(ms), rng.choice(("role",) + ("content",) * 2 + MSG_OPT)
    if k == "role":
        m[k] = rng.choice(["User", "developer", "function", "", None, 1, ["user"], {"r": 1}, True, "assistant "])
    else:
        m[k] = rng.choice(WRONG)


def m_msg_add_optional(r, rng):
    ms = _msgs(r)
    if ms:
        m = rng.choice(ms)
        k = rng.choice(("name", "reasoning_content", "token_ids", "tool_call_id"))
        m[k] = {"name": "bob", "reasoning_content": "I think", "token_ids": [1, 2, 3],
                "tool_call_id": "c-extra"}[k] if rng.random() < 0.8 else rng.choice(["", " ", []])


def m_content_parts(r, rng):
    ms = _msgs(r)
    if ms:
        m = rng.choice(ms)
        m["content"] = rng.choice([
            [{"type": "text", "text": str(m.get("content"))}],
            [{"type": "text", "text": "a"}, "b", {"type": "image_url", "image_url": {"url": "x"}}],
            [], [1], [{"type": "text", "text": 5}], [None]])


def m_token_ids(r, rng):
    ms = _msgs(r)
    if ms:
        rng.choice(ms)["token_ids"] = rng.choice([
            [], [0, 2**31 - 1], [-1], [2**31], [True], [1, False], [3.0], ["1"], [2**70], [None], {}, "1,2", 5,
            [rng.randrange(50000) for _ in range(5)]])


def m_tool_calls_elsewhere(r, rng):
    ms = [m for m in _msgs(r) if m.get("role") in ("user", "system", "tool")]
    if ms:
        m = rng.choice(ms)
        m["tool_calls"] = rng.choice([[], [], None, [{"id": "cx", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                                      [1], {}, "", 0, False, [{"id": "cx", "function": {"name": "f"}}]])


def m_tool_results(r, rng):
    ms = r.get("messages")
    if type(ms) is not list:
        return
    tools = [i for i, m in enumerate(ms) if type(m) is dict and m.get("role") == "tool"]
    c = rng.randrange(4)
    if c == 0:  # no matching call
        ms.insert(rng.randrange(len(ms) + 1), {"role": "tool", "tool_call_id": rng.choice(["nope", "", None, 5]),
                                                "content": "orphan"})
    elif c == 1 and tools:  # answered twice
        i = rng.choice(tools)
        ms.insert(rng.randint(i + 1, len(ms)), dict(ms[i]))
    elif c == 2 and tools:  # before its call
        i = rng.choice(tools)
        ms.insert(rng.randrange(0, 3), ms.pop(i))
    elif c == 3 and tools:  # tool message without tool_call_id
        ms[rng.choice(tools)].pop("tool_call_id", None)


def m_call(r, rng):
    calls = _calls(r)
    if not calls:
        return
    c = rng.choice(calls)
    fn = c.get("function") if type(c.get("function")) is dict else None
    k = rng.randrange(12)
    if k == 0 and fn is not None:
        fn["arguments"] = rng.choice([{"path": "a.py", "line": 3}, [1, 2], {}, 5, None, True, "", "not json"])
    elif k == 1 and fn is not None:
        fn.pop("arguments", None)
    elif k == 2:
        c.pop("type", None)
    elif k == 3:
        c["type"] = rng.choice([None, "custom", 1, "", "function"])
    elif k == 4:
        c[rng.choice(["index", "x", "Type", "arguments"])] = _rand_value(rng)
    elif k == 5 and fn is not None:
        fn[rng.choice(["description", "x", "parameters", "Name"])] = _rand_value(rng)
    elif k == 6 and fn is not None:
        fn["name"] = rng.choice([None, 1, "", ["f"], "f"])
    elif k == 7 and fn is not None:
        fn.pop("name", None)
    elif k == 8:
        c["id"] = rng.choice([None, 5, 2**70, ["c"], "", " "])
    elif k == 9:
        c.pop(rng.choice(["id", "function"]), None)
    elif k == 10:
        c["function"] = rng.choice([None, "f", [], 1])
    else:
        m = next(m for m in _msgs(r) if type(m.get("tool_calls")) is list and c in m["tool_calls"])
        m["tool_calls"] = rng.choice([{}, "", 0, None, [], [1], [None], {"id": "x"}])


def m_usage(r, rng):
    u = _sub(r, "usage")
    if u is None:
        r["usage"] = u = {}
    k = rng.choice(("prompt_tokens", "completion_tokens", "cost_usd", "latency_s", "unknown", "null"))
    if k == "unknown":
        u[rng.choice(["total_tokens", "x", "Cost_usd"])] = rng.randint(0, 99)
    elif k == "null":
        for kk in rng.sample(["prompt_tokens", "completion_tokens", "cost_usd", "latency_s"], 2):
            u[kk] = None
    else:
        u[k] = rng.choice([3.0, 3.5, -1, -0.0, 0, True, False, "5", "0.1", 2**63 - 1, 2**63, 2**64 - 1, 2**64,
                           2**70, 10**30, 1e20, 1e308, 5e-324, None, [], {}, struct_float(rng), Raw(rng.choice(RAW_TOKENS))])


def m_outcome(r, rng):
    o = _sub(r, "outcome")
    if o is None:
        r["outcome"] = o = {}
    k = rng.choice(("tests_passed", "accepted", "human_edited", "unknown"))
    if k == "unknown":
        o[rng.choice(["resolved", "x", "Accepted"])] = _rand_value(rng)
    else:
        o[k] = rng.choice([None, True, False, 0, 1, "true", "", [], 1.0])


def m_env_deliverable(r, rng):
    key = rng.choice(("environment", "deliverable"))
    d = _sub(r, key)
    if d is None:
        r[key] = d = {}
    c = rng.randrange(3)
    if c == 0:
        d[rng.choice(["x", "image", "Patch", "ID"])] = _rand_value(rng)
    elif c == 1:
        for k in list(d):
            d[k] = None
    else:
        k = rng.choice(["id", "digest"] if key == "environment" else ["patch"])
        d[k] = rng.choice([None, "", " ", 5, 2**70, True, [], {}, "diff --git a/x b/x\n", "é😀"])
    if rng.random() < 0.1:
        r[key] = rng.choice([[], "", 0, [d]])


def m_approvals(r, rng):
    aps = r.get("approvals")
    if type(aps) is not list or not aps or rng.random() < 0.15:
        r["approvals"] = aps = rng.choice([[], None, {}, "", 0, [1], [None], [{}], [{"step": 1}]]) if rng.random() < 0.5 \
            else [{"step": 1, "approver": "a", "decision": "approved", "at": "2026-11-01T10:00:00Z"}]
        if type(aps) is not list or not aps:
            return
    a = rng.choice(aps)
    if type(a) is not dict:
        return
    c = rng.randrange(7)
    if c == 0:  # `time` instead of `at`
        a["time"] = a.pop("at", None) or "2026-11-01T10:00:00Z"
        if rng.random() < 0.3:
            a["at"] = rng.choice([None, ""])
    elif c == 1:
        a["step"] = rng.choice(["3", True, False, 3.0, 3.5, None, -1, 2**63, 2**64, 2**70, [3]])
    elif c == 2:
        for k in rng.sample(["step", "approver", "decision", "at", "note"], rng.randint(1, 3)):
            a.pop(k, None)
    elif c == 3:
        a["at"] = rng.choice(TIMES)
    elif c == 4:
        a[rng.choice(["by", "x", "Step", "comment"])] = _rand_value(rng)
    elif c == 5:
        a[rng.choice(["approver", "decision", "note"])] = rng.choice(["", None, 5, "ok", True, []])
    else:
        a["note"] = rng.choice(UNICODE)


def m_unicode(r, rng):
    targets = []
    for m in _msgs(r):
        if type(m.get("content")) is str:
            targets.append((m, "content"))
    for k in ("trajectory_id", "task_id", "repo", "agent_id", "tenant_id"):
        if type(r.get(k)) is str:
            targets.append((r, k))
    for c in _calls(r):
        if type(c.get("function")) is dict and type(c["function"].get("arguments")) is str:
            targets.append((c["function"], "arguments"))
    if targets:
        d, k = rng.choice(targets)
        s = rng.choice(UNICODE)
        d[k] = rng.choice([s, d[k] + s, s + d[k], s * 3])


def m_raw_token(r, rng):
    """A leaf written as a raw token: numbers and strings at the edges of what the parsers read."""
    spots = [(r, k) for k in ("repo", "agent_id", "issue_id")]
    u = _sub(r, "usage")
    if u:
        spots += [(u, k) for k in ("prompt_tokens", "completion_tokens", "cost_usd", "latency_s")]
    e = _sub(r, "extra")
    spots.append((e, "x") if e is not None else (r, "extra"))
    for m in _msgs(r)[:3]:
        spots.append((m, "content"))
    d, k = rng.choice(spots)
    d[k] = Raw(rng.choice(RAW_TOKENS))


MUTATIONS = [m_null_top, m_remove_top, m_unknown_top, m_wrong_type_top, m_schema_version, m_numeric_ids,
             m_id_instead, m_empty_ids, m_timestamps, m_flat, m_extra, m_tools, m_messages, m_msg_nulls,
             m_msg_remove, m_msg_unknown, m_msg_wrong_type, m_msg_add_optional, m_content_parts, m_token_ids,
             m_tool_calls_elsewhere, m_tool_results, m_call, m_usage, m_outcome, m_env_deliverable,
             m_approvals, m_unicode, m_raw_token]
# the common, survivable ones weigh more: most cases should still reach the end of both paths
WEIGHTS = {m_msg_nulls: 4, m_usage: 4, m_timestamps: 3, m_approvals: 3, m_empty_ids: 3, m_unicode: 3,
           m_extra: 2, m_call: 2, m_msg_add_optional: 2, m_env_deliverable: 2, m_outcome: 2, m_remove_top: 2,
           m_null_top: 2}
_POOL = [m for m in MUTATIONS for _ in range(WEIGHTS.get(m, 1))]

N_CASES = 4000
SEED = 20261101


@lru_cache(maxsize=1)
def _fuzz_results() -> tuple:
    """Runs the corpus once (both tests read it): [(case, mutation names, payload, violation, kind)]."""
    rng = random.Random(SEED)
    bases = [orjson.dumps(r) for r in _synthetic(40, seed=SEED)]
    _forget_tools()  # the tool-list caches start from the same state whatever ran before
    out = []
    for case in range(N_CASES):
        rec = orjson.loads(rng.choice(bases))
        names = []
        if rng.random() < 0.9:  # 10% only re-serialised
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 4])):
                m = rng.choice(_POOL)
                m(rec, rng)
                names.append(m.__name__)
        dup_p = 0.0
        if rng.random() < 0.12:
            dup_p = rng.choice([0.005, 0.02, 0.1])
            names.append(f"dup_keys({dup_p})")
        payload = _serialise(rec, rng, dup_p)
        if _has_nul(payload):  # ingest rejects these before either path (see the NUL tests)
            out.append((case, names, payload, None, "nul"))
            continue
        attribution = rng.choice(ATTRIBUTIONS)
        violation, kind = _check(payload, attribution)
        out.append((case, names, payload, violation, kind))
    return tuple(out)


@pytest.mark.badinput
def test_differential_fuzz_fast_path_never_disagrees_with_general_path():
    results = _fuzz_results()
    kinds: dict = {}
    for *_, kind in results:
        kinds[kind] = kinds.get(kind, 0) + 1
    # not vacuous: the corpus reaches every outcome, and many records take the fast path
    assert kinds.get("fast", 0) > N_CASES // 8, kinds
    assert kinds.get("fast", 0) + kinds.get("ok", 0) > N_CASES // 4, kinds
    assert kinds.get("rejected", 0) > N_CASES // 10 and kinds.get("bad_json", 0) > 20, kinds
    assert kinds.get("nul", 0) == 0, "the generator writes no NUL: nothing else is left out of the property"
    bad = [(c, n, p, v) for c, n, p, v, _ in results if v]
    report = "\n".join(f"case {c} {n}: {v}\n    {_where(p)}" for c, n, p, v in bad[:8])
    assert not bad, f"{len(bad)} of {N_CASES} cases broke the fast-path property:\n{report}"


@pytest.mark.badinput
def test_differential_fuzz_general_path_fails_only_with_record_error():
    """The same corpus: the general path refuses a record with RecordError (quarantined with a code),
    never another exception, which ingest_records.normalise_chunk does not catch (the whole ingest stops)."""
    crashed = [(c, n, p) for c, n, p, _, kind in _fuzz_results() if kind == "crashed"]
    details = []
    for c, n, p in crashed[:8]:
        details.append(f"case {c} {n}: {_general(p, {})[1][:120]}\n    {_where(p)}")
    assert not crashed, f"{len(crashed)} cases crashed normalise:\n" + "\n".join(details)


M1 = b'{"trajectory_id":"t","task_id":"k","messages":[{"role":"user",'
EDGES = [  # (payload, outcome): fast = the fast path's row; declined = only normalise accepts it
    (b'{"trajectory_id":"a",' + BASE[1:] + b"}", "fast"),                      # duplicate key: last wins
    (M1 + b'"content":"a","content":null}]}', "fast"),
    (M1 + b'"content":1,"content":"a"}]}', "declined"),                      # msgspec reads every value
    (BASE + b',"extra":{"a":1,"a":[2],"b":0}}', "fast"),
    (_content(rb"caf\u00e9 \ud83d\ude00 \uD83D\uDE00 a\/b \u001f \" \\ \t"), "fast"),
    (_content("café 😀 \u2028".encode()), "fast"),
    (_content(rb"\ud800"), "bad_json"),                                       # lone surrogates
    (_content(rb"\udc00\ud800"), "bad_json"),
    (_content(b"\xed\xa0\x80"), "bad_json"),                                  # UTF-8 encoded surrogate
    (_content(b"\xff"), "bad_json"),
    (_content(b"a\tb"), "bad_json"),                                          # raw control character
    (b'{"\\u0074rajectory_id":"t","task_id":"k","messages":[{"r\\u006fle":"\\u0075ser","content":"x"}]}', "fast"),
    (b"\xef\xbb\xbf" + BASE + b"}", "bad_json"),                              # BOM
    (b" \t" + BASE.replace(b",", b" ,\t").replace(b":", b" : ") + b"} \r", "fast"),
    (BASE + b"} x", "bad_json"),
    (BASE + b',"extra":{"big":18446744073709551616}}', "declined"),          # orjson reads a float
    (BASE + b',"extra":{"big":18446744073709551615,"neg":-9223372036854775808}}', "fast"),
    (BASE + b',"extra":{"f":1e308,"z":-0.0,"t":5e-324,"e":1E2,"i":-0}}', "fast"),
    (BASE + b',"extra":{"f":1e400}}', "bad_json"),
    (BASE + b',"extra":[]}', "declined"),                                    # falsy: no extra
    (BASE + b',"usage":{"cost_usd":-0.0,"prompt_tokens":0,"latency_s":7}}', "fast"),
    (BASE + b',"usage":{"prompt_tokens":3.0}}', "declined"),
    (BASE + b',"usage":{"prompt_tokens":3.5}}', "rejected"),
    (BASE + b',"usage":{"prompt_tokens":true}}', "rejected"),
    (BASE + b',"outcome":{"accepted":1}}', "rejected"),
    (BASE + b',"started_at":"2026-11-01T12:00:00+02:00","ended_at":"2026-11-01 10:00:01"}', "fast"),
    (BASE + b',"started_at":"2026-11-01T10:00:01Z","ended_at":"2026-11-01T12:00:00+02:00"}', "rejected"),
    (BASE + b',"started_at":1793527200}', "declined"),                        # epoch seconds
    (BASE + b',"started_at":""}', "fast"),
    (BASE + b',"approvals":[{"step":1,"time":"2026-11-01T10:00:00Z"}]}', "fast"),
    (BASE + b',"approvals":[{"step":"1"}]}', "rejected"),
    (BASE + b',"schema_version":"ATIF-v1"}', "rejected"),
    (BASE + b',"schema_version":""}', "declined"),
    (BASE + b',"tools":{}}', "declined"),                                     # falsy: no tools (general path)
    (BASE + b',"tools":[],"tools":null}', "fast"),
    (b'{"id":"t","task_id":"k","messages":[{"role":"user","content":"x"}]}', "declined"),
    (b'{"trajectory_id":7,"task_id":"k","messages":[{"role":"user","content":"x"}]}', "declined"),
    (b'{"trajectory_id":" ","task_id":"k","messages":[{"role":"user","content":"x"}]}', "rejected"),
    (BASE + b',"patch":"p"}', "declined"),                                    # flat form
]


@pytest.mark.badinput
@pytest.mark.parametrize("payload,outcome", EDGES, ids=range(len(EDGES)))
def test_hand_written_edge_payloads(payload, outcome):
    violation, kind = _check(payload, {})
    assert violation is None, violation
    assert {"fast": "fast", "ok": "declined"}.get(kind, kind) == outcome, kind


# --------------------------------------------------------------------------- 3. canonical form, ids
def _variants(rec: dict, rng: random.Random):
    """The same record: explicit nulls for absent optional message keys and tool-call fields that
    default, key order shuffled at every level (except inside `tools`, stored as given) and
    whitespace varied."""
    v = orjson.loads(orjson.dumps(rec))
    for m in v["messages"]:
        for k in MSG_OPT:
            if k not in m and rng.random() < 0.6:
                m[k] = None
        for c in m.get("tool_calls") or []:
            if rng.random() < 0.5:
                c.pop("type")  # "function" is the default
    tools = v.pop("tools", None)
    items = list(_shuffled(v, rng).items())
    if tools is not None:
        items.insert(rng.randrange(len(items) + 1), ("tools", tools))
    w = Writer(rng)
    w.shuffle = False  # (already shuffled, all but `tools`)
    return w.dumps(dict(items))


def test_record_id_ignores_key_order_whitespace_and_explicit_nulls_whichever_path():
    rng = random.Random(3)
    for i, rec in enumerate(_synthetic(30, seed=11)):
        canonical = fast_row(orjson.dumps(rec), {})
        assert canonical is not None
        for j in range(4):
            p = _variants(rec, rng)
            fast = fast_row(p, {})
            general = normalise(orjson.loads(p))
            assert fast is not None, f"record {i} variant {j} left the fast path: {p[:200]!r}"
            assert fast["record_id"] == general["record_id"] == canonical["record_id"], (i, j)
            assert fast["messages"] == general["messages"] == canonical["messages"]
        # forced through the general path: tool arguments as objects (normalise writes them as text)
        forced = orjson.loads(orjson.dumps(rec))
        for m in forced["messages"]:
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = orjson.loads(c["function"]["arguments"])
        assert fast_row(orjson.dumps(forced), {}) is None
        assert normalise(forced)["record_id"] == canonical["record_id"], i


def _assert_canonical(messages_text: str):
    msgs = json.loads(messages_text)  # dicts keep the stored key order
    for m in msgs:
        keys = list(m)
        assert keys[:2] == ["role", "content"], keys
        assert keys == [k for k in MESSAGE_KEYS if k in m], keys
        assert all(m[k] is not None for k in keys[2:]), m
        for c in m.get("tool_calls") or []:
            assert list(c) == ["id", "type", "function"] and list(c["function"]) == ["name", "arguments"], c
    assert orjson.dumps(msgs).decode() == messages_text  # compact, no whitespace


def test_stored_messages_are_canonical_on_both_paths():
    msgs = [
        {"token_ids": [1, 2], "reasoning_content": "r", "name": None, "content": "hi", "role": "assistant",
         "tool_calls": [{"function": {"arguments": "{}", "name": "f"}, "id": "c1"},
                        {"type": "function", "id": "c2", "function": {"name": "g"}}], "tool_call_id": None},
        {"name": "f", "content": "ok", "tool_call_id": "c1", "role": "tool", "token_ids": None},
        {"content": None, "tool_call_id": "c2", "role": "tool"},
        {"role": "user", "content": "", "name": "", "tool_calls": []},
    ]
    expected = ('[{"role":"assistant","content":"hi","tool_calls":[{"id":"c1","type":"function","function":'
                '{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":null}}],'
                '"reasoning_content":"r","token_ids":[1,2]},{"role":"tool","content":"ok","tool_call_id":"c1","name":"f"},'
                '{"role":"tool","content":null,"tool_call_id":"c2"},{"role":"user","content":"","tool_calls":[],"name":""}]')
    rec = {"messages": msgs, "task_id": "k", "trajectory_id": "t"}
    payload = json.dumps(rec, separators=(" , ", " : ")).encode()
    fast, general = fast_row(payload, {}), normalise(orjson.loads(payload))
    assert fast is not None
    assert fast["messages"] == general["messages"] == expected
    assert fast["record_id"] == general["record_id"]
    _assert_canonical(expected)
    # content absent: the general path writes it as null (the fast path requires it to be present)
    no_content = {"trajectory_id": "t", "task_id": "k", "messages": [{"role": "assistant"}]}
    assert normalise(no_content)["messages"] == '[{"role":"assistant","content":null}]'
    assert fast_row(orjson.dumps(no_content), {}) is None
    for rec in _synthetic(20, seed=5):
        _assert_canonical(fast_row(orjson.dumps(rec), {})["messages"])


# --------------------------------------------------------------------------- NUL: ingest's own rule
NUL_PAYLOADS = [
    _content(b"a\\u0000b"),                                              # in content
    BASE + b',"extra":{"k\\u0000":1}}',                                  # in a key
    BASE.replace(b'"t"', b'"t\\u0000"', 1) + b"}",                       # in the trajectory id
    _content(b"a\x00b"),                                                  # a raw NUL (invalid JSON)
]


def _chunk(payloads: list[bytes], attribution: dict | None = None):
    from ratchet.ingest_records import FileContext, normalise_chunk

    ctx = FileContext(Path("in.jsonl"), attribution or {}, 1 << 20, {}, "batch", datetime.now(UTC))
    return normalise_chunk([(p, i + 1, 0) for i, p in enumerate(payloads)], ctx)


def test_nul_payloads_are_the_only_exclusion_ingest_rejects_them_before_either_path():
    """The property is stated for every payload but these: ingest quarantines a raw NUL byte or
    a \\u0000 escape as nul_byte before the fast path or normalise see it. Both paths on their own
    may accept such a record (orjson and msgspec read \\u0000 as a NUL character)."""
    for p in NUL_PAYLOADS:
        assert _has_nul(p)
        violation, _ = _check(p, {})
        assert violation is None, violation  # the property happens to hold here too
    res = _chunk(NUL_PAYLOADS)
    assert [b[1] for b in res.bad] == ["nul_byte"] * len(NUL_PAYLOADS)
    assert res.fast == 0 and (res.table is None or res.table.num_rows == 0)
    # everything else reaches the fast path or normalise: a clean record next to them is accepted
    ok = _chunk(NUL_PAYLOADS[:1] + [BASE + b"}"])
    assert ok.fast == 1 and ok.table.num_rows == 1 and len(ok.bad) == 1


def test_a_chunk_leaves_the_callers_garbage_collector_as_it_found_it():
    """normalise_chunk turns the cyclic GC off while it decodes (millions of short-lived dicts) and
    runs in the caller's process on the inline path: it turns it back on only if it was on, even
    when a record is refused."""
    import gc

    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            _chunk([BASE + b"}", NUL_PAYLOADS[0], b"{not json"])
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()


def test_a_chunk_counts_native_records_of_both_paths_in_its_formats():
    """A native record the typed decoder declines (a token count written as 3.0) is read by the
    general path: `formats` counts it with the fast-path records, not instead of them."""
    res = _chunk([BASE + b"}", BASE.replace(b'"t"', b'"u"', 1) + b',"usage":{"prompt_tokens":3.0}}'])
    assert res.fast == 1 and res.table.num_rows == 2 and not res.bad, res.bad
    assert res.formats == {"openai_chat": 2}, res.formats


# --------------------------------------------------------------------------- regressions
def test_regression_duplicate_tools_key_must_not_hide_unreadable_json():
    """Regression. `tools` is read by msgspec as Raw (skipped, not validated) and
    parsed later with orjson; with the key written twice msgspec keeps the last value and never
    parses the first, while orjson.loads of the whole line rejects it. The fast path then accepts a
    line the general path quarantines as invalid_json / invalid_utf8."""
    for junk in (b"1e400", b"-1e999", b'"\xff"', b'"\xed\xa0\x80"'):
        payload = BASE + b',"tools":' + junk + b',"tools":null}'
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(payload)
        assert fast_row(payload, {}) is None, payload


def test_regression_tools_json_does_not_depend_on_previous_records():
    """Regression. contract._tools_json memoises the last tool list by `==`, which
    holds for [{"x": 1}] and [{"x": true}] or 1.0, and for dicts in another key order, so a record's
    stored `tools` (and record_id) is the text of whichever equal-looking list came before it
    (true stored as 1); native._tools caches that text by raw bytes, so the fast path and normalise
    can also disagree about the same record."""
    def rec(tools):
        return {"trajectory_id": "t", "task_id": "k", "messages": [{"role": "user", "content": "x"}], "tools": tools}

    for first, second in (([{"x": 1}], [{"x": True}]), ([{"x": 1}], [{"x": 1.0}]),
                          ([{"a": 1, "b": 2}], [{"b": 2, "a": 1}])):
        for run in (lambda r: fast_row(orjson.dumps(r), {}), normalise):
            run(rec([{"unrelated": 0}]))
            alone = run(rec(second))
            run(rec([{"unrelated": 1}]))
            run(rec(first))
            after = run(rec(second))
            assert after["tools"] == alone["tools"], (first, second, run)
            assert after["record_id"] == alone["record_id"]
            x = orjson.loads(after["tools"])[0].get("x")
            assert type(x) is type(second[0].get("x")), (after["tools"], second)  # true stays true


def test_regression_tools_caches_make_fast_path_and_normalise_disagree():
    """Regression (same cause as above). Three lines, then the fourth: the fast
    path returns the text native._tools cached for these exact bytes ('[{"a":1,"b":2}]', taken
    from contract's memo), normalise writes '[{"b":2,"a":1}]': another record_id for one line."""
    def rec(tools):
        return {"trajectory_id": "t", "task_id": "k", "messages": [{"role": "user", "content": "x"}], "tools": tools}

    normalise(rec([{"reset": 0}]))
    fast_row(orjson.dumps(rec([{"a": 1, "b": 2}])), {})
    p = orjson.dumps(rec([{"b": 2, "a": 1}]))
    fast_row(p, {})                        # its text cached (as '[{"a":1,"b":2}]', from the memo)
    normalise(rec([{"other": 1}]))         # the memo moves on
    violation, _ = _check(p, {})
    assert violation is None, violation


GENERAL_CRASHES = [
    BASE + b',"usage":{"prompt_tokens":18446744073709551616}}',        # orjson reads a float, int() of it
    BASE + b',"usage":{"completion_tokens":1e20}}',                     # ...exceeds 64 bits: dumps fails
    BASE + b',"extra":{"a":' + b"[" * 300 + b"]" * 300 + b"}}",         # orjson.dumps: recursion limit
    BASE + b',"tools":[' + b"[" * 300 + b"]" * 300 + b"]}",
    b'{"trajectory_id":"t","task_id":"k","messages":[{"role":["user"],"content":"x"}]}',  # unhashable
    b'{"trajectory_id":"t","task_id":"k","messages":[{"role":"tool","tool_call_id":["c"],"content":"x"}]}',
    (b'{"trajectory_id":"t","task_id":"k","messages":[{"role":"assistant","content":null,"tool_calls":'
     b'[{"id":"c","function":{"name":"f"}}]},{"role":"tool","tool_call_id":"c","content":"x","tool_calls":[1]}]}'),
]


@pytest.mark.parametrize("payload", GENERAL_CRASHES, ids=range(len(GENERAL_CRASHES)))
def test_regression_general_path_raises_record_error_not_a_crash(payload):
    """Regression: normalise raises TypeError / orjson.JSONEncodeError, which
    ingest_records.normalise_chunk does not catch. The fast path correctly declines every one of them."""
    assert fast_row(payload, {}) is None
    with pytest.raises(RecordError):
        normalise(orjson.loads(payload))


@pytest.mark.parametrize("attribution", [{"tenant_id": 12345}, {"consent_id": date(2026, 9, 1)},
                                         {"tenant_id": True}, {"consent_id": 1.5}], ids=str)
def test_regression_non_string_batch_attribution(attribution):
    """Regression. Batch attribution comes from CLI options or a `_batch.yaml`
    sidecar read with yaml.safe_load, where `tenant_id: 12345` is an int and `consent_id: 2026-09-01`
    a date. The fast path writes the value into the row as is (`r.tenant_id or attribution[...]`):
    an int tenant_id where normalise writes "12345" (another record_id), and a bool / date / float
    the general path refuses with wrong_type; ingest_records.rows_table then fails on the non-string column."""
    payload = BASE + b"}"
    violation, _ = _check(payload, attribution)
    assert violation is None, violation


def test_regression_token_counts_beyond_int64_are_refused_not_a_crash():
    """Regression. prompt_tokens in [2^63, 2^64) passes both paths (same row: the
    property holds) but the column is int64, so ingest_records.normalise_chunk raises OverflowError
    building the table: the chunk is lost instead of the record being quarantined."""
    payload = BASE + b',"usage":{"prompt_tokens":9223372036854775808}}'
    assert _check(payload, {})[0] is None
    res = _chunk([payload])
    assert res.table.num_rows + len(res.bad) == 1


def test_regression_literal_backslash_u0000_text_is_not_a_nul():
    """Regression. Ingest's NUL check is a byte search for `\\u0000`, which also
    matches an escaped backslash followed by `u0000`: the JSON string "\\\\u0000" is the six
    characters \\u0000 (no NUL), common in code and in tool arguments that hold JSON, yet the line is
    quarantined as nul_byte. Both paths accept it on their own, with the same row."""
    payload = _content(rb'printf(\"\\u0000\")')  # the JSON string "printf(\"\\u0000\")"
    assert "\x00" not in orjson.loads(payload)["messages"][0]["content"]
    assert _check(payload, {})[0] is None and fast_row(payload, {}) is not None
    res = _chunk([payload])
    assert not res.bad and res.fast == 1
    # the general path's own check (a record the typed decoder declines: a token count of 3.0)
    declined = payload[:-1] + b',"usage":{"prompt_tokens":3.0}}'
    res = _chunk([declined])
    assert not res.bad and res.fast == 0 and res.table.num_rows == 1, res.bad
