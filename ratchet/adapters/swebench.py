"""SWE-bench predictions (`instance_id`, `model_name_or_path`, `model_patch`) joined with their
evaluation reports: per-instance `report.json` (`{id: {"resolved": ..., "tests_status": ...}}`)
or a run summary (`{"resolved_ids": [...], ...}`). Reports are side inputs, not records."""
from __future__ import annotations

from pathlib import Path

from .common import repo_of

NAME = "swebench_prediction"


def matches(rec: dict) -> bool:
    return "instance_id" in rec and "model_patch" in rec


def report_entries(obj: object) -> dict[str, dict] | None:
    """`{instance_id: report}` if `obj` is a SWE-bench report or run summary, else None."""
    if not isinstance(obj, dict) or not obj:
        return None
    if isinstance(obj.get("resolved_ids"), list):
        out = {i: {"resolved": True} for i in obj["resolved_ids"] if isinstance(i, str)}
        for key in ("unresolved_ids", "error_ids", "empty_patch_ids"):
            for i in obj.get(key) or []:
                if isinstance(i, str):
                    out.setdefault(i, {"resolved": False, "status": key.removesuffix("_ids")})
        return out
    if all(isinstance(v, dict) and "resolved" in v for v in obj.values()):
        return dict(obj)
    return None


def to_native(rec: dict, source: Path | None, reports: dict) -> dict:
    inst = rec.get("instance_id")
    model = rec.get("model_name_or_path")
    rep = reports.get(inst) or {}
    status = rep.get("tests_status")
    resolved = rep.get("resolved") if isinstance(rep.get("resolved"), bool) else None
    return {
        "trajectory_id": f"swebench:{model}:{inst}", "task_id": inst, "issue_id": inst,
        "repo": repo_of(inst), "agent_id": model, "messages": [],
        "deliverable": {"patch": rec.get("model_patch") or None},
        "outcome": {"tests_passed": resolved},
        "extra": {"report": {"found": bool(rep), "tests_status": status,
                             "patch_applied": rep.get("patch_successfully_applied"),
                             **{k: v for k, v in rep.items()      # the report's other keys, as it has them
                                if k not in ("tests_status", "patch_successfully_applied")
                                and not (k == "resolved" and resolved is not None)}},
                  **{k: v for k, v in rec.items() if k not in ("instance_id", "model_name_or_path", "model_patch")}},
    }
