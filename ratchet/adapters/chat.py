"""Generic chat logs, the most common thing users have: no task id, often no trajectory id.

- `openai_messages`: `{"messages": [...]}` (the OpenAI fine-tuning form) or `{"id": ..., "messages":
  [...]}`, optionally with `tools`; `id` is the trajectory id.
- `sharegpt`: `{"conversations": [{"from": "human" | "gpt" | "system" | "function_call" |
  "observation", "value": ...}], "system"?: ..., "tools"?: ...}`.
- `message_list`: a bare JSON array of chat messages (one conversation).
- `openai_functions`: either of the first and last in OpenAI's legacy function-calling form
  (an assistant `function_call`, answered by a `role: "function"` message; `functions` for
  `tools`): each call becomes a tool call, each answer its `tool` result (matched by name).

A ShareGPT observation that follows several calls of one turn with no other observation after it
answers all of them: each call gets a `tool` message with the whole observation, marked
`observation_shared_by` (the number of calls it answers).

Ids the record does not carry are derived by `contract.normalise(derive_ids=True)` and listed in
`extra.ratchet_derived`. Tenant and consent come from the record, the flags or `_batch.yaml`."""
from __future__ import annotations

from pathlib import Path

import orjson

from .common import attach, rest, tool_call

OPENAI = "openai_messages"
SHAREGPT = "sharegpt"
MESSAGE_LIST = "message_list"
OPENAI_FUNCTIONS = "openai_functions"
NAMES = (OPENAI, SHAREGPT, MESSAGE_LIST, OPENAI_FUNCTIONS)

_FROM = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system", "tool": "tool",
         "observation": "tool", "function_response": "tool", "function_call": "assistant"}


def matches_openai(rec: dict) -> bool:
    return isinstance(rec.get("messages"), list) and "trajectory_id" not in rec and "task_id" not in rec


def matches_sharegpt(rec: dict) -> bool:
    conv = rec.get("conversations")
    return isinstance(conv, list) and bool(conv) and all(isinstance(m, dict) and "from" in m for m in conv)


def matches_functions(msgs) -> bool:
    """Chat messages in OpenAI's legacy function-calling form."""
    return isinstance(msgs, list) and any(
        isinstance(m, dict) and (m.get("role") == "function" or (
            m.get("role") == "assistant" and isinstance(m.get("function_call"), dict))) for m in msgs)


def _calls(value, i: int) -> list[dict] | None:
    """A ShareGPT `function_call` value: JSON text of one call or a list of calls (a call's other
    keys are kept on it; its own string `id` is used)."""
    try:
        obj = orjson.loads(value) if isinstance(value, str) else value
    except orjson.JSONDecodeError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    if not items or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in items):
        return None
    return [attach(tool_call(c["id"] if isinstance(c.get("id"), str) and c["id"] else f"call_{i}_{j}", c["name"],
                             c.get("arguments", {})), rest(c, ("id", "name", "arguments")))
            for j, c in enumerate(items)]


def _role(m) -> str | None:
    src = m.get("from") if isinstance(m, dict) else None
    return _FROM.get(src, src) if isinstance(src, str) else src


def sharegpt_messages(rec: dict) -> list:
    out: list = []
    if isinstance(rec.get("system"), str) and rec["system"]:
        out.append({"role": "system", "content": rec["system"]})
    pending: list[str] = []
    conv = rec["conversations"]
    for i, m in enumerate(conv):
        src = m.get("from")
        role = _role(m)
        msg = {"role": role, "content": m.get("value")}
        answers = None
        if src == "function_call" and (calls := _calls(m.get("value"), i)):
            msg = {"role": "assistant", "content": None, "tool_calls": calls}
            pending = [c["id"] for c in calls]
        elif role == "tool":
            last = i + 1 == len(conv) or _role(conv[i + 1]) != "tool"
            if last and len(pending) > 1:  # the one observation left answers every open call
                answers, pending = pending, []
            else:
                msg["tool_call_id"] = pending.pop(0) if pending else None
        if src != role:
            msg["from"] = src  # the source's own speaker name is kept
        attach(msg, rest(m, ("from", "value")))
        if answers:
            out.extend({**msg, "tool_call_id": cid, "observation_shared_by": len(answers)} for cid in answers)
        else:
            out.append(msg)
    return out


def function_messages(msgs: list) -> list:
    """OpenAI's legacy function calls as tool calls: an assistant `function_call` becomes one tool
    call (id `call_<index>`, its other keys kept on it), a `role: "function"` message the `tool`
    result of the open call of that name (else the oldest open one)."""
    out: list = []
    pending: list[tuple[str, str]] = []
    for i, m in enumerate(msgs):
        fc = m.get("function_call") if isinstance(m, dict) else None
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(fc, dict):
            cid = f"call_{i}"
            call = attach(tool_call(cid, fc.get("name"), fc.get("arguments")), rest(fc, ("name", "arguments")))
            msg = {k: v for k, v in m.items() if k != "function_call"}
            msg["tool_calls"] = [*(m.get("tool_calls") or []), call] if isinstance(m.get("tool_calls") or [], list) \
                else m["tool_calls"]
            pending.append((cid, fc.get("name")))
            out.append(msg)
        elif isinstance(m, dict) and m.get("role") == "function":
            match = next((p for p in pending if p[1] == m.get("name")), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
            # no open call: tool_call_id None, which the contract refuses as an orphan result
            out.append({**m, "role": "tool", "tool_call_id": match[0] if match else m.get("tool_call_id")})
        else:
            out.append(m)
    return out


def to_native(fmt: str, rec, source: Path | None) -> dict:
    if fmt == MESSAGE_LIST:
        return {"messages": rec}
    if fmt == OPENAI_FUNCTIONS:
        rec = {"messages": rec} if isinstance(rec, list) else rec
        out = {**rec, "messages": function_messages(rec["messages"])}
        if isinstance(rec.get("functions"), list) and rec.get("tools") is None:  # the legacy name of `tools`
            out.pop("functions")
            out["tools"] = [{"type": "function", "function": f} for f in rec["functions"]]
        return out
    if fmt == SHAREGPT:
        tools = rec.get("tools")
        if isinstance(tools, str):  # LLaMA-Factory writes the tool list as JSON text
            try:
                tools = orjson.loads(tools)
            except orjson.JSONDecodeError:
                pass
        used = ("conversations", "tools") + (("system",) if isinstance(rec.get("system"), str) and rec["system"]
                                             else ())
        return {**rest(rec, used), "messages": sharegpt_messages(rec), "tools": tools}
    return rec
