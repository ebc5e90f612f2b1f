"""QuixBugs programs (fixtures/quixbugs, MIT, upstream commit 4257f44) as tasks we did not write.

`repo(tmp)` builds a git repository laid out as upstream (two commits: the base without
`python_testcases/test_gcd.py`, which `instance("gcd")` adds back through its `test_patch`, and
nothing else); `instance(name)` is the SWE-bench-style record for one program with
function-level FAIL_TO_PASS ids (`python_testcases/test_X.py::test_X`, parametrised upstream);
`harbor_dir(tmp, name)` is the same program as a Harbor task directory.
"""
from __future__ import annotations

import difflib
import os
import shutil
import subprocess
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "quixbugs"      # fixes.json: the one-line fixes
UPSTREAM = Path(__file__).parents[1] / "fixtures" / "quixbugs" / "repo"   # the shared upstream snapshot
PROGRAMS = ("bitcount", "find_in_sorted", "flatten", "gcd", "kth", "quicksort")
HIDDEN_TEST = "gcd"          # its test file arrives only through test_patch


def _git(path, *args) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "q", "GIT_AUTHOR_EMAIL": "q@x", "GIT_COMMITTER_NAME": "q",
           "GIT_COMMITTER_EMAIL": "q@x", "GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000"}
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def repo(tmp: Path) -> tuple[Path, str]:
    dest = Path(tmp) / "quixbugs"
    if (dest / ".git").is_dir():
        return dest, _git(dest, "rev-parse", "HEAD")
    # only PROGRAMS' files and the shared test helpers, named one by one (no bytecode a local run
    # left behind: on Docker, whose diff leaves caches out, it would read as deleted files)
    for rel in ("conftest.py", "python_testcases/load_testdata.py", *(f for n in PROGRAMS for f in (
            f"python_programs/{n}.py", f"python_testcases/test_{n}.py", f"json_testcases/{n}.json"))):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(UPSTREAM / rel, dest / rel)
    hidden = dest / "python_testcases" / f"test_{HIDDEN_TEST}.py"
    hidden.unlink()
    _git(dest, "init", "-q")
    _git(dest, "add", ".")
    _git(dest, "commit", "-qm", "base")
    return dest, _git(dest, "rev-parse", "HEAD")


def _diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"a/{path}" if old else "/dev/null", f"b/{path}"))


def fixed_source(name: str) -> str:
    """The program with upstream's one-line fix (fixes.json) applied."""
    import json
    fix = json.loads((FIXTURE / "fixes.json").read_text())[name]
    buggy = (UPSTREAM / "python_programs" / f"{name}.py").read_text()
    assert buggy.count(fix["old"]) == 1, name
    return buggy.replace(fix["old"], fix["new"])


def instance(name: str, base_commit: str) -> dict:
    prog = f"python_programs/{name}.py"
    buggy = (UPSTREAM / prog).read_text()
    test = f"python_testcases/test_{name}.py"
    test_patch = _diff(test, "", (UPSTREAM / test).read_text()) if name == HIDDEN_TEST else ""
    return {"instance_id": f"quixbugs__{name}", "repo": "jkoppel/QuixBugs", "base_commit": base_commit,
            "problem_statement": f"{name} returns wrong results (or never returns) for some inputs.\n\n"
                                 f"See {test}.",
            "FAIL_TO_PASS": [f"{test}::test_{name}"], "PASS_TO_PASS": [],
            "patch": _diff(prog, buggy, fixed_source(name)),
            "test_patch": test_patch, "version": "4257f44"}


def bundle(name: str, tmp: Path, **limits):
    from sandboxes.bundle import Limits
    from sandboxes.importers import from_swebench
    path, base = repo(tmp)
    lim = {"wall_s": 5.0, "cpu_s": 5, "verify_s": 10.0, **limits}
    return from_swebench(instance(name, base), path, limits=Limits(**lim),
                         metadata={"root_cause": {"file": f"python_programs/{name}.py", "function": name}})


def harbor_dir(tmp: Path, name: str) -> Path:
    d = Path(tmp) / f"harbor-{name}"
    (d / "environment" / "python_programs").mkdir(parents=True)
    (d / "environment" / "json_testcases").mkdir()
    (d / "tests").mkdir()
    (d / "instruction.md").write_text(f"# Fix {name}\n\n{name} returns wrong results for some inputs.\n")
    (d / "task.toml").write_text('[agent]\ntimeout_sec = 5\n[environment]\nmemory = "1G"\n')
    shutil.copy(UPSTREAM / "python_programs" / f"{name}.py", d / "environment" / "python_programs")
    shutil.copy(UPSTREAM / "json_testcases" / f"{name}.json", d / "environment" / "json_testcases")
    shutil.copy(UPSTREAM / "conftest.py", d / "environment")
    shutil.copy(UPSTREAM / "python_testcases" / f"test_{name}.py", d / "tests")
    shutil.copy(UPSTREAM / "python_testcases" / "load_testdata.py", d / "tests")
    return d
