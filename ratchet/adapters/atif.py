"""Harbor ATIF (`schema_version: "ATIF-v1.x"`): `steps[]` of system / user / agent turns; agent
steps carry `tool_calls` and `observation.results` (matched by `source_call_id`), per-step
`metrics` (tokens, cost, `completion_token_ids`).

Nothing is dropped: a step's other keys (`step_id`, `timestamp`, `model_name`, `metrics` without
the token ids, `extra`, ...) stay in its message, a call's and a result's in theirs; a result
that answers no call and says nothing (a sub-agent reference alone) stays in its step's
message under `observation`, never an empty user message; `agent`, `final_metrics` and
`continued_trajectory_ref` keys that no column takes go to the record's `extra`."""
from __future__ import annotations

from pathlib import Path

from .common import attach, rest, stable_id, tool_call

NAME = "atif"
_ROLE = {"system": "system", "user": "user", "agent": "assistant"}
_STEP_MAPPED = ("source", "message", "reasoning_content", "tool_calls", "observation", "metrics")
_CALL_MAPPED = ("tool_call_id", "function_name", "arguments")
_TOTALS = {"total_prompt_tokens": "prompt_tokens", "total_completion_tokens": "completion_tokens",
           "total_cost_usd": "cost_usd"}


def matches(rec: dict) -> bool:
    return str(rec.get("schema_version", "")).upper().startswith("ATIF") or (
        isinstance(rec.get("steps"), list) and "session_id" in rec)


def _call(c):
    if not isinstance(c, dict):
        return c
    return attach(tool_call(c.get("tool_call_id"), c.get("function_name"), c.get("arguments")), rest(c, _CALL_MAPPED))


def _step(s: dict, out: list) -> None:
    metrics = s.get("metrics") if isinstance(s.get("metrics"), dict) else None
    msg = {"role": _ROLE.get(s.get("source"), s.get("source")), "content": s.get("message")}
    if s.get("reasoning_content") is not None:
        msg["reasoning_content"] = s["reasoning_content"]
    if metrics is not None and metrics.get("completion_token_ids") is not None:
        msg["token_ids"] = metrics["completion_token_ids"]
    calls = s.get("tool_calls")
    if isinstance(calls, list) and calls:
        msg["tool_calls"] = [_call(c) for c in calls]
    elif calls is not None:
        msg["atif_tool_calls"] = calls  # [] or a malformed value: kept as it came
    step_rest = rest(s, _STEP_MAPPED)
    if metrics is not None:
        m = rest(metrics, ("completion_token_ids",))
        if m:
            step_rest["metrics"] = m
    elif "metrics" in s:
        step_rest["metrics"] = s["metrics"]
    obs = s.get("observation")
    results = obs.get("results") if isinstance(obs, dict) else None
    answers, kept = [], []
    for r in results if isinstance(results, list) else []:
        if isinstance(r, dict) and r.get("source_call_id"):
            answers.append(attach({"role": "tool", "tool_call_id": r["source_call_id"], "content": r.get("content")},
                                  rest(r, ("source_call_id", "content"))))
        elif isinstance(r, dict) and r.get("content") is not None:  # feedback tied to no call (environment)
            answers.append(attach({"role": "user", "name": "environment", "content": r["content"]},
                                  rest(r, ("content",))))
        else:  # says nothing by itself (a sub-agent reference): it stays with its step
            kept.append(r)
    if isinstance(obs, dict):
        o = rest(obs, ("results",))
        if kept or (results is not None and not isinstance(results, list)):
            o["results"] = kept if isinstance(results, list) else results
        if o:
            step_rest["observation"] = o
    elif obs is not None:
        step_rest["observation"] = obs
    out.append(attach(msg, step_rest))
    out.extend(answers)


def _messages(steps: list) -> tuple[list, list]:
    out, stamps = [], []
    for s in steps:
        if not isinstance(s, dict):
            out.append(s)
            continue
        if s.get("timestamp"):
            stamps.append(s["timestamp"])
        _step(s, out)
    return out, stamps


def to_native(rec: dict, source: Path | None) -> dict:
    agent = rec.get("agent") if isinstance(rec.get("agent"), dict) else {}
    fm = rec.get("final_metrics") if isinstance(rec.get("final_metrics"), dict) else {}
    extra = rec.get("extra") if isinstance(rec.get("extra"), dict) else {}
    steps = rec.get("steps") or []
    msgs, stamps = _messages(steps)
    totals = {v: fm.get(k) for k, v in _TOTALS.items()}
    if not fm:  # sum the per-step metrics when no totals are given (each step keeps its own)
        ms = [s.get("metrics") for s in steps if isinstance(s, dict) and isinstance(s.get("metrics"), dict)]
        totals = {"prompt_tokens": sum(m.get("prompt_tokens") or 0 for m in ms) if ms else None,
                  "completion_tokens": sum(m.get("completion_tokens") or 0 for m in ms) if ms else None,
                  "cost_usd": sum(m.get("cost_usd") or 0 for m in ms) if ms else None}
    name = "/".join(str(x) for x in (agent.get("name"), agent.get("version"), agent.get("model_name")) if x)
    sid = rec.get("session_id")
    task = extra.get("task_id") or extra.get("task_name") or sid
    out_extra = {"atif_version": rec.get("schema_version"), "notes": rec.get("notes")}
    attach(out_extra, rest(extra, ("tenant_id", "consent_id", "patch")))
    others = rest(rec, ("schema_version", "session_id", "agent", "steps", "final_metrics", "extra", "notes"))
    for key, d, mapped in (("agent", rec.get("agent"), ("name", "version", "model_name")),
                           ("final_metrics", rec.get("final_metrics"), tuple(_TOTALS))):
        if isinstance(d, dict):
            if rest(d, mapped):
                others[key] = rest(d, mapped)
        elif key in rec:
            others[key] = d
    if "extra" in rec and not isinstance(rec["extra"], dict):
        others["extra"] = rec["extra"]
    attach(out_extra, others)  # continued_trajectory_ref, agent.extra, final_metrics.total_steps, ...
    return {
        "trajectory_id": f"atif:{sid}" if sid else stable_id("atif", rec),
        "task_id": task, "issue_id": extra.get("issue_id") or task, "repo": extra.get("repo"),
        "tenant_id": extra.get("tenant_id"), "consent_id": extra.get("consent_id"),
        "agent_id": name or None, "messages": msgs,
        "started_at": stamps[0] if stamps else None, "ended_at": stamps[-1] if stamps else None,
        "deliverable": {"patch": extra.get("patch")},
        "usage": totals,
        "extra": out_extra,
    }
