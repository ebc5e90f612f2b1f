"""Harbor ATIF (`schema_version: "ATIF-v1.x"`): `steps[]` of system / user / agent turns; agent
steps carry `tool_calls` and `observation.results` (matched by `source_call_id`), per-step
`metrics` (tokens, cost, `completion_token_ids`)."""
from __future__ import annotations

from pathlib import Path

from .common import stable_id, tool_call

NAME = "atif"
_ROLE = {"system": "system", "user": "user", "agent": "assistant"}


def matches(rec: dict) -> bool:
    return str(rec.get("schema_version", "")).upper().startswith("ATIF") or (
        isinstance(rec.get("steps"), list) and "session_id" in rec)


def _messages(steps: list) -> tuple[list, list]:
    out, stamps = [], []
    for s in steps:
        if not isinstance(s, dict):
            out.append(s)
            continue
        if s.get("timestamp"):
            stamps.append(s["timestamp"])
        metrics = s.get("metrics") if isinstance(s.get("metrics"), dict) else {}
        msg = {"role": _ROLE.get(s.get("source"), s.get("source")), "content": s.get("message")}
        if s.get("reasoning_content"):
            msg["reasoning_content"] = s["reasoning_content"]
        if metrics.get("completion_token_ids") is not None:
            msg["token_ids"] = metrics["completion_token_ids"]
        calls = s.get("tool_calls") or []
        if calls:
            msg["tool_calls"] = [tool_call(c.get("tool_call_id"), c.get("function_name"), c.get("arguments"))
                                 if isinstance(c, dict) else c for c in calls]
        out.append(msg)
        obs = s.get("observation") if isinstance(s.get("observation"), dict) else {}
        for r in obs.get("results") or []:
            if isinstance(r, dict) and r.get("source_call_id"):
                out.append({"role": "tool", "tool_call_id": r["source_call_id"], "content": r.get("content")})
            elif isinstance(r, dict):  # feedback not tied to a call (environment / system events)
                out.append({"role": "user", "name": "environment", "content": r.get("content")})
    return out, stamps


def to_native(rec: dict, source: Path | None) -> dict:
    agent = rec.get("agent") if isinstance(rec.get("agent"), dict) else {}
    fm = rec.get("final_metrics") if isinstance(rec.get("final_metrics"), dict) else {}
    extra = rec.get("extra") if isinstance(rec.get("extra"), dict) else {}
    steps = rec.get("steps") or []
    msgs, stamps = _messages(steps)
    if not fm:  # sum the per-step metrics when no totals are given
        ms = [s.get("metrics") for s in steps if isinstance(s, dict) and isinstance(s.get("metrics"), dict)]
        fm = {"total_prompt_tokens": sum(m.get("prompt_tokens") or 0 for m in ms) if ms else None,
              "total_completion_tokens": sum(m.get("completion_tokens") or 0 for m in ms) if ms else None,
              "total_cost_usd": sum(m.get("cost_usd") or 0 for m in ms) if ms else None}
    name = "/".join(str(x) for x in (agent.get("name"), agent.get("version"), agent.get("model_name")) if x)
    sid = rec.get("session_id")
    task = extra.get("task_id") or extra.get("task_name") or sid
    return {
        "trajectory_id": f"atif:{sid}" if sid else stable_id("atif", rec),
        "task_id": task, "issue_id": extra.get("issue_id") or task, "repo": extra.get("repo"),
        "tenant_id": extra.get("tenant_id"), "consent_id": extra.get("consent_id"),
        "agent_id": name or None, "messages": msgs,
        "started_at": stamps[0] if stamps else None, "ended_at": stamps[-1] if stamps else None,
        "deliverable": {"patch": extra.get("patch")},
        "usage": {"prompt_tokens": fm.get("total_prompt_tokens"),
                  "completion_tokens": fm.get("total_completion_tokens"), "cost_usd": fm.get("total_cost_usd")},
        "extra": {"atif_version": rec.get("schema_version"), "notes": rec.get("notes"),
                  **{k: v for k, v in extra.items() if k not in ("tenant_id", "consent_id", "patch")}},
    }
