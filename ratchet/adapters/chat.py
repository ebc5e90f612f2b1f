"""Generic chat logs, the most common thing users have: no task id, often no trajectory id.

- `openai_messages`: `{"messages": [...]}` (the OpenAI fine-tuning form) or `{"id": ..., "messages":
  [...]}`, optionally with `tools`; `id` is the trajectory id.
- `sharegpt`: `{"conversations": [{"from": "human" | "gpt" | "system" | "function_call" |
  "observation", "value": ...}], "system"?: ..., "tools"?: ...}`.
- `message_list`: a bare JSON array of chat messages (one conversation).

Ids the record does not carry are derived by `contract.normalise(derive_ids=True)` and listed in
`extra.ratchet_derived`. Tenant and consent come from the record, the flags or `_batch.yaml`."""
from __future__ import annotations

from pathlib import Path

import orjson

from .common import tool_call

OPENAI = "openai_messages"
SHAREGPT = "sharegpt"
MESSAGE_LIST = "message_list"
NAMES = (OPENAI, SHAREGPT, MESSAGE_LIST)

_FROM = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system", "tool": "tool",
         "observation": "tool", "function_response": "tool", "function_call": "assistant"}


def matches_openai(rec: dict) -> bool:
    return isinstance(rec.get("messages"), list) and "trajectory_id" not in rec and "task_id" not in rec


def matches_sharegpt(rec: dict) -> bool:
    conv = rec.get("conversations")
    return isinstance(conv, list) and bool(conv) and all(isinstance(m, dict) and "from" in m for m in conv)


def _calls(value, i: int) -> list[dict] | None:
    """A ShareGPT `function_call` value: JSON text of one call or a list of calls."""
    try:
        obj = orjson.loads(value) if isinstance(value, str) else value
    except orjson.JSONDecodeError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    if not items or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in items):
        return None
    return [tool_call(f"call_{i}_{j}", c["name"], c.get("arguments", {})) for j, c in enumerate(items)]


def sharegpt_messages(rec: dict) -> list:
    out: list = []
    if isinstance(rec.get("system"), str) and rec["system"]:
        out.append({"role": "system", "content": rec["system"]})
    pending: list[str] = []
    for i, m in enumerate(rec["conversations"]):
        src = m.get("from")
        role = _FROM.get(src, src) if isinstance(src, str) else src
        msg = {"role": role, "content": m.get("value")}
        if src == "function_call" and (calls := _calls(m.get("value"), i)):
            msg = {"role": "assistant", "content": None, "tool_calls": calls}
            pending = [c["id"] for c in calls]
        elif role == "tool":
            msg["tool_call_id"] = pending.pop(0) if pending else None
        if src != role:
            msg["from"] = src  # the source's own speaker name is kept
        for k, v in m.items():
            if k not in ("from", "value"):
                msg.setdefault(k, v)
        out.append(msg)
    return out


def to_native(fmt: str, rec, source: Path | None) -> dict:
    if fmt == MESSAGE_LIST:
        return {"messages": rec}
    if fmt == SHAREGPT:
        tools = rec.get("tools")
        if isinstance(tools, str):  # LLaMA-Factory writes the tool list as JSON text
            try:
                tools = orjson.loads(tools)
            except orjson.JSONDecodeError:
                pass
        out = {k: v for k, v in rec.items() if k not in ("conversations", "system", "tools")}
        return {**out, "messages": sharegpt_messages(rec), "tools": tools}
    return rec
