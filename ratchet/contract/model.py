"""The typed model that writes native records: `Trajectory(...).to_record()` gives the JSON
object ingest reads (see `ratchet.contract` for its shape)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from ratchet.contract.schema import SCHEMA_VERSION


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict | str = field(default_factory=dict)

    def to_openai(self) -> dict:
        args = self.arguments if isinstance(self.arguments, str) else orjson.dumps(self.arguments).decode()
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(slots=True)
class Message:
    role: str
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    token_ids: list[int] | None = None

    def to_openai(self) -> dict:
        m: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            m["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        for k in ("tool_call_id", "name", "token_ids"):
            v = getattr(self, k)
            if v is not None:
                m[k] = v
        return m


@dataclass(slots=True)
class Approval:
    step: int
    approver: str
    decision: str
    at: str
    note: str | None = None


@dataclass(slots=True)
class Trajectory:
    """The typed model. `to_record()` gives the native JSON object ingest reads."""
    trajectory_id: str
    task_id: str
    messages: list[Message]
    tenant_id: str | None = None
    consent_id: str | None = None
    repo: str | None = None
    issue_id: str | None = None
    agent_id: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    tools: list[dict] = field(default_factory=list)
    approvals: list[Approval] = field(default_factory=list)
    patch: str | None = None
    tests_passed: bool | None = None
    accepted: bool | None = None
    human_edited: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    environment_id: str | None = None
    environment_digest: str | None = None
    extra: dict = field(default_factory=dict)

    def to_record(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "trajectory_id": self.trajectory_id, "tenant_id": self.tenant_id,
            "consent_id": self.consent_id, "task_id": self.task_id, "repo": self.repo,
            "issue_id": self.issue_id, "agent_id": self.agent_id,
            "started_at": self.started_at, "ended_at": self.ended_at,
            "messages": [m.to_openai() for m in self.messages],
            "tools": self.tools,
            "approvals": [asdict(a) for a in self.approvals],
            "deliverable": {"patch": self.patch},
            "outcome": {"tests_passed": self.tests_passed, "accepted": self.accepted,
                        "human_edited": self.human_edited},
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                      "cost_usd": self.cost_usd, "latency_s": self.latency_s},
            "environment": {"id": self.environment_id, "digest": self.environment_digest},
            "extra": self.extra,
        }
