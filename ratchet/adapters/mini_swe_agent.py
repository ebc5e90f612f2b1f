"""mini-swe-agent `*.traj.json`: `{"info": {...}, "messages": [...], "trajectory_format": ...}`.

v1 agents act through one bash block per assistant turn and get the output back as the next user
message; those become an explicit `bash` tool call and its `tool` result. Messages that already
carry `tool_calls` are kept as they are."""
from __future__ import annotations

import re
from pathlib import Path

from .common import instance_from_path, repo_of, stable_id, tool_call

NAME = "mini_swe_agent"
_BASH = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.S)


def matches(rec: dict) -> bool:
    fmt = str(rec.get("trajectory_format", ""))
    return fmt.startswith("mini-swe-agent") or (
        isinstance(rec.get("info"), dict) and isinstance(rec.get("messages"), list)
        and "trajectory_id" not in rec)


def _convert(messages: list) -> list[dict]:
    out: list[dict] = []
    pending: str | None = None
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)  # the contract check reports it with its index
            continue
        role, content = m.get("role"), m.get("content")
        if role == "assistant" and not m.get("tool_calls") and isinstance(content, str):
            blocks = _BASH.findall(content)
            if blocks:
                pending = f"call_{i}"
                out.append({"role": "assistant", "content": content,
                            "tool_calls": [tool_call(pending, "bash", {"command": blocks[0].strip()})]})
                continue
        if role == "user" and pending is not None:
            out.append({"role": "tool", "tool_call_id": pending, "content": content})
            pending = None
            continue
        pending = None
        out.append({k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")})
    return out


def to_native(rec: dict, source: Path | None) -> dict:
    info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    inst = rec.get("instance_id") or info.get("instance_id") or instance_from_path(source, (".traj.json", ".json"))
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    model = (config.get("model") or {}).get("model_name") if isinstance(config.get("model"), dict) else None
    return {
        "trajectory_id": f"mini-swe-agent:{inst}" if inst else stable_id("mini-swe-agent", rec),
        "task_id": inst, "issue_id": inst, "repo": repo_of(inst),
        "agent_id": "mini-swe-agent" + (f"/{model}" if model else ""),
        "messages": _convert(rec.get("messages") or []),
        "deliverable": {"patch": info.get("submission") or None},
        "usage": {"cost_usd": stats.get("instance_cost"), "prompt_tokens": None, "completion_tokens": None},
        "extra": {"exit_status": info.get("exit_status"), "api_calls": stats.get("api_calls"),
                  "mini_version": info.get("mini_version"), "trajectory_format": rec.get("trajectory_format")},
    }
