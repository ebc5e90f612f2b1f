"""mini-swe-agent `*.traj.json`: `{"info": {...}, "messages": [...], "trajectory_format": ...}`, or
a bare array of its messages (older runs and its own test data).

- 1.x (`trajectory_format: mini-swe-agent-1`, text): one ```` ```bash ```` block per assistant turn,
  its output in the next user message.
- 2.x (`mini-swe-agent-1.1`): text models act through ```` ```mswea_bash_command ```` blocks and record
  the parsed commands in the message's `extra.actions` (one observation per action follows, as a
  user message); tool-call models carry `tool_calls` and answer with `role: tool` messages. Every
  message has an `extra` (cost, timestamp, returncode, raw response...): it is kept in the stored
  message. The final `role: exit` message (exit status, submission) goes to the record's `extra`.

Each action becomes a `bash` tool call and each observation its `tool` result (every action, not
only the first). A text turn whose block count is not exactly one was a format error in
mini-swe-agent and ran nothing: it stays a plain message. Nothing is dropped: `info` goes to
`extra.info` but for what has a column (the submission, `model_stats.instance_cost`), and the
file's other top-level keys go to `extra` too."""
from __future__ import annotations

import re
from pathlib import Path

from .common import attach, instance_from_path, repo_of, rest, stable_id, tool_call

NAME = "mini_swe_agent"
_BLOCK = re.compile(r"```(?:bash|sh|mswea_bash_command)\s*\n(.*?)```", re.S)


def matches(rec: dict) -> bool:
    fmt = str(rec.get("trajectory_format", ""))
    return fmt.startswith("mini-swe-agent") or (
        isinstance(rec.get("info"), dict) and isinstance(rec.get("messages"), list)
        and "trajectory_id" not in rec)


def matches_messages(msgs: list) -> bool:
    """A bare message array written by mini-swe-agent: command blocks answered by `<returncode>`."""
    return any(m.get("role") == "assistant" and isinstance(m.get("content"), str) and _BLOCK.search(m["content"])
               for m in msgs) and any(
        m.get("role") == "user" and isinstance(m.get("content"), str) and m["content"].startswith("<returncode>")
        for m in msgs)


def _actions(m: dict) -> list[str]:
    extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
    acts = extra.get("actions")
    if isinstance(acts, list) and acts:
        return [a.get("command") if isinstance(a, dict) else a for a in acts]
    content = m.get("content")
    blocks = _BLOCK.findall(content) if isinstance(content, str) else []
    return [blocks[0].strip()] if len(blocks) == 1 else []


def _convert(messages: list) -> tuple[list, list]:
    out: list = []
    exits: list = []
    pending: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)  # the contract check reports it with its index
            continue
        role = m.get("role")
        if role == "exit":
            exits.append(m)
            continue
        if role == "assistant" and not m.get("tool_calls"):
            acts = _actions(m)
            if acts:
                calls = [tool_call(f"call_{i}_{j}", "bash", {"command": a}) for j, a in enumerate(acts)]
                pending = [c["id"] for c in calls]
                out.append({**m, "tool_calls": calls})
                continue
        if role == "user" and pending:
            out.append({**m, "role": "tool", "tool_call_id": pending.pop(0)})
            continue
        if role != "tool":
            pending = []
        out.append(m)
    return out, exits


def _stamps(messages: list) -> list:
    out = []
    for m in messages:
        extra = m.get("extra") if isinstance(m, dict) and isinstance(m.get("extra"), dict) else {}
        t = extra.get("timestamp")
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            out.append(t)
    return out


def to_native(rec, source: Path | None) -> dict:
    if isinstance(rec, list):
        rec = {"messages": rec}
    info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    inst = rec.get("instance_id") or info.get("instance_id") or instance_from_path(source, (".traj.json", ".json"))
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    model = (config.get("model") or {}).get("model_name") if isinstance(config.get("model"), dict) else None
    msgs, exits = _convert(rec.get("messages") or [])
    stamps = _stamps(rec.get("messages") or [])
    last = exits[-1].get("extra") if exits and isinstance(exits[-1].get("extra"), dict) else {}
    extra = {"exit_status": info.get("exit_status") or last.get("exit_status"), "api_calls": stats.get("api_calls"),
             "mini_version": info.get("mini_version"), "trajectory_format": rec.get("trajectory_format")}
    if exits:
        extra["exit_messages"] = exits
    info_rest = rest(info, ("model_stats", "exit_status", "submission", "mini_version"))
    if "model_stats" in info and (not isinstance(info["model_stats"], dict) or rest(stats, ("instance_cost", "api_calls"))):
        info_rest["model_stats"] = rest(stats, ("instance_cost", "api_calls")) if stats else info["model_stats"]
    if info_rest:
        extra["info"] = info_rest
    attach(extra, rest(rec, ("info", "messages", "trajectory_format", "instance_id")))
    return {
        "trajectory_id": f"mini-swe-agent:{inst}" if inst else stable_id("mini-swe-agent", rec),
        "task_id": inst, "issue_id": inst, "repo": repo_of(inst),
        "agent_id": "mini-swe-agent" + (f"/{model}" if model else ""),
        "messages": msgs,
        "started_at": min(stamps) if stamps else None, "ended_at": max(stamps) if stamps else None,
        "deliverable": {"patch": info.get("submission") or last.get("submission") or None},
        "usage": {"cost_usd": stats.get("instance_cost"), "prompt_tokens": None, "completion_tokens": None},
        "extra": extra,
    }
