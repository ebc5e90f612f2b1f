"""Harbor task directories and SWE-bench instances -> TaskBundles that really run."""
import json
import os
import subprocess

import pytest

from sandboxes.importers import ImportError_, from_harbor, from_swebench
from sandboxes.runtime import LocalRuntime


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    return LocalRuntime(tmp_path_factory.mktemp("imprt"))


def harbor_task(d):
    (d / "environment" / "app").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text("# Fix the median\n\n`app/stats.py::median` is wrong for even lengths.\n")
    (d / "task.toml").write_text('version = "1.0"\n[metadata]\ndifficulty = "easy"\ncategory = "bugfix"\n'
                                 '[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 45.0\n'
                                 '[environment]\nmemory = "2G"\ncpus = 1\n')
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\nCOPY app /app\n")
    (d / "environment" / "app" / "stats.py").write_text(
        "def median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\npython -m pytest tests/test_outputs.py\n")
    (d / "tests" / "test_outputs.py").write_text(
        "import sys\nsys.path.insert(0, 'app')\nfrom stats import median\n\n"
        "def test_odd():\n    assert median([3, 1, 2]) == 2\n\n"
        "def test_even():\n    assert median([4, 1, 3, 2]) == 2.5\n")
    (d / "solution" / "solve.sh").write_text("echo 'SECRET ANSWER'\n")
    return d


def test_harbor_import(tmp_path, rt):
    b = from_harbor(harbor_task(tmp_path / "median-even"))
    assert set(b.files) == {"app/stats.py", "tests/test.sh", "tests/test_outputs.py"}
    assert not any("solve" in p or "Dockerfile" in p for p in b.files)
    assert b.task_id == "harbor/median-even" and b.issue_title == "Fix the median"
    assert b.fail_to_pass == ("tests/test_outputs.py::test_odd", "tests/test_outputs.py::test_even")
    assert b.limits.wall_s == 45.0 and b.limits.memory_mb == 2048
    assert b.metadata["verifier_command"] == "bash tests/test.sh" and "FROM python" in b.metadata["dockerfile"]
    with rt.episode(b) as ep:
        rep = ep.run_tests(list(b.fail_to_pass))
        assert rep.outcomes == {"tests/test_outputs.py::test_odd": "passed", "tests/test_outputs.py::test_even": "failed"}


def test_harbor_rejects_malformed(tmp_path):
    with pytest.raises(ImportError_, match="instruction.md"):
        from_harbor(tmp_path)
    d = harbor_task(tmp_path / "t")
    (d / "task.toml").write_text("[broken")
    with pytest.raises(ImportError_, match="task.toml"):
        from_harbor(d)


def _git(path, *a, input=None):
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    return subprocess.run(["git", "-C", str(path), *a], check=True, capture_output=True, text=True,
                          env=env, input=input).stdout


def swe_repo(src):
    src.mkdir()
    _git(src, "init", "-q")
    (src / "pkg").mkdir()
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "text.py").write_text("def title(s):\n    return s.upper()\n")
    (src / "tests").mkdir()
    (src / "tests" / "test_text.py").write_text("from pkg.text import title\n\ndef test_empty():\n    assert title('') == ''\n")
    _git(src, "add", ".")
    _git(src, "commit", "-qm", "base")
    base = _git(src, "rev-parse", "HEAD").strip()
    (src / "pkg" / "text.py").write_text("def title(s):\n    return s.title()\n")
    patch = _git(src, "diff")
    _git(src, "checkout", "-q", "--", ".")
    (src / "tests" / "test_text.py").write_text(
        "from pkg.text import title\n\ndef test_empty():\n    assert title('') == ''\n\n"
        "def test_words():\n    assert title('ab cd') == 'Ab Cd'\n")
    test_patch = _git(src, "diff")
    _git(src, "checkout", "-q", "--", ".")
    return base, patch, test_patch


def test_swebench_import_and_protocol(tmp_path, rt):
    base, patch, test_patch = swe_repo(tmp_path / "src")
    inst = {"repo": "acme/text", "instance_id": "acme__text-1", "base_commit": base, "patch": patch,
            "test_patch": test_patch, "problem_statement": "title() upper-cases everything\nIt should title-case.",
            "FAIL_TO_PASS": json.dumps(["tests/test_text.py::test_words"]),
            "PASS_TO_PASS": ["tests/test_text.py::test_empty"], "version": "0.1"}
    b = from_swebench(inst, tmp_path / "src")
    assert b.commit == base and b.fail_to_pass == ("tests/test_text.py::test_words",)
    assert b.issue_title == "title() upper-cases everything" and b.metadata["gold_patch"] == patch
    assert b.environment_id == "env://swebench/acme/text@0.1"
    ids = list(b.fail_to_pass + b.pass_to_pass)
    with rt.episode(b) as ep:
        assert ep.apply_patch(test_patch).ok
        assert ep.run_tests(ids).outcomes == {"tests/test_text.py::test_words": "failed",
                                             "tests/test_text.py::test_empty": "passed"}
        assert ep.apply_patch(b.metadata["gold_patch"]).ok
        assert ep.run_tests(ids).all_passed(ids)
        assert ep.changed_paths() == ["pkg/text.py", "tests/test_text.py"]


def test_swebench_rejects_bad_instances(tmp_path):
    base, _, _ = swe_repo(tmp_path / "src")
    good = {"repo": "a/b", "base_commit": base, "problem_statement": "x", "FAIL_TO_PASS": ["t::a"]}
    with pytest.raises(ImportError_, match="missing"):
        from_swebench({k: v for k, v in good.items() if k != "base_commit"}, tmp_path / "src")
    with pytest.raises(ImportError_, match="not found"):
        from_swebench(dict(good, base_commit="deadbeef" * 5), tmp_path / "src")
    with pytest.raises(ImportError_, match="JSON"):
        from_swebench(dict(good, FAIL_TO_PASS="[not json"), tmp_path / "src")
