"""Trajectory contract v1: the Arrow schema of the `trajectories` table, the typed model that
writes native records, and `normalise()`, which validates a native record into a table row.

A native record is one JSON object (one JSONL line):

    {"schema_version": "ratchet.trajectory/v1", "trajectory_id": "...", "tenant_id": "...",
     "consent_id": "...", "task_id": "...", "repo": "...", "issue_id": "...", "agent_id": "...",
     "started_at": "2026-11-01T10:00:00Z", "ended_at": "...",
     "messages": [OpenAI chat messages, assistant `tool_calls`, `tool` results; optional
                  per-message `token_ids`],
     "tools": [OpenAI function schemas],
     "approvals": [{"step": 3, "approver": "...", "decision": "approved", "at": "..."}],
     "deliverable": {"patch": "diff --git ..."},
     "outcome": {"tests_passed": true, "accepted": true, "human_edited": false},
     "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "cost_usd": 0.02, "latency_s": 41.5},
     "environment": {"id": "env://...", "digest": "sha256:..."},
     "extra": {...anything else...}}

Every key no column takes is kept in `extra`, at every level (`contract.validate.normalise`).

The package, one module per concern (every name below stays importable from `ratchet.contract`):
`schema` (the Arrow table shape, `RecordError`), `model` (the typed `Trajectory`), `validate`
(`normalise`), `canonical` (the stored message form and the content hash), `timestamps`
(`utc_from_iso`, `parse_ts`), `ddl` (Arrow -> DuckDB types).
"""
from ratchet.contract.canonical import (
    MESSAGE_KEYS,
    _tools_json,
    content_hash,
    messages_json,
    values_hash,
)
from ratchet.contract.ddl import duck_column_type, duck_ddl, duck_structure, duck_type
from ratchet.contract.model import Approval, Message, ToolCall, Trajectory
from ratchet.contract.schema import (
    APPROVAL,
    CONTENT_FIELDS,
    CONTENT_NAMES,
    INGEST_FIELDS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    JSON,
    MESSAGE,
    ROLES,
    SCHEMA_VERSION,
    TOOL_CALL,
    TRAJECTORY_SCHEMA,
    TS,
    RecordError,
)
from ratchet.contract.timestamps import parse_ts, utc_from_iso
from ratchet.contract.validate import (
    DERIVED_KEY,
    derived_task_id,
    normalise,
    prompt_text,
)

__all__ = [
    "APPROVAL", "CONTENT_FIELDS", "CONTENT_NAMES", "DERIVED_KEY", "INGEST_FIELDS", "INT32_MAX", "INT32_MIN",
    "INT64_MAX", "JSON", "MESSAGE", "MESSAGE_KEYS", "ROLES", "SCHEMA_VERSION", "TOOL_CALL", "TRAJECTORY_SCHEMA",
    "TS", "Approval", "Message", "RecordError", "ToolCall", "Trajectory", "_tools_json", "content_hash",
    "derived_task_id", "duck_column_type", "duck_ddl", "duck_structure", "duck_type", "messages_json",
    "normalise", "parse_ts", "prompt_text", "utc_from_iso", "values_hash",
]
