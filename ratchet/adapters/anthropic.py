"""Anthropic Messages logs: the Messages API's conversation form, `{"model", "system", "messages":
[{"role": "user" | "assistant", "content": "..." | [blocks]}], "tools", "usage", ...}`, as a
request body with its reply appended, or a bare array of such messages.

- `system` (text, or a list of text blocks) becomes the system message;
- an assistant's `tool_use` blocks become tool calls (`input` as JSON text arguments), its
  `thinking` blocks its `reasoning_content` (one block's `signature` kept as
  `thinking_signature`; several blocks kept whole in `thinking_blocks`);
- a user message's `tool_result` blocks become `tool` messages answering `tool_use_id` (before
  the rest of that message, as the API orders them), with `is_error` and their other keys;
- other blocks (text with citations, images, documents, server-tool blocks) stay in `content`
  as a list of parts; one plain text block becomes the content string;
- `tools` (`name`, `description`, `input_schema`) become OpenAI function schemas, other keys kept;
- `usage.input_tokens` + the cache read and creation tokens are `prompt_tokens` and
  `output_tokens` is `completion_tokens`; every usage key is kept as it came in `extra.usage`.

Every other key (model, stop_reason, metadata, a block's cache_control, ...) is kept: on the
message, the call or the tool it belongs to, or in the record's `extra`."""
from __future__ import annotations

from pathlib import Path

from .common import attach, rest, tool_call

NAME = "anthropic_messages"
# Block types no OpenAI message has: one of them (or a top-level `system`, or Anthropic usage
# names) tells an Anthropic log from an OpenAI one.
_OWN_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document",
                         "server_tool_use", "web_search_tool_result", "search_result"})


def _own_blocks(m: dict) -> bool:
    c = m.get("content")
    return isinstance(c, list) and any(isinstance(b, dict) and b.get("type") in _OWN_BLOCKS for b in c)


def matches_messages(msgs) -> bool:
    """A list of Messages-API messages: user/assistant roles only, at least one Anthropic block."""
    return (isinstance(msgs, list) and bool(msgs)
            and all(isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in msgs)
            and any(_own_blocks(m) for m in msgs))


def matches(rec: dict) -> bool:
    msgs = rec.get("messages")
    if (not isinstance(msgs, list) or not msgs or rec.get("schema_version") is not None
            or not all(isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in msgs)):
        return False
    usage = rec.get("usage")
    return (any(_own_blocks(m) for m in msgs) or "system" in rec
            or (isinstance(usage, dict) and "input_tokens" in usage and "prompt_tokens" not in usage))


def _plain_text(b) -> bool:
    return isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) and len(b) == 2


def _content(parts: list):
    """Blocks left in a message's content: one plain text block is its text, none is null."""
    if not parts:
        return None
    if len(parts) == 1 and _plain_text(parts[0]):
        return parts[0]["text"]
    return parts


def _assistant(m: dict) -> dict:
    calls, parts, thinking = [], [], []
    for b in m["content"]:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_use":
            calls.append(attach(tool_call(b.get("id"), b.get("name"), b.get("input")),
                                rest(b, ("type", "id", "name", "input"))))
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            thinking.append(b)
        else:
            parts.append(b)
    msg = {"role": "assistant", "content": _content(parts)}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "\n\n".join(b["thinking"] for b in thinking)
        if len(thinking) == 1 and not rest(thinking[0], ("type", "thinking", "signature")):
            if "signature" in thinking[0]:
                msg["thinking_signature"] = thinking[0]["signature"]
        else:
            msg["thinking_blocks"] = thinking
    return msg


def _result_content(c):
    if isinstance(c, list) and len(c) == 1 and _plain_text(c[0]):
        return c[0]["text"]
    return c


def _user(m: dict) -> list[dict]:
    out, parts = [], []
    for b in m["content"]:
        if isinstance(b, dict) and b.get("type") == "tool_result":
            out.append(attach({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                               "content": _result_content(b.get("content"))},
                              rest(b, ("type", "tool_use_id", "content"))))
        else:
            parts.append(b)
    if parts or not out:
        out.append({"role": "user", "content": _content(parts)})
    return out


def messages(msgs: list, system=None) -> list:
    out: list = []
    if system is not None and system != "":
        out.append({"role": "system", "content": _content(system) if isinstance(system, list) else system})
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("content"), list):
            out.append(m)
            continue
        got = [_assistant(m)] if m.get("role") == "assistant" else _user(m)
        attach(got[-1], rest(m, ("role", "content")))
        out.extend(got)
    return out


def _tool(t):
    if not isinstance(t, dict) or "input_schema" not in t or not isinstance(t.get("name"), str):
        return t  # a server tool (web search, ...) or something else: as it came
    fn = {"name": t["name"]}
    if "description" in t:
        fn["description"] = t["description"]
    fn["parameters"] = t["input_schema"]
    return {"type": "function", "function": fn, **rest(t, ("name", "description", "input_schema"))}


def _usage(u: dict) -> dict:
    def n(k):
        v = u.get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    parts = [n(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    prompt = sum(p for p in parts if p is not None) if parts[0] is not None else u.get("input_tokens")
    return {"prompt_tokens": prompt, "completion_tokens": u.get("output_tokens")}


def to_native(rec, source: Path | None) -> dict:
    if isinstance(rec, list):
        rec = {"messages": rec}
    out = rest(rec, ("messages", "system", "tools", "usage"))
    out["messages"] = messages(rec["messages"], rec.get("system"))
    if "system" in rec and (rec["system"] is None or rec["system"] == ""):
        out["system"] = rec["system"]  # an empty system prompt makes no message: the key is kept (extra)
    if rec.get("tools") is not None:
        out["tools"] = [_tool(t) for t in rec["tools"]] if isinstance(rec["tools"], list) else rec["tools"]
    usage = rec.get("usage")
    if isinstance(usage, dict):
        out["usage"] = _usage(usage)
        extra = dict(out["extra"]) if isinstance(out.get("extra"), dict) else {}
        if "extra" in out and not isinstance(out["extra"], dict):
            return {**out, "usage": usage}  # the contract refuses the non-object extra
        attach(extra, {"usage": usage})
        out["extra"] = extra
    elif usage is not None:
        out["usage"] = usage  # not an object: the contract says so
    return out
