"""`normalise()`: validate one native record (or a foreign one an adapter mapped) into its
content row. Checks types and ranges field by field, OpenAI chat messages (every tool result
answers an earlier open call), approvals and times; refusals are `RecordError`s with a stable
code. Every key of the record is mapped to a column or kept in `extra` (see `normalise`)."""
from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import msgspec
import orjson

from ratchet.contract.canonical import _tools_json, content_hash, messages_json
from ratchet.contract.schema import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    ROLES,
    SCHEMA_VERSION,
    RecordError,
)
from ratchet.contract.timestamps import parse_ts
from ratchet.readers.json_codec import dumps

# The nested objects and the keys of each that have a column; the same keys may sit at the top
# level instead (the flat form, a warehouse export's), with `environment_` before id and digest.
_NESTED = {"deliverable": ("patch",), "outcome": ("tests_passed", "accepted", "human_edited"),
           "usage": ("prompt_tokens", "completion_tokens", "cost_usd", "latency_s"), "environment": ("id", "digest")}
_FLAT = {k: tuple(f"environment_{x}" if k == "environment" else x for x in keys) for k, keys in _NESTED.items()}
_MAPPED = frozenset({
    "schema_version", "trajectory_id", "id", "tenant_id", "consent_id", "task_id", "repo",
    "issue_id", "agent_id", "started_at", "ended_at", "messages", "tools", "approvals", "extra",
    *_NESTED, *(k for keys in _FLAT.values() for k in keys),
})
# Derived or ingest-time columns of a warehouse export, recomputed when it is re-read. In any
# other record they are the source's own keys, kept in `extra` like any unknown key.
_RECOMPUTED = frozenset({"record_id", "source_format", "prompt_text", "n_messages", "n_turns", "n_tool_calls",
                         "source_file", "source_line", "batch_id", "ingested_at", "id_clash"})
# Where a source value goes when `extra` already holds another value under its name.
UNMAPPED_KEY = "ratchet_unmapped"
_APPROVAL_KEYS = frozenset({"step", "approver", "decision", "at", "time", "note"})


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
        other = a.keys() - _APPROVAL_KEYS
        if a.get("at") and "time" in a:
            other.add("time")  # `at` was read, so `time` is kept as it came
        for k in sorted(other):  # after the five columns' keys, which v_approvals reads
            row[k] = a[k]
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


def _same(a, b) -> bool:
    """Equal as JSON values (1, 1.0 and True are three values here)."""
    return type(a) is type(b) and (a == b if isinstance(a, (str, int, float, type(None))) else
                                   dumps(a, sort_keys=True) == dumps(b, sort_keys=True))


def keep(extra: dict, key: str, value) -> None:
    """Store a source value that no column holds in `extra` under `key`. Never over another value:
    objects are merged key by key, and a value clashing with what `extra` already holds under
    that name goes to `extra[UNMAPPED_KEY]` (then `ratchet_unmapped_2`, ...), so nothing is lost."""
    if key not in extra or _same(extra[key], value):
        extra[key] = value
        return
    cur = extra[key]
    if isinstance(cur, dict) and isinstance(value, dict):
        merged = dict(cur)
        for k, v in value.items():
            keep(merged, k, v)
        extra[key] = merged
        return
    n = 1
    while True:
        name = UNMAPPED_KEY if n == 1 else f"{UNMAPPED_KEY}_{n}"
        bucket = extra.get(name, {})
        if isinstance(bucket, dict) and (key not in bucket or _same(bucket[key], value)):
            extra[name] = {**bucket, key: value}
            return
        n += 1


def _unmapped(rec: dict, exported: bool) -> dict:
    """The record's keys that no column takes, by the name they go under in `extra`: unknown
    top-level keys; the unknown keys of `deliverable` / `outcome` / `usage` / `environment` (under
    that name: `extra.usage.total_tokens`); a flat key (`cost_usd`) next to its nested object,
    which is what the column reads; `id` when `trajectory_id` is given too, and differs."""
    out: dict = {}
    for k, v in rec.items():
        if k not in _MAPPED and (not exported or k not in _RECOMPUTED):
            out[k] = v
    for name, keys in _NESTED.items():
        sub = rec.get(name)
        if isinstance(sub, dict):
            rest = {k: v for k, v in sub.items() if k not in keys}
            if rest:
                out[name] = rest
            for k in _FLAT[name]:
                if k in rec:
                    out[k] = rec[k]
    if "id" in rec and "trajectory_id" in rec and not _same(rec["id"], rec["trajectory_id"]):
        out["id"] = rec["id"]
    return out


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


def normalise(rec: Any, source_format: str = "openai_chat", allow_empty_messages: bool = False,
              derive_ids: bool = False, exported: bool = False) -> dict:
    """Validate one native record and return its content row (CONTENT_FIELDS keys; nested
    columns as JSON text). May rewrite non-canonical tool-call arguments in `rec` in place.

    `derive_ids` (generic chat logs, which carry no task): a missing `task_id` becomes
    `prompt:` + the first 16 hex digits of sha256(prompt_text) (the system prompt and first user
    message: the same task asked twice gets one id), a missing `trajectory_id` becomes `chat:` +
    24 hex digits of sha256 over the canonical messages and tools; each derived name is listed in
    `extra.ratchet_derived`, so governance can tell a derived id from a given one.

    Nothing of the record is dropped: a key no column takes is kept in `extra` (see `_unmapped`
    and `keep`), so two records that differ anywhere get different record_ids. `exported`: the
    record is a warehouse row read back, whose derived and ingest-time columns are recomputed.

    Raises RecordError with a stable code; the caller quarantines the raw payload."""
    try:
        return _normalise(rec, source_format, allow_empty_messages, derive_ids, exported)
    except RecursionError:
        raise RecordError("too_deep", "the record nests too deeply to read") from None
    except (orjson.JSONEncodeError, msgspec.EncodeError, OverflowError) as e:  # an int beyond 64 bits, or depth
        code = "too_deep" if "ecursion" in str(e) else "out_of_range"
        raise RecordError(code, f"a nested value cannot be stored as JSON: {e}") from None


DERIVED_KEY = "ratchet_derived"


def derived_task_id(prompt: str, messages_text: str) -> str:
    """The documented task identity of a chat log without one (see `normalise`)."""
    return "prompt:" + hashlib.sha256((prompt or messages_text).encode()).hexdigest()[:16]


def _normalise(rec: Any, source_format: str, allow_empty_messages: bool, derive_ids: bool = False,
               exported: bool = False) -> dict:
    if not isinstance(rec, dict):
        raise RecordError("not_object", f"a record must be a JSON object, got {type(rec).__name__}")
    sv = rec.get("schema_version") or SCHEMA_VERSION
    if sv != SCHEMA_VERSION:
        raise RecordError("unsupported_version", f"schema_version {sv!r:.60} (this reader knows {SCHEMA_VERSION})")
    unknown = _unmapped(rec, exported)
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
    extra = rec.get("extra")
    if extra is None or (not extra and isinstance(extra, (list, str))):
        extra = {}  # empty: nothing to keep
    elif not isinstance(extra, dict):  # a value (0, false, [1]) that could be kept nowhere
        raise RecordError("wrong_type", "extra must be an object")
    if unknown:
        extra = dict(extra)
        for k, v in unknown.items():
            keep(extra, k, v)
    if derived:
        extra = {**extra, DERIVED_KEY: sorted(derived)}
    row = {
        "trajectory_id": tid, "schema_version": SCHEMA_VERSION,
        "source_format": source_format,
        "tenant_id": _opt_str(rec, "tenant_id"), "consent_id": _opt_str(rec, "consent_id"),
        "task_id": task, "repo": _opt_str(rec, "repo"), "issue_id": _opt_str(rec, "issue_id"),
        "agent_id": _opt_str(rec, "agent_id"), "started_at": started, "ended_at": ended,
        "messages": mtext, "tools": _tools_json(tools),
        "approvals": dumps(_approvals(rec.get("approvals"))).decode(), "patch": patch,
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
