"""Turn external task formats into TaskBundles.

* `from_harbor(task_dir)`: a Harbor task directory (`instruction.md`, `task.toml`, `tests/`,
  optional `environment/`, optional `solution/`). The episode repository is the environment's
  build context (minus Dockerfile / compose files) plus `tests/`; `solution/` is never copied
  (it is the answer). Limits come from task.toml; test ids are the `test_*` functions in
  `tests/test_*.py`. The verifier command and Docker hints go to `metadata`.
* `from_swebench(instance, repo_path, *, limits=, forbidden_paths=, tool_allowlist=, ...)`: a
  SWE-bench-style instance (repo, base_commit, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS,
  problem_statement; list fields may be JSON strings) against a LOCAL clone. The bundle pins
  `base_commit`; `test_patch` becomes `bundle.test_patch`, applied only by the verification (as
  the SWE-bench harness does: the agent works without the new tests, which are where the
  FAIL_TO_PASS ids live); the gold patch stays in `metadata` (the reference fix for the blast
  radius; the policy never sees metadata).

Both raise `ImportError_` (a ValueError) with a reason for malformed input, so callers can
quarantine the record instead of dropping it.
"""
from __future__ import annotations

import ast
import json
import subprocess
import tomllib
from pathlib import Path

from sandboxes.bundle import Limits, TaskBundle

MAX_FILE_BYTES = 1 << 20
_ENV_SKIP = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}


class ImportError_(ValueError):
    """A task record that cannot become a bundle (the message says why)."""


def _size_to_mb(v) -> int | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return int(v)
    s = str(v).strip().upper().rstrip("B")
    mult = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(float(s))


def _read_tree(base: Path, prefix: str, skip=frozenset()) -> tuple[dict[str, str], list[str]]:
    files, skipped = {}, []
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base).as_posix()
        if p.is_symlink() or not p.is_file() or p.name in skip or "__pycache__" in rel:
            continue
        data = p.read_bytes()
        try:
            if len(data) > MAX_FILE_BYTES:
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "too large")
            files[f"{prefix}{rel}"] = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(f"{prefix}{rel}")
    return files, skipped


def _test_ids(files: dict[str, str]) -> list[str]:
    ids = []
    for path, src in sorted(files.items()):
        name = path.rsplit("/", 1)[-1]
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        try:
            tree = ast.parse(src)
        except SyntaxError as e:
            raise ImportError_(f"{path}: test file does not parse: {e}") from e
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                ids.append(f"{path}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids += [f"{path}::{node.name}::{f.name}" for f in node.body
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")]
    return ids


def from_harbor(task_dir: str | Path) -> TaskBundle:
    d = Path(task_dir)
    if not (d / "instruction.md").is_file():
        raise ImportError_(f"{d}: not a Harbor task (no instruction.md)")
    if not (d / "tests").is_dir():
        raise ImportError_(f"{d}: Harbor task without tests/")
    try:
        cfg = tomllib.loads((d / "task.toml").read_text()) if (d / "task.toml").exists() else {}
    except tomllib.TOMLDecodeError as e:
        raise ImportError_(f"{d}/task.toml: {e}") from e
    files, skipped = {}, []
    if (d / "environment").is_dir():
        f, s = _read_tree(d / "environment", "", _ENV_SKIP)
        files.update(f)
        skipped += s
    f, s = _read_tree(d / "tests", "tests/")
    files.update(f)
    skipped += s
    instruction = (d / "instruction.md").read_text()
    env, agent, verifier, meta = (cfg.get(k, {}) for k in ("environment", "agent", "verifier", "metadata"))
    base = Limits()
    wall = float(agent.get("timeout_sec", base.wall_s))
    limits = Limits(
        wall_s=wall,
        cpu_s=max(int(agent.get("timeout_sec", base.cpu_s)), int(wall + 0.999)),
        memory_mb=_size_to_mb(env.get("memory")) or _size_to_mb(env.get("memory_mb")) or base.memory_mb,
    )
    title = next((ln.lstrip("# ").strip() for ln in instruction.splitlines() if ln.strip()), d.name)
    tests = _test_ids({k: v for k, v in files.items() if k.startswith("tests/")})
    return TaskBundle(
        task_id=f"harbor/{d.name}", files=files, issue_title=title[:200], issue_body=instruction,
        fail_to_pass=tuple(tests), limits=limits, environment_id=f"env://harbor/{d.name}",
        repo=f"harbor/{d.name}", issue_id=d.name,
        metadata={"source": "harbor", "harbor": {"metadata": meta, "verifier": verifier,
                                                 "environment": env, "agent": agent},
                  "verifier_command": "bash tests/test.sh" if (d / "tests" / "test.sh").exists() else None,
                  "dockerfile": (d / "environment" / "Dockerfile").read_text()
                  if (d / "environment" / "Dockerfile").is_file() else None,
                  "skipped_files": skipped})


def _id_list(v, field: str) -> tuple[str, ...]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as e:
            raise ImportError_(f"{field} is not a JSON list: {e}") from e
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ImportError_(f"{field} must be a list of test ids")
    return tuple(v)


def from_swebench(instance: dict, repo_path: str | Path, *, limits: Limits | dict | None = None,
                  forbidden_paths=None, tool_allowlist=None, environment_id: str | None = None,
                  metadata: dict | None = None) -> TaskBundle:
    """A bundle from a SWE-bench instance; keyword arguments override the defaults (limits as a
    `Limits` or a dict of its fields, forbidden globs, the tool allowlist, the environment id)."""
    missing = [k for k in ("repo", "base_commit", "problem_statement", "FAIL_TO_PASS") if not instance.get(k)]
    if missing:
        raise ImportError_(f"SWE-bench instance missing {missing}")
    repo_path = Path(repo_path).resolve()
    r = subprocess.run(["git", "-C", str(repo_path), "rev-parse", "--verify", "--quiet",
                        f"{instance['base_commit']}^{{commit}}"], capture_output=True, text=True)
    if r.returncode != 0:
        raise ImportError_(f"base_commit {instance['base_commit']} not found in {repo_path}")
    f2p = _id_list(instance["FAIL_TO_PASS"], "FAIL_TO_PASS")
    p2p = _id_list(instance.get("PASS_TO_PASS", []), "PASS_TO_PASS")
    test_patch = instance.get("test_patch") or ""
    if test_patch:
        from sandboxes.verifiers.diffs import DiffError, touched_paths
        try:
            touched_paths(test_patch)
        except DiffError as e:
            raise ImportError_(f"test_patch is not a unified diff: {e}") from e
    if isinstance(limits, dict):
        try:
            limits = Limits(**limits)
        except (TypeError, ValueError) as e:
            raise ImportError_(f"bad limits: {e}") from e
    extra = {}
    if forbidden_paths is not None:
        extra["forbidden_paths"] = tuple(forbidden_paths)
    if tool_allowlist is not None:
        from sandboxes.tools import TOOL_NAMES
        unknown = sorted(set(tool_allowlist) - set(TOOL_NAMES))
        if unknown:
            raise ImportError_(f"unknown tools in tool_allowlist: {unknown}; known: {list(TOOL_NAMES)}")
        extra["tool_allowlist"] = tuple(tool_allowlist)
    statement = instance["problem_statement"]
    iid = instance.get("instance_id") or f"{instance['repo'].replace('/', '__')}-{instance['base_commit'][:8]}"
    return TaskBundle(
        task_id=iid, repo_path=str(repo_path), commit=r.stdout.strip(),
        issue_title=statement.strip().splitlines()[0][:200], issue_body=statement,
        fail_to_pass=f2p, pass_to_pass=p2p, test_patch=test_patch, limits=limits or Limits(),
        environment_id=environment_id or
        f"env://swebench/{instance['repo']}@{instance.get('version', 'unknown')}",
        repo=instance["repo"], issue_id=iid,
        metadata={"source": "swebench", "gold_patch": instance.get("patch", ""),
                  "hints_text": instance.get("hints_text", ""),
                  "image": instance.get("image_name") or instance.get("docker_image"),
                  **(metadata or {})}, **extra)
