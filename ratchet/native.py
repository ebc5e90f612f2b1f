"""Fast path for native contract records: msgspec decodes and type-checks a JSONL line in one C
pass into typed structs, and `fast_row` builds the same content row `contract.normalise` would.

It is conservative by construction: anything the strict types do not describe exactly (unknown
keys, list-of-parts content, dict tool arguments, numeric ids, flat form, a foreign format...)
makes `fast_row` return None, and the caller runs the general path, which either accepts the
record or names precisely what is wrong with it. So the fast path changes speed, never what is
accepted or the row it becomes; `tests/ingest/test_native.py` checks that differentially.

Measured on 5.7 KiB synthetic records (one core): orjson.loads + the Python validator took
~35 us/record, the typed msgspec decode + the checks left in Python ~15-20 us. (msgspec is the
maintained library for exactly this: schema-validated JSON decoding in C.)
"""
from datetime import datetime
from typing import Annotated, Literal, Optional

import msgspec
import orjson

from ratchet.contract import CONTENT_NAMES, SCHEMA_VERSION, _tools_json, utc_from_iso, values_hash

_TOKEN = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
_NONNEG_INT = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]     # int64 columns
_STEP = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]     # approvals' int32 step
_NONNEG_FLOAT = Annotated[float, msgspec.Meta(ge=0)]


class Function(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: Optional[str] = None


class ToolCall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):  # kw_only: declared order
    id: str                                                                    # is the canonical order
    type: str = "function"
    function: Function


# Field order is the canonical key order of a stored message (contract.MESSAGE_KEYS); None-valued
# optional keys are omitted, `content` is always written.
class Message(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: Optional[str]
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None
    reasoning_content: Optional[str] = None
    token_ids: Optional[list[_TOKEN]] = None


class Deliverable(msgspec.Struct, forbid_unknown_fields=True):
    patch: Optional[str] = None


class Outcome(msgspec.Struct, forbid_unknown_fields=True):
    tests_passed: Optional[bool] = None
    accepted: Optional[bool] = None
    human_edited: Optional[bool] = None


class Usage(msgspec.Struct, forbid_unknown_fields=True):
    prompt_tokens: Optional[_NONNEG_INT] = None
    completion_tokens: Optional[_NONNEG_INT] = None
    cost_usd: Optional[_NONNEG_FLOAT] = None
    latency_s: Optional[_NONNEG_FLOAT] = None


class Environment(msgspec.Struct, forbid_unknown_fields=True):
    id: Optional[str] = None
    digest: Optional[str] = None


class Approval(msgspec.Struct, forbid_unknown_fields=True):
    step: Optional[_STEP] = None
    approver: Optional[str] = None
    decision: Optional[str] = None
    at: Optional[str] = None
    time: Optional[str] = None
    note: Optional[str] = None


class Record(msgspec.Struct, forbid_unknown_fields=True):
    trajectory_id: str
    task_id: str
    messages: list[Message]
    schema_version: Optional[Literal["ratchet.trajectory/v1"]] = None
    tenant_id: Optional[str] = None
    consent_id: Optional[str] = None
    repo: Optional[str] = None
    issue_id: Optional[str] = None
    agent_id: Optional[str] = None
    started_at: Optional[str] = None
    ended_at: Optional[str] = None
    tools: Optional[list] = None
    approvals: Optional[list[Approval]] = None
    deliverable: Optional[Deliverable] = None
    outcome: Optional[Outcome] = None
    usage: Optional[Usage] = None
    environment: Optional[Environment] = None
    extra: Optional[dict] = None


assert SCHEMA_VERSION == "ratchet.trajectory/v1"  # the Literal above must follow the contract

_DECODER = msgspec.json.Decoder(Record)
_ENCODER = msgspec.json.Encoder()
_EMPTY_D, _EMPTY_O, _EMPTY_U, _EMPTY_E = Deliverable(), Outcome(), Usage(), Environment()


def _ts(v: Optional[str]) -> Optional[datetime]:
    """`contract.parse_ts` for the strings the types let through (ValueError: the general path)."""
    return utc_from_iso(v) if v else None


def _attributed(attribution: dict, key: str) -> Optional[str]:
    v = attribution.get(key)
    if v and type(v) is not str:
        raise TypeError(f"batch {key} is not a string")  # the general path converts or refuses it
    return v or None


def _prompt(msgs: list) -> str:
    """`contract.prompt_text` over structs."""
    parts = []
    for m in msgs:
        if m.role == "system":
            parts.append(m.content or "")
        elif m.role == "user":
            parts.append(m.content or "")
            break
    return "\n".join(parts)


def _approval(a: Approval) -> dict:
    """The stored approval, as `contract._approvals` writes it."""
    at = _ts(a.at or a.time)
    return {"step": a.step, "approver": a.approver or None, "decision": a.decision or None,
            "at": at.isoformat() if at else None, "note": a.note or None}


def fast_row(payload: bytes, attribution: dict, source_format: str = "openai_chat") -> dict | None:
    """The content row of a well-formed native record, or None when the general path must judge
    it. `attribution` fills tenant_id / consent_id the record leaves empty (before hashing)."""
    values = fast_values(payload, attribution, source_format)
    return None if values is None else dict(zip(CONTENT_NAMES, values))


def fast_values(payload: bytes, attribution: dict, source_format: str = "openai_chat") -> tuple | None:
    """`fast_row` as a tuple in CONTENT_NAMES order (what ingest turns into columns)."""
    try:
        return _values(_DECODER.decode(payload), attribution, source_format)
    except Exception:  # noqa: BLE001  (any doubt at all: the general path decides and says why)
        return None


_ORDER = ("trajectory_id", "schema_version", "source_format", "tenant_id", "consent_id", "task_id", "repo",
          "issue_id", "agent_id", "started_at", "ended_at", "messages", "tools", "approvals", "patch",
          "tests_passed", "accepted", "human_edited", "prompt_tokens", "completion_tokens", "cost_usd",
          "latency_s", "environment_id", "environment_digest", "prompt_text", "n_messages", "n_turns",
          "n_tool_calls", "extra")
assert _ORDER == CONTENT_NAMES[1:], "native._values must build its tuple in the contract's column order"


def _values(r: Record, attribution: dict, source_format: str) -> tuple | None:
    tid, task, msgs = r.trajectory_id, r.task_id, r.messages
    if not tid.strip() or not task.strip() or not msgs:
        return None
    open_calls: set = set()
    n_turns = n_calls = 0
    for m in msgs:  # what the types cannot say: call/result pairing, tool_calls only on assistants
        tcs = m.tool_calls
        if m.role == "assistant":
            n_turns += 1
            if tcs:
                open_calls.update([c.id for c in tcs])
                n_calls += len(tcs)
        elif tcs:
            return None
        elif m.role == "tool":
            try:
                open_calls.remove(m.tool_call_id)
            except KeyError:
                return None
    started, ended = _ts(r.started_at), _ts(r.ended_at)
    if started is None and ended is None:   # the batch's `ended_at:` for a log with no timestamp
        ended = _ts(attribution.get("ended_at"))
    if started and ended and ended < started:
        return None
    d, o, u, e = r.deliverable or _EMPTY_D, r.outcome or _EMPTY_O, r.usage or _EMPTY_U, r.environment or _EMPTY_E
    extra = r.extra
    mjson = _ENCODER.encode(msgs)
    values = (
        tid, SCHEMA_VERSION, source_format,
        r.tenant_id or _attributed(attribution, "tenant_id"), r.consent_id or _attributed(attribution, "consent_id"),
        task, r.repo or None, r.issue_id or None, r.agent_id or None, started, ended,
        mjson.decode(), _tools_json(r.tools),
        orjson.dumps([_approval(a) for a in r.approvals] if r.approvals else ()).decode(), d.patch,
        o.tests_passed, o.accepted if o.accepted is not None else attribution.get("accepted"), o.human_edited, u.prompt_tokens, u.completion_tokens,
        None if u.cost_usd is None else float(u.cost_usd), None if u.latency_s is None else float(u.latency_s),
        e.id or None, e.digest or None, _prompt(msgs), len(msgs), n_turns, n_calls,
        orjson.dumps(extra, option=orjson.OPT_SORT_KEYS).decode() if extra else None,
    )
    return (values_hash(values, mjson), *values)
