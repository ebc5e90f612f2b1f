"""Task bundle: everything that defines one repair task and the environment it runs in.

A bundle is plain data (JSON-serialisable). Its `environment_digest` is a sha256 over every
field that changes what an episode can observe or how it is scored, so results are only compared
under the same digest.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUNDLE_VERSION = "ratchet.task/v1"
DEFAULT_FORBIDDEN = ("tests/**", "test_*.py", "**/test_*.py", "conftest.py", ".github/**", ".ci/**")
DEFAULT_TOOLS = (
    "view_issue", "list_files", "read_file", "search", "edit", "run_tests",
    "localize", "propose_edits", "apply_edit", "submit",
)


@dataclass(frozen=True)
class Limits:
    """Per-episode resource limits (enforced by the runtime, not by the policy)."""
    wall_s: float = 30.0          # whole-process-group kill after this
    cpu_s: int = 20               # RLIMIT_CPU
    memory_mb: int = 1024         # RLIMIT_AS
    max_procs: int = 64           # RLIMIT_NPROC
    max_file_mb: int = 16         # RLIMIT_FSIZE
    max_output_chars: int = 8000  # tool observations are truncated past this
    max_turns: int = 30


@dataclass(frozen=True)
class TaskBundle:
    task_id: str
    # Repository snapshot: either inline `files` (path -> text) or `repo_path` + `commit`.
    files: dict[str, str] = field(default_factory=dict)
    repo_path: str | None = None
    commit: str | None = None
    issue_title: str = ""
    issue_body: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    forbidden_paths: tuple[str, ...] = DEFAULT_FORBIDDEN
    tool_allowlist: tuple[str, ...] = DEFAULT_TOOLS
    limits: Limits = Limits()
    environment_id: str = "env://ratchet-local-sandbox@v1"
    repo: str = ""                 # logical repository name (for splits / slices)
    issue_id: str = ""
    metadata: dict = field(default_factory=dict)  # e.g. ground truth root cause, slice keys

    @property
    def environment_digest(self) -> str:
        """sha256 over everything that defines the environment (not free-form metadata)."""
        d = self.to_dict()
        d.pop("metadata", None)
        blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["version"] = BUNDLE_VERSION
        for k in ("fail_to_pass", "pass_to_pass", "forbidden_paths", "tool_allowlist"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TaskBundle":
        d = dict(d)
        version = d.pop("version", BUNDLE_VERSION)
        if version != BUNDLE_VERSION:
            raise ValueError(f"unsupported task bundle version {version!r} (expected {BUNDLE_VERSION})")
        d["limits"] = Limits(**d.get("limits", {}))
        for k in ("fail_to_pass", "pass_to_pass", "forbidden_paths", "tool_allowlist"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
        return p

    @classmethod
    def load(cls, path: str | Path) -> "TaskBundle":
        return cls.from_dict(json.loads(Path(path).read_text()))
