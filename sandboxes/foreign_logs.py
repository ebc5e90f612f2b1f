"""A finished agent run written as other harnesses write theirs: a SWE-agent `.traj` (function
calling) and a Harbor ATIF trajectory. The demo's landing folder holds such files beside the
native logs, so ingest reads them through its adapters and training sees calls to `bash` and
`str_replace_editor` in the formats real agents log them in.

    swe_agent_traj(run, bundle)     # -> dict, write as <instance>.traj
    atif_traj(run, bundle)          # -> dict, write as <task id>.json

Only the run's own messages and measured numbers go in; what a format has and the run does not
(SWE-agent's model stats, ATIF's per-step metrics) is left out rather than made up.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

SWE_AGENT_VERSION = "1.1.0"
ATIF_VERSION = "ATIF-v1.4"


def _calls(messages: list[dict]):
    """(assistant message, its one call, the tool message answering it) in order."""
    answers = {m.get("tool_call_id"): m for m in messages if m.get("role") == "tool"}
    for m in messages:
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or ():
                yield m, c, answers.get(c.get("id"))


def action_text(name: str, arguments: str) -> str:
    """The command line SWE-agent shows for a call: bash's command itself, another tool's name and
    its argument values (e.g. `str_replace_editor view solution.py`)."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return f"{name} {arguments}"
    if name == "bash" and isinstance(args, dict):
        return str(args.get("command", ""))
    vals = " ".join(v if isinstance(v, str) else json.dumps(v) for v in (args or {}).values())
    return f"{name} {vals}".rstrip()


def swe_agent_traj(run, bundle) -> dict:
    """SWE-agent 1.x with function calling: `history` (the chat, `agent` / `message_type` keys,
    `tool_calls`, tool answers with `tool_call_ids`), `trajectory` (a step per call) and `info`."""
    history, steps = [], []
    for m in run.messages:
        if m["role"] in ("system", "user"):
            history.append({"role": m["role"], "content": m["content"], "agent": "main",
                            "message_type": "system_prompt" if m["role"] == "system" else "observation"})
    for m, c, ans in _calls(run.messages):
        fn = c["function"]
        action = action_text(fn["name"], fn["arguments"])
        history.append({"role": "assistant", "content": m.get("content") or "", "thought": m.get("content") or "",
                        "action": action, "agent": "main", "message_type": "action", "tool_calls": [c]})
        obs = (ans or {}).get("content") or ""
        history.append({"role": "tool", "content": obs, "tool_call_ids": [c["id"]], "agent": "main",
                        "message_type": "observation"})
        steps.append({"thought": m.get("content") or "", "action": action, "observation": obs, "response": "",
                      "state": "{}"})
    return {"environment": "swe_main", "instance_id": bundle.task_id, "trajectory": steps, "history": history,
            "info": {"swe_agent_version": SWE_AGENT_VERSION, "exit_status": "submitted" if run.reward else "early_exit",
                     "submission": run.patch, "instance_id": bundle.task_id}}


def atif_traj(run, bundle, *, started: datetime | None = None) -> dict:
    """Harbor's ATIF: system and user steps, one agent step per call with its observation; the
    task, repo and patch in `extra`. Step times are spread over the run's measured latency."""
    t0 = started or datetime(2026, 11, 1, tzinfo=timezone.utc)
    calls = list(_calls(run.messages))
    dt = (run.latency_s or 0.0) / max(1, len(calls))
    stamp = lambda i: (t0 + timedelta(seconds=i * dt)).isoformat().replace("+00:00", "Z")   # noqa: E731
    steps = []
    for m in run.messages:
        if m["role"] in ("system", "user"):
            steps.append({"step_id": len(steps) + 1, "timestamp": stamp(0), "source": m["role"],
                          "message": m["content"]})
    for i, (m, c, ans) in enumerate(calls, 1):
        fn = c["function"]
        steps.append({"step_id": len(steps) + 1, "timestamp": stamp(i), "source": "agent",
                      "message": m.get("content") or "",
                      "tool_calls": [{"tool_call_id": c["id"], "function_name": fn["name"],
                                      "arguments": json.loads(fn["arguments"] or "{}")}],
                      "observation": {"results": [{"source_call_id": c["id"],
                                                   "content": (ans or {}).get("content") or ""}]}})
    return {"schema_version": ATIF_VERSION, "session_id": f"{run.agent_id}:{bundle.task_id}",
            "agent": {"name": run.agent_id.split("@")[0], "version": run.agent_id.split("@")[-1]},
            "steps": steps, "extra": {"task_id": bundle.task_id, "repo": bundle.repo, "patch": run.patch}}
