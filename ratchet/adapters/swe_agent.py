"""SWE-agent `.traj`: `{"trajectory": [steps], "history": [chat], "info": {...}}`.

`history` is the chat the model saw. With function calling it already holds `tool_calls` and
`tool` messages (ids in `tool_call_ids`); otherwise each `trajectory` step (thought, action,
observation) becomes an assistant turn with one tool call and its result. A file that holds only
`history` (no `trajectory`) is read from it: an assistant message's `action` becomes a `bash`
call and the next observation its result. Per-message keys (`agent`, `message_type`, ...) are kept."""
from __future__ import annotations

from pathlib import Path

from .common import instance_from_path, repo_of, stable_id, tool_call

NAME = "swe_agent"


def matches(rec: dict) -> bool:
    return (isinstance(rec.get("trajectory"), list) and (
        isinstance(rec.get("info"), dict) or isinstance(rec.get("history"), list))) or (
        isinstance(rec.get("history"), list) and "messages" not in rec)


def _from_history(history: list) -> list[dict] | None:
    if not any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in history):
        return None
    out = []
    for m in history:
        if not isinstance(m, dict):
            out.append(m)
            continue
        msg = {"role": m.get("role"), "content": m.get("content")}
        if m.get("tool_calls"):
            msg["tool_calls"] = m["tool_calls"]
        if m.get("role") == "tool":
            ids = m.get("tool_call_ids") or [m.get("tool_call_id")]
            msg["tool_call_id"] = ids[0] if ids else None
        out.append(msg)
    return out


def _history_only(history: list) -> list:
    """A history without function calls: `action` of an assistant message is its bash call."""
    out: list = []
    pending = None
    for i, m in enumerate(history):
        if not isinstance(m, dict):
            out.append(m)
            continue
        m = {k: v for k, v in m.items() if k != "tool_call_ids"}
        if m.get("role") == "assistant" and isinstance(m.get("action"), str) and m["action"].strip():
            pending = f"step_{i}"
            out.append({**m, "tool_calls": [tool_call(pending, "bash", {"command": m["action"]})]})
            continue
        if m.get("role") == "user" and pending is not None:
            out.append({**m, "role": "tool", "tool_call_id": pending})
            pending = None
            continue
        pending = None
        out.append(m)
    return out


def _from_steps(history: list, steps: list) -> list[dict]:
    # The prompt is the history before the first model output (system + instance template).
    out = []
    for m in history:
        if not isinstance(m, dict) or m.get("role") == "assistant":
            break
        out.append({"role": m.get("role"), "content": m.get("content")})
    for i, s in enumerate(steps):
        if not isinstance(s, dict):
            out.append(s)
            continue
        cid = f"step_{i}"
        out.append({"role": "assistant", "content": s.get("thought") or s.get("response") or "",
                    "tool_calls": [tool_call(cid, "bash", {"command": s.get("action") or ""})]})
        out.append({"role": "tool", "tool_call_id": cid, "content": s.get("observation")})
    return out


def to_native(rec: dict, source: Path | None) -> dict:
    info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    history = rec.get("history") if isinstance(rec.get("history"), list) else []
    inst = rec.get("instance_id") or info.get("instance_id") or instance_from_path(source, (".traj",))
    if not isinstance(rec.get("trajectory"), list):
        msgs = _from_history(history) or _history_only(history)
    else:
        msgs = _from_history(history) or _from_steps(history, rec.get("trajectory") or [])
    steps = rec.get("trajectory") or []
    secs = [s.get("execution_time") for s in steps if isinstance(s, dict)]
    latency = sum(x for x in secs if isinstance(x, (int, float))) if secs else None
    return {
        "trajectory_id": f"swe-agent:{inst}" if inst else stable_id("swe-agent", rec),
        "task_id": inst, "issue_id": inst, "repo": repo_of(inst),
        "agent_id": "swe-agent" + (f"@{info['swe_agent_version']}" if info.get("swe_agent_version") else ""),
        "messages": msgs,
        "deliverable": {"patch": info.get("submission") or None},
        "usage": {"cost_usd": stats.get("instance_cost"), "prompt_tokens": stats.get("tokens_sent"),
                  "completion_tokens": stats.get("tokens_received"), "latency_s": latency},
        "environment": {"id": rec.get("environment") if isinstance(rec.get("environment"), str) else None},
        "extra": {"exit_status": info.get("exit_status"), "api_calls": stats.get("api_calls")},
    }
