"""Trajectory contract v1: the Arrow schema of the `trajectories` table, the typed model that
writes native records, and `normalise()`, which validates a native record into a table row.

A native record is one JSON object (one JSONL line):

    {"schema_version": "ratchet.trajectory/v1", "trajectory_id": "...", "tenant_id": "...",
     "consent_id": "...", "task_id": "...", "repo": "...", "issue_id": "...", "agent_id": "...",
     "started_at": "2026-11-01T10:00:00Z", "ended_at": "...",
     "messages": [OpenAI chat messages, assistant `tool_calls`, `tool` results; optional
                  per-message `token_ids`],
     "tools": [OpenAI function schemas],
     "approvals": [{"step": 3, "approver": "...", "decision": "approved", "at": "..."}],
     "deliverable": {"patch": "diff --git ..."},
     "outcome": {"tests_passed": true, "accepted": true, "human_edited": false},
     "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "cost_usd": 0.02, "latency_s": 41.5},
     "environment": {"id": "env://...", "digest": "sha256:..."},
     "extra": {...anything else...}}

Unknown top-level keys are kept in `extra`, never dropped.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from operator import itemgetter
from typing import Any

import msgspec
import orjson
import pyarrow as pa

from ratchet.readers import dumps

SCHEMA_VERSION = "ratchet.trajectory/v1"
ROLES = frozenset({"system", "user", "assistant", "tool"})

TOOL_CALL = pa.struct([
    ("id", pa.string()),
    ("type", pa.string()),
    ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
])
MESSAGE = pa.struct([
    ("role", pa.string()),
    ("content", pa.string()),
    ("name", pa.string()),
    ("tool_call_id", pa.string()),
    ("tool_calls", pa.list_(TOOL_CALL)),
    ("reasoning_content", pa.string()),
    # Token ids as the source produced them: retokenising multi-turn text drifts (a known RL bug).
    ("token_ids", pa.list_(pa.int32())),
])
APPROVAL = pa.struct([
    ("step", pa.int32()),
    ("approver", pa.string()),
    ("decision", pa.string()),
    ("at", pa.timestamp("us", tz="UTC")),
    ("note", pa.string()),
])
TS = pa.timestamp("us", tz="UTC")

JSON = {b"format": b"json"}  # field metadata: the column holds JSON text (DuckDB type JSON)

# Columns filled from the record; `normalise` returns a dict with exactly these keys.
CONTENT_FIELDS = [
    pa.field("record_id", pa.string(), nullable=False),   # sha256 of the normalised content
    pa.field("trajectory_id", pa.string(), nullable=False),
    pa.field("schema_version", pa.string()),
    pa.field("source_format", pa.string()),
    pa.field("tenant_id", pa.string()),
    pa.field("consent_id", pa.string()),
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("repo", pa.string()),
    pa.field("issue_id", pa.string()),
    pa.field("agent_id", pa.string()),
    pa.field("started_at", TS),
    pa.field("ended_at", TS),
    # Nested parts are stored as JSON, validated against the MESSAGE / APPROVAL shapes at ingest.
    # Building nested Arrow structs row by row cost ~95 us/record and DuckDB's from_json ~50 us
    # (measured on 5.8 KB records), more than parsing and validating together; the typed views
    # (v_messages, v_tool_calls) apply from_json only to the rows a query reads.
    pa.field("messages", pa.string(), metadata=JSON),     # list<MESSAGE>, OpenAI chat form
    pa.field("tools", pa.string(), metadata=JSON),        # list of OpenAI function schemas
    pa.field("approvals", pa.string(), metadata=JSON),    # list<APPROVAL>
    pa.field("patch", pa.string()),
    pa.field("tests_passed", pa.bool_()),
    pa.field("accepted", pa.bool_()),
    pa.field("human_edited", pa.bool_()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("cost_usd", pa.float64()),
    pa.field("latency_s", pa.float64()),
    pa.field("environment_id", pa.string()),
    pa.field("environment_digest", pa.string()),
    # Derived at ingest, for dedup and analysts.
    pa.field("prompt_text", pa.string()),   # the task context a policy sees (system + first user)
    pa.field("n_messages", pa.int32()),
    pa.field("n_turns", pa.int32()),        # assistant messages
    pa.field("n_tool_calls", pa.int32()),
    pa.field("extra", pa.string(), metadata=JSON),  # everything not mapped above
]
# Columns added by the ingest run (not part of the content hash).
INGEST_FIELDS = [
    pa.field("source_file", pa.string()),
    pa.field("source_line", pa.int64()),
    pa.field("batch_id", pa.string()),
    pa.field("ingested_at", TS),
    pa.field("id_clash", pa.bool_()),       # another record has this trajectory_id, other content
]
TRAJECTORY_SCHEMA = pa.schema(CONTENT_FIELDS + INGEST_FIELDS)


def duck_structure(t: pa.DataType):
    """DuckDB `from_json` structure for an Arrow type (used by the typed views)."""
    if pa.types.is_struct(t):
        return {f.name: duck_structure(f.type) for f in t}
    if pa.types.is_list(t):
        return [duck_structure(t.value_type)]
    return duck_type(t)


def duck_type(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ"
    return {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
            pa.bool_(): "BOOLEAN", pa.float64(): "DOUBLE", pa.binary(): "BLOB"}[t]


def duck_column_type(f: pa.Field) -> str:
    """DuckDB column type for an Arrow field: JSON for `format: json` metadata, T[] for a list."""
    if (f.metadata or {}).get(b"format") == b"json":
        return "JSON"
    if pa.types.is_list(f.type):
        return duck_column_type(pa.field(f.name, f.type.value_type)) + "[]"
    return duck_type(f.type)


def duck_ddl(name: str, schema: pa.Schema) -> str:
    """`CREATE TABLE IF NOT EXISTS` for an Arrow schema (the one Arrow -> DuckDB DDL helper)."""
    cols = ", ".join(f'"{f.name}" {duck_column_type(f)}' for f in schema)
    return f"CREATE TABLE IF NOT EXISTS {name} ({cols})"


class RecordError(ValueError):
    """A record that cannot enter the contract. `code` is stable (queryable); `detail` says why."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


# --------------------------------------------------------------------------- typed model
@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict | str = field(default_factory=dict)

    def to_openai(self) -> dict:
        args = self.arguments if isinstance(self.arguments, str) else orjson.dumps(self.arguments).decode()
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(slots=True)
class Message:
    role: str
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    token_ids: list[int] | None = None

    def to_openai(self) -> dict:
        m: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            m["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        for k in ("tool_call_id", "name", "token_ids"):
            v = getattr(self, k)
            if v is not None:
                m[k] = v
        return m


@dataclass(slots=True)
class Approval:
    step: int
    approver: str
    decision: str
    at: str
    note: str | None = None


@dataclass(slots=True)
class Trajectory:
    """The typed model. `to_record()` gives the native JSON object ingest reads."""
    trajectory_id: str
    task_id: str
    messages: list[Message]
    tenant_id: str | None = None
    consent_id: str | None = None
    repo: str | None = None
    issue_id: str | None = None
    agent_id: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    tools: list[dict] = field(default_factory=list)
    approvals: list[Approval] = field(default_factory=list)
    patch: str | None = None
    tests_passed: bool | None = None
    accepted: bool | None = None
    human_edited: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    environment_id: str | None = None
    environment_digest: str | None = None
    extra: dict = field(default_factory=dict)

    def to_record(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "trajectory_id": self.trajectory_id, "tenant_id": self.tenant_id,
            "consent_id": self.consent_id, "task_id": self.task_id, "repo": self.repo,
            "issue_id": self.issue_id, "agent_id": self.agent_id,
            "started_at": self.started_at, "ended_at": self.ended_at,
            "messages": [m.to_openai() for m in self.messages],
            "tools": self.tools,
            "approvals": [asdict(a) for a in self.approvals],
            "deliverable": {"patch": self.patch},
            "outcome": {"tests_passed": self.tests_passed, "accepted": self.accepted,
                        "human_edited": self.human_edited},
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                      "cost_usd": self.cost_usd, "latency_s": self.latency_s},
            "environment": {"id": self.environment_id, "digest": self.environment_digest},
            "extra": self.extra,
        }


# --------------------------------------------------------------------------- validation
_MAPPED = frozenset({
    "schema_version", "trajectory_id", "id", "tenant_id", "consent_id", "task_id", "repo",
    "issue_id", "agent_id", "started_at", "ended_at", "messages", "tools", "approvals",
    "deliverable", "outcome", "usage", "environment", "extra", "patch", "tests_passed",
    "accepted", "human_edited", "prompt_tokens", "completion_tokens", "cost_usd", "latency_s",
    "environment_id", "environment_digest",
    # Derived or ingest-time columns (present when re-reading a warehouse export): recomputed.
    "record_id", "source_format", "prompt_text", "n_messages", "n_turns", "n_tool_calls", "source_file",
    "source_line", "batch_id", "ingested_at", "id_clash",
})


def _opt_str(rec: dict, key: str, path: str | None = None) -> str | None:
    v = rec.get(key)
    if v is None or type(v) is str:
        return v or None
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)  # numeric ids are common in foreign logs; keep them as text
    raise RecordError("wrong_type", f"{path or key} must be a string, got {type(v).__name__}")


def _req_id(rec: dict, key: str) -> str:
    v = _opt_str(rec, key)
    if not v or not v.strip():
        raise RecordError("missing_id", f"{key} is missing or empty")
    return v


def _opt_bool(d: dict, key: str, path: str) -> bool | None:
    v = d.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise RecordError("wrong_type", f"{path} must be a boolean, got {type(v).__name__}")


def _opt_num(d: dict, key: str, path: str, kind=float):
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecordError("wrong_type", f"{path} must be a number, got {type(v).__name__}")
    if v < 0:
        raise RecordError("out_of_range", f"{path} must be >= 0, got {v}")
    if kind is int:
        if v != int(v):
            raise RecordError("wrong_type", f"{path} must be an integer, got {v}")
        if v > INT64_MAX:
            raise RecordError("out_of_range", f"{path} must be < 2^63, got {v:.4g}")
        return int(v)
    return float(v)


_ZERO = timedelta(0)
INT64_MAX = 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def utc_from_iso(v: str | datetime) -> datetime:
    """An ISO 8601 string (or a datetime) as an aware UTC time (3.11 reads a trailing Z as UTC;
    naive is UTC). The one timestamp parser: every module that reads a time calls this."""
    t = v if isinstance(v, datetime) else datetime.fromisoformat(v)
    if t.tzinfo is None:
        return t.replace(tzinfo=timezone.utc)
    return t if t.utcoffset() == _ZERO else t.astimezone(timezone.utc)


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
            return datetime.fromtimestamp(v, tz=timezone.utc)
        if type(v) is str:
            return utc_from_iso(v)
        raise TypeError
    except (TypeError, ValueError, OverflowError, OSError):
        raise RecordError("bad_timestamp", f"{path} is not an ISO 8601 time or epoch seconds: {v!r:.60}") from None


def _text(content: Any, path: str) -> str | None:
    """OpenAI content: a string, null, or a list of parts (text parts joined, others kept as JSON)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                out.append(p["text"])
            elif isinstance(p, str):
                out.append(p)
            else:
                out.append(dumps(p).decode())
        return "\n".join(out)
    raise RecordError("wrong_type", f"{path}.content must be a string, a list of parts or null")


def _check_calls(tcs: Any, path: str, open_calls: set) -> int:
    if type(tcs) is not list:
        raise RecordError("wrong_type", f"{path}.tool_calls must be a list")
    for j, c in enumerate(tcs):
        fn = c.get("function") if type(c) is dict else None
        cid = c.get("id") if fn is not None else None
        if type(fn) is not dict or type(cid) is not str or type(fn.get("name")) is not str:
            raise RecordError("wrong_type", f"{path}.tool_calls[{j}] needs a string id and function.name")
        args = fn.get("arguments")
        if type(args) is not str and args is not None:
            if not isinstance(args, (dict, list)):
                raise RecordError("wrong_type", f"{path}.tool_calls[{j}].function.arguments must be a JSON string")
            fn["arguments"] = dumps(args).decode()  # OpenAI form: arguments are JSON text (big ints exact)
        if "type" not in c:
            c["type"] = "function"
        open_calls.add(cid)
    return len(tcs)


def _messages(msgs: Any) -> tuple[int, int]:
    """Validate OpenAI chat messages in place (only non-canonical tool arguments are rewritten);
    every tool result must answer an earlier, still open call. Returns (turns, tool calls)."""
    if type(msgs) is not list:
        raise RecordError("wrong_type", "messages must be a list of OpenAI chat messages")
    open_calls: set[str] = set()
    n_turns = n_calls = 0
    for i, m in enumerate(msgs):
        if type(m) is not dict:
            raise RecordError("wrong_type", f"messages[{i}] must be an object")
        get = m.get
        role = get("role")
        if type(role) is not str or role not in ROLES:
            raise RecordError("bad_role", f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r:.40}")
        content = get("content")
        if content is not None and type(content) is not str and type(content) is not list:
            raise RecordError("wrong_type", f"messages[{i}].content must be a string, a list of parts or null")
        for k in ("name", "tool_call_id", "reasoning_content"):
            v = get(k)
            if v is not None and type(v) is not str:
                raise RecordError("wrong_type", f"messages[{i}].{k} must be a string")
        tcs = get("tool_calls")
        if tcs is not None and type(tcs) is not list:
            raise RecordError("wrong_type", f"messages[{i}].tool_calls must be a list")
        if role == "assistant":
            n_turns += 1
            if tcs:
                n_calls += _check_calls(tcs, f"messages[{i}]", open_calls)
        else:
            if tcs:
                raise RecordError("wrong_type", f"messages[{i}].tool_calls is only allowed on assistant messages")
            if role == "tool":
                tcid = get("tool_call_id")
                if tcid not in open_calls:
                    raise RecordError("orphan_tool_result",
                                      f"messages[{i}] answers tool_call_id {tcid!r:.60} with no matching earlier call")
                open_calls.discard(tcid)
        tok = get("token_ids")
        if tok is not None and (type(tok) is not list or not all(type(t) is int for t in tok)
                                or (tok and (min(tok) < 0 or max(tok) > INT32_MAX))):
            raise RecordError("wrong_type", f"messages[{i}].token_ids must be a list of integers in [0, 2^31)")
    return n_turns, n_calls


def _approvals(raw: Any) -> list[dict]:
    if raw is None:
        return []
    if type(raw) is not list:
        raise RecordError("wrong_type", "approvals must be a list")
    out = []
    for i, a in enumerate(raw):
        if type(a) is not dict:
            raise RecordError("wrong_type", f"approvals[{i}] must be an object")
        step = a.get("step")
        if step is not None and type(step) is not int:
            raise RecordError("wrong_type", f"approvals[{i}].step must be an integer")
        if step is not None and not INT32_MIN <= step <= INT32_MAX:
            raise RecordError("out_of_range", f"approvals[{i}].step must fit in 32 bits, got {step:.4g}")
        try:  # error paths are formatted only on failure: this runs once per approval
            row = {"step": step, "approver": _opt_str(a, "approver"), "decision": _opt_str(a, "decision"),
                   "at": _iso(parse_ts(a.get("at") or a.get("time"), "at")), "note": _opt_str(a, "note")}
        except RecordError as e:
            raise RecordError(e.code, f"approvals[{i}].{e.detail}") from None
        out.append(row)
    return out


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _sub(rec: dict, key: str) -> dict:
    v = rec.get(key)
    if v is None:
        return rec  # flat form: the fields sit at the top level
    if not isinstance(v, dict):
        raise RecordError("wrong_type", f"{key} must be an object")
    return v


def prompt_text(messages: list[dict]) -> str:
    """The task context a policy sees: the system prompt and the first user message."""
    parts = []
    for m in messages:
        if m["role"] == "system":
            parts.append(_text(m.get("content"), "") or "")
        elif m["role"] == "user":
            parts.append(_text(m.get("content"), "") or "")
            break
    return "\n".join(parts)


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


CONTENT_NAMES = tuple(f.name for f in CONTENT_FIELDS)  # record_id first, then the hashed values
_JSON_NAMES = {f.name for f in CONTENT_FIELDS if (f.metadata or {}).get(b"format") == b"json"}
_SCALAR_IDX = [i for i, n in enumerate(CONTENT_NAMES[1:]) if n not in _JSON_NAMES]
_JSON_IDX = [i for i, n in enumerate(CONTENT_NAMES[1:]) if n in _JSON_NAMES]
assert CONTENT_NAMES[0] == "record_id" and CONTENT_NAMES[1:][_JSON_IDX[0]] == "messages"
_scalar_values, _json_rest = itemgetter(*_SCALAR_IDX), itemgetter(*_JSON_IDX[1:])
_hashed_values = itemgetter(*CONTENT_NAMES[1:])


def _tools_json(tools: list) -> str | None:
    """Tool schemas as given (key order kept: it is the parameter order a model is shown)."""
    return dumps(tools).decode() if tools else None


def normalise(rec: Any, source_format: str = "openai_chat", allow_empty_messages: bool = False,
              derive_ids: bool = False) -> dict:
    """Validate one native record and return its content row (CONTENT_FIELDS keys; nested
    columns as JSON text). May rewrite non-canonical tool-call arguments in `rec` in place.

    `derive_ids` (generic chat logs, which carry no task): a missing `task_id` becomes
    `prompt:` + the first 16 hex digits of sha256(prompt_text) (the system prompt and first user
    message: the same task asked twice gets one id), a missing `trajectory_id` becomes `chat:` +
    24 hex digits of sha256 over the canonical messages and tools; each derived name is listed in
    `extra.ratchet_derived`, so governance can tell a derived id from a given one.

    Raises RecordError with a stable code; the caller quarantines the raw payload."""
    try:
        return _normalise(rec, source_format, allow_empty_messages, derive_ids)
    except RecursionError:
        raise RecordError("too_deep", "the record nests too deeply to read") from None
    except (orjson.JSONEncodeError, msgspec.EncodeError, OverflowError) as e:  # an int beyond 64 bits, or depth
        code = "too_deep" if "ecursion" in str(e) else "out_of_range"
        raise RecordError(code, f"a nested value cannot be stored as JSON: {e}") from None


DERIVED_KEY = "ratchet_derived"


def derived_task_id(prompt: str, messages_text: str) -> str:
    """The documented task identity of a chat log without one (see `normalise`)."""
    return "prompt:" + hashlib.sha256((prompt or messages_text).encode()).hexdigest()[:16]


def _normalise(rec: Any, source_format: str, allow_empty_messages: bool, derive_ids: bool = False) -> dict:
    if not isinstance(rec, dict):
        raise RecordError("not_object", f"a record must be a JSON object, got {type(rec).__name__}")
    sv = rec.get("schema_version") or SCHEMA_VERSION
    if sv != SCHEMA_VERSION:
        raise RecordError("unsupported_version", f"schema_version {sv!r:.60} (this reader knows {SCHEMA_VERSION})")
    if "trajectory_id" not in rec and "id" in rec:
        rec = {**rec, "trajectory_id": rec["id"]}
    derived = []
    if derive_ids:
        tid = _opt_str(rec, "trajectory_id")
        task = _opt_str(rec, "task_id")
        tid, task = (tid if tid and tid.strip() else None), (task if task and task.strip() else None)
    else:
        tid = _req_id(rec, "trajectory_id")
        task = _req_id(rec, "task_id")
    msgs = rec.get("messages")
    n_turns, n_calls = _messages(msgs)
    if not msgs and not allow_empty_messages:
        raise RecordError("empty_messages", "messages is empty: a trajectory needs at least one message")
    tools = rec.get("tools") or []
    if not isinstance(tools, list):
        raise RecordError("wrong_type", "tools must be a list of function schemas")
    mtext = messages_json(msgs)
    if derive_ids and (tid is None or task is None):
        if task is None:
            task = derived_task_id(prompt_text(msgs), mtext)
            derived.append("task_id")
        if tid is None:
            tid = "chat:" + hashlib.sha256(f"{mtext}\0{_tools_json(tools) or ''}".encode()).hexdigest()[:24]
            derived.append("trajectory_id")
    deliverable, outcome, usage, env = (_sub(rec, k) for k in ("deliverable", "outcome", "usage", "environment"))
    patch = deliverable.get("patch")
    if patch is not None and not isinstance(patch, str):
        raise RecordError("wrong_type", "deliverable.patch must be a string")
    started = parse_ts(rec.get("started_at"), "started_at")
    ended = parse_ts(rec.get("ended_at"), "ended_at")
    if started and ended and ended < started:
        raise RecordError("out_of_range", "ended_at is before started_at")
    extra = rec.get("extra") or {}
    if not isinstance(extra, dict):
        raise RecordError("wrong_type", "extra must be an object")
    unknown = {k: v for k, v in rec.items() if k not in _MAPPED}
    if unknown:
        extra = {**extra, **unknown}
    if derived:
        extra = {**extra, DERIVED_KEY: sorted(derived)}
    row = {
        "trajectory_id": tid, "schema_version": SCHEMA_VERSION,
        "source_format": source_format,
        "tenant_id": _opt_str(rec, "tenant_id"), "consent_id": _opt_str(rec, "consent_id"),
        "task_id": task, "repo": _opt_str(rec, "repo"), "issue_id": _opt_str(rec, "issue_id"),
        "agent_id": _opt_str(rec, "agent_id"), "started_at": started, "ended_at": ended,
        "messages": mtext, "tools": _tools_json(tools),
        "approvals": orjson.dumps(_approvals(rec.get("approvals"))).decode(), "patch": patch,
        "tests_passed": _opt_bool(outcome, "tests_passed", "outcome.tests_passed"),
        "accepted": _opt_bool(outcome, "accepted", "outcome.accepted"),
        "human_edited": _opt_bool(outcome, "human_edited", "outcome.human_edited"),
        "prompt_tokens": _opt_num(usage, "prompt_tokens", "usage.prompt_tokens", int),
        "completion_tokens": _opt_num(usage, "completion_tokens", "usage.completion_tokens", int),
        "cost_usd": _opt_num(usage, "cost_usd", "usage.cost_usd"),
        "latency_s": _opt_num(usage, "latency_s", "usage.latency_s"),
        "environment_id": _opt_str(env, "id" if env is not rec else "environment_id", "environment.id"),
        "environment_digest": _opt_str(env, "digest" if env is not rec else "environment_digest", "environment.digest"),
        "prompt_text": prompt_text(msgs), "n_messages": len(msgs), "n_turns": n_turns, "n_tool_calls": n_calls,
        "extra": dumps(extra, sort_keys=True).decode() if extra else None,
    }
    row["record_id"] = content_hash(row)
    return row


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
