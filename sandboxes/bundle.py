"""Task bundle: everything that defines one repair task and the environment it runs in.

A bundle is plain data (JSON-serialisable). Its `environment_digest` is a sha256 over every
field that changes what an episode can observe or how it is scored, so results are only compared
under the same digest.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUNDLE_VERSION = "ratchet.task/v1"
# Paths the agent must not touch (a hard gate): tests, their data and configuration, CI.
# fnmatch semantics: `*` also matches `/`, so "*_test.py" covers every folder.
DEFAULT_FORBIDDEN = (
    "tests/**", "test/**", "*/tests/**", "*/test/**", "testing/**", "*/testing/**",
    "test_*.py", "*/test_*.py", "*_test.py", "*conftest.py",
    "*testdata/**", "*test_data/**", "*testcases/**", "*fixtures/**",
    "pytest.ini", "*/pytest.ini", ".pytest.ini", "tox.ini", "noxfile.py",
    ".github/**", ".ci/**", ".gitlab-ci.yml", ".circleci/**",
)
# Files that decide how tests run. Whatever the agent did to them, verification uses the task's
# own copies (`sandboxes.verify`): not a gate (a fix may legitimately edit pyproject.toml), but
# never in effect when the tests run.
TEST_CONFIG = (
    "pytest.ini", "*/pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
    "*conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth", "pytest_*.py",
    "*/pytest_*.py", "noxfile.py",
)
_PYTEST_OWNED = re.compile(r"conftest\.py|\.?pytest\.[\w.-]+|pytest_\w+\.py")
_SHARED_CONFIG = ("tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py", "sitecustomize.py",
                  "usercustomize.py")


def pytest_owned(path: str) -> bool:
    """A file pytest owns by its name, in any folder: `pytest.<anything>` and `.pytest.<anything>`
    (pytest.ini, pytest.toml and whatever format pytest reads next), `conftest.py`, `pytest_*.py`
    plugins. A rule, not a list: a hard gate for every task (`sandboxes.verifiers.hygiene`), on
    top of `bundle.forbidden_paths`, and never in effect in a test run (`sandboxes.verify`)."""
    return _PYTEST_OWNED.fullmatch(path.rsplit("/", 1)[-1]) is not None


def is_test_config(path: str) -> bool:
    """Every file that can change how pytest runs, by rule: pytest's own (`pytest_owned`, in any
    folder), the shared configuration files at the repository root (tox.ini, setup.cfg,
    pyproject.toml, noxfile.py, sitecustomize, usercustomize), what Python loads before any test
    (*.pth) and plugins declared by entry point (anything under a *.dist-info or *.egg-info
    folder, *.egg-link). Whatever the agent did to them, a test run uses the task's own copies
    (`sandboxes.verify`). pytest itself reads configuration only from the harness's `-c` file, a
    copy of the task's own (`sandboxes.pytest_config`), so a shared file deeper in the tree is
    never read as configuration and stays the agent's (a fix may edit a package's setup.cfg)."""
    parts = path.split("/")
    name = parts[-1]
    return (pytest_owned(path) or (len(parts) == 1 and name in _SHARED_CONFIG)
            or name.endswith((".pth", ".egg-link"))
            or any(d.endswith((".dist-info", ".egg-info")) for d in parts[:-1]))


# Every tool (`sandboxes.tools.TOOL_SCHEMAS` is the one list of names), in schema order.
from sandboxes.tools import TOOL_NAMES as DEFAULT_TOOLS  # noqa: E402  (tools imports no bundle)


@dataclass(frozen=True)
class Limits:
    """Per-episode resource limits (enforced by the runtime, not by the policy).

    `wall_s` bounds one command or one test run (the whole process group is killed: a timeout,
    the agent's failure). `cpu_s` is RLIMIT_CPU, per process: a backstop that must not be below
    `wall_s`, or a busy loop in the agent's code would die of SIGXCPU before it times out (both
    are the agent's failure, but a timeout says what happened); the runtime applies
    max(cpu_s, wall_s, verify_s), so the final test run is bounded by `verify_s`, not the CPU. `disk_mb` caps everything
    the worktree holds; `max_patch_kb` the submitted diff; `verify_s` the final test run.
    """
    wall_s: float = 30.0          # whole-process-group kill after this
    cpu_s: int = 40               # RLIMIT_CPU (per process), >= wall_s
    memory_mb: int = 1024         # RLIMIT_AS
    max_procs: int = 64           # RLIMIT_NPROC
    max_file_mb: int = 16         # RLIMIT_FSIZE (one file)
    max_output_chars: int = 8000  # tool observations are truncated past this
    max_turns: int = 30
    disk_mb: int = 256            # everything in the worktree together (tmpfs quota when root)
    max_patch_kb: int = 512       # a larger diff fails the episode before any verifier runs
    verify_s: float = 120.0       # the final pristine test run
    # CPU seconds per test inside a test run (None: only wall_s / verify_s bound it). A test
    # past it fails with TestTimeout and ends the run (later tests: error), so a patch that makes
    # the code loop costs test_cpu_s instead of the run's whole wall_s, and still fails. CPU, not
    # wall: a busy machine must not fail a correct test. Added after v1 of the bundle format:
    # left out of to_dict (and so of the digest) while None, so bundles written before it keep
    # their environment digest.
    test_cpu_s: float | None = None

    def __post_init__(self):
        bad = [f"{k}={getattr(self, k)}" for k in ("wall_s", "cpu_s", "memory_mb", "max_procs",
               "max_file_mb", "max_output_chars", "max_turns", "disk_mb", "max_patch_kb",
               "verify_s") if not getattr(self, k) or getattr(self, k) <= 0]
        if self.test_cpu_s is not None and not self.test_cpu_s > 0:
            bad.append(f"test_cpu_s={self.test_cpu_s}")
        if bad:
            raise ValueError(f"limits must be positive: {', '.join(bad)}")
        if self.cpu_s < self.wall_s:
            raise ValueError(f"cpu_s ({self.cpu_s}) is below wall_s ({self.wall_s}): a loop in the "
                             "agent's code would be killed by the CPU limit instead of timing out; "
                             "set cpu_s >= wall_s")


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
    # A unified diff applied only for verification (SWE-bench's test_patch): the agent never
    # sees it, the paths it touches are protected, and the required tests may live in it.
    test_patch: str = ""
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
        if d["limits"].get("test_cpu_s") is None:      # optional fields: absent unless set
            d["limits"].pop("test_cpu_s", None)
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
