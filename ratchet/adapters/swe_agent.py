"""SWE-agent `.traj`: `{"trajectory": [steps], "history": [chat], "info": {...}}`.

`history` is the chat the model saw. With function calling it already holds `tool_calls` and
`tool` messages (ids in `tool_call_ids`); otherwise each `trajectory` step (thought, action,
observation) becomes an assistant turn with one tool call and its result. A file that holds only
`history` (no `trajectory`) is read from it: an assistant message's `action` becomes a `bash`
call and the next observation its result.

Nothing is dropped: every message keeps its own keys (`agent`, `message_type`, `thought`,
`tool_call_ids`, ...); a step read as a turn keeps its other keys (`response`, `state`,
`execution_time`, `query`, `extra_info`) in that assistant message's `step`; when the turns come
from `history`, the steps go to `extra.trajectory` without the text the messages already hold
verbatim, and so does the part of `history` a step-built chat does not use (`extra.history`);
`info` (`edited_files30`, hashes, the rest of `model_stats`) goes to `extra.info`."""
from __future__ import annotations

from pathlib import Path

from .common import attach, instance_from_path, repo_of, rest, stable_id, tool_call

NAME = "swe_agent"
_STEP_MAPPED = ("thought", "action", "observation")
_INFO_MAPPED = ("submission", "exit_status", "swe_agent_version", "model_stats", "instance_id")
_STATS_MAPPED = ("instance_cost", "tokens_sent", "tokens_received", "api_calls")


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
        msg = dict(m)
        if m.get("role") == "tool" and msg.get("tool_call_id") is None:
            ids = m.get("tool_call_ids")
            msg["tool_call_id"] = ids[0] if isinstance(ids, list) and ids else None
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


def _from_steps(history: list, steps: list) -> tuple[list, list]:
    """(messages, the history the messages do not use). The prompt is the history before the
    first model output (system + instance template)."""
    out = []
    n = 0
    for m in history:
        if not isinstance(m, dict) or m.get("role") == "assistant":
            break
        out.append(dict(m))
        n += 1
    for i, s in enumerate(steps):
        if not isinstance(s, dict):
            out.append(s)
            continue
        cid = f"step_{i}"
        msg = {"role": "assistant", "content": s.get("thought") or s.get("response") or "",
               "tool_calls": [tool_call(cid, "bash", {"command": s.get("action") or ""})]}
        other = rest(s, _STEP_MAPPED)
        if other:
            msg["step"] = other
        out.append(msg)
        out.append({"role": "tool", "tool_call_id": cid, "content": s.get("observation")})
    return out, history[n:]


def _strings(msgs: list) -> set:
    """Every string value of the messages (one level into each), to tell what they hold verbatim."""
    out = set()
    for m in msgs:
        if isinstance(m, dict):
            out.update(v for v in m.values() if isinstance(v, str))
            out.update(v for s in m.values() if isinstance(s, dict) for v in s.values() if isinstance(v, str))
    return out


_TEXT = ("thought", "action", "observation", "response", "content")


def _not_held(items: list, held: set) -> list:
    """`items` (steps or messages) without their texts (thought, action, observation, response,
    content) that the messages already hold verbatim; every other key stays."""
    out = []
    for it in items:
        if isinstance(it, dict):
            it = {k: v for k, v in it.items() if not (k in _TEXT and isinstance(v, str) and v and v in held)}
        out.append(it)
    return out


def to_native(rec: dict, source: Path | None) -> dict:
    info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    history = rec.get("history") if isinstance(rec.get("history"), list) else []
    steps = rec.get("trajectory") if isinstance(rec.get("trajectory"), list) else []
    inst = rec.get("instance_id") or info.get("instance_id") or instance_from_path(source, (".traj",))
    extra: dict = {"exit_status": info.get("exit_status"), "api_calls": stats.get("api_calls")}
    msgs = _from_history(history)
    if msgs is None and not isinstance(rec.get("trajectory"), list):
        msgs = _history_only(history)
    if msgs is None:
        msgs, unused = _from_steps(history, steps)
        if unused:
            extra["history"] = _not_held(unused, _strings(msgs))
    elif steps:
        extra["trajectory"] = _not_held(steps, _strings(msgs))
    secs = [s.get("execution_time") for s in steps if isinstance(s, dict)]
    latency = sum(x for x in secs if isinstance(x, (int, float))) if secs else None
    info_rest = rest(info, _INFO_MAPPED)
    if not isinstance(info.get("model_stats"), dict) and "model_stats" in info:
        info_rest["model_stats"] = info["model_stats"]
    elif rest(stats, _STATS_MAPPED):
        info_rest["model_stats"] = rest(stats, _STATS_MAPPED)
    if info_rest:
        extra["info"] = info_rest
    env = rec.get("environment")
    if env is not None and not isinstance(env, str):
        extra["environment"] = env
    out = {
        "trajectory_id": f"swe-agent:{inst}" if inst else stable_id("swe-agent", rec),
        "task_id": inst, "issue_id": inst, "repo": repo_of(inst),
        "agent_id": "swe-agent" + (f"@{info['swe_agent_version']}" if info.get("swe_agent_version") else ""),
        "messages": msgs,
        "deliverable": {"patch": info.get("submission") or None},
        "usage": {"cost_usd": stats.get("instance_cost"), "prompt_tokens": stats.get("tokens_sent"),
                  "completion_tokens": stats.get("tokens_received"), "latency_s": latency},
        "environment": {"id": env if isinstance(env, str) else None},
        "extra": extra,
    }
    # the file's other top-level keys (replay_config, ...) are the record's: contract keeps them in extra
    attach(out["extra"], rest(rec, ("trajectory", "history", "info", "environment", "instance_id")))
    return out
