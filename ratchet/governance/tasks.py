"""`tasks` rows from task bundles (the repair suite as the warehouse stores it)."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Iterable

from ratchet.clock import now_utc


def task_rows(bundles: Iterable[Any], suite_key: str, loaded_at: datetime | None = None) -> list[dict]:
    """`tasks` rows from TaskBundles (sandboxes.bundle); slice = the operator family."""
    at = loaded_at or now_utc()
    out = []
    for b in bundles:
        slices = dict(b.metadata.get("slices") or {})
        solution = b.files.get("solution.py")
        if solution is None:  # a non-HumanEval bundle: the first non-test Python file
            solution = next((v for k, v in sorted(b.files.items()) if k.endswith(".py") and "test" not in k), None)
        out.append({
            "task_id": b.task_id, "repo": b.repo, "issue_id": b.issue_id,
            "problem_id": b.metadata.get("problem_id"), "issue_title": b.issue_title, "issue_body": b.issue_body,
            "issue_text": f"{b.issue_title}\n\n{b.issue_body}".strip(), "solution": solution,
            "slice": slices.get("operator_family") or (b.metadata.get("root_cause") or {}).get("family"),
            "slices": slices, "environment_id": b.environment_id, "environment_digest": b.environment_digest,
            "fail_to_pass": list(b.fail_to_pass), "pass_to_pass": list(b.pass_to_pass),
            "bundle": json.dumps(b.to_dict(), sort_keys=True), "suite_key": suite_key, "loaded_at": at,
        })
    return out
