"""A team's own tasks in the graph: Harbor task folders and a SWE-bench-style JSONL, both built
here from one small local git repository, beside a HumanEval subset, through `tasks`, the
governed splits, the locked holdout and one harness evaluation on it (dagster.materialize,
ephemeral instance, the real sandbox). Tasks that cannot be built land in task_rejections."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ratchet import store

pytestmark = pytest.mark.governance

LIMIT, PER = 2, 2                       # HumanEval problems, mutants per problem
BUGGY = "def title(s):\n    return s.upper()\n"
FIXED = "def title(s):\n    return s.title()\n"
TESTS = ("from pkg.text import title\n\ndef test_empty():\n    assert title('') == ''\n\n"
         "def test_words():\n    assert title('ab cd') == 'Ab Cd'\n")


def _git(path, *a):
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b", "GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000"}
    return subprocess.run(["git", "-C", str(path), *a], check=True, capture_output=True, text=True, env=env).stdout


def make_repo(src: Path) -> tuple[str, str, str]:
    """acme/text: `title` upper-cases; (base commit, the fix as a diff, the new test as a diff)."""
    (src / "pkg").mkdir(parents=True)
    _git(src, "init", "-q")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "text.py").write_text(BUGGY)
    (src / "tests").mkdir()
    (src / "tests" / "test_text.py").write_text("from pkg.text import title\n\ndef test_empty():\n"
                                                "    assert title('') == ''\n")
    _git(src, "add", ".")
    _git(src, "commit", "-qm", "base")
    base = _git(src, "rev-parse", "HEAD").strip()
    (src / "pkg" / "text.py").write_text(FIXED)
    patch = _git(src, "diff")
    _git(src, "checkout", "-q", "--", ".")
    (src / "tests" / "test_text.py").write_text(TESTS)
    test_patch = _git(src, "diff")
    _git(src, "checkout", "-q", "--", ".")
    return base, patch, test_patch


def harbor_task(root: Path, name: str, repo: Path, *, code: str | None = None, solve: str | None = FIXED,
                meta: str = "") -> Path:
    """A Harbor task folder whose environment is the repository's package at its base commit (no
    Dockerfile: it runs in bubblewrap; tests/sandboxes/test_docker_task_image.py has the image)."""
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    shutil.copytree(repo / "pkg", d / "environment" / "pkg")
    if code is not None:
        (d / "environment" / "pkg" / "text.py").write_text(code)
    (d / "tests" / "test_text.py").write_text(TESTS)
    (d / "instruction.md").write_text("# title() upper-cases everything\n\nIt should title-case each word.\n")
    (d / "task.toml").write_text(f'version = "1.0"\n[metadata]\n{meta}[agent]\ntimeout_sec = 20.0\n')
    if solve is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(f"cat > pkg/text.py <<'PY'\n{solve}PY\n")
    return d


@pytest.fixture(scope="module")
def user_tasks(tmp_path_factory):
    """(harbor folder, instances JSONL, repos folder): one good task of each kind and one of every
    rejection reason a user meets."""
    root = tmp_path_factory.mktemp("own")
    repos = root / "repos"
    base, patch, test_patch = make_repo(repos / "acme__text")
    harbor = root / "harbor"
    src = repos / "acme__text"
    harbor_task(harbor, "title-case", src, meta='difficulty = "easy"\ncategory = "strings"\n')
    harbor_task(harbor, "already-solved", src, code=FIXED)
    harbor_task(harbor, "no-solution", src, solve=None)
    harbor_task(harbor, "wrong-fix", src, solve="def title(s):\n    return s.lower()\n")
    (harbor / "notes").mkdir()                                          # not a task folder
    good = {"repo": "acme/text", "instance_id": "acme__text-1", "base_commit": base, "patch": patch,
            "test_patch": test_patch, "problem_statement": "title() upper-cases everything\nIt should title-case.",
            "FAIL_TO_PASS": ["tests/test_text.py::test_words"], "PASS_TO_PASS": ["tests/test_text.py::test_empty"],
            "version": "0.1", "difficulty": "<15 min fix"}
    lines = [json.dumps(x) for x in (
        good,
        dict(good, instance_id="acme__text-2", FAIL_TO_PASS=["tests/test_text.py::test_empty"], PASS_TO_PASS=[]),
        dict(good, instance_id="elsewhere-1", repo="globex/elsewhere"),
        dict(good, instance_id="acme__text-3", base_commit="0" * 40),
        dict(good, instance_id="acme__text-4", patch=patch.replace("-    return s.upper()", "-    return s.lower()")),
    )] + ["{not json"]
    jsonl = root / "instances.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    return harbor, jsonl, repos


EXPECTED_REJECTIONS = {
    ("harbor", "harbor/already-solved", "tests_pass_before_fix"),
    ("harbor", "harbor/no-solution", "no_reference_fix"),
    ("harbor", "harbor/wrong-fix", "tests_fail_after_fix"),
    ("harbor", "notes", "malformed"),
    ("swebench", "acme__text-2", "tests_pass_before_fix"),
    ("swebench", "elsewhere-1", "missing_repo"),
    ("swebench", "acme__text-3", "missing_commit"),
    ("swebench", "acme__text-4", "reference_fix_failed"),
    ("swebench", "instances.jsonl:6", "unreadable"),
}


def _sources(user_tasks):
    harbor, jsonl, repos = user_tasks
    return [{"kind": "humaneval"}, {"kind": "harbor", "path": str(harbor)},
            {"kind": "swebench", "path": str(jsonl), "repos": str(repos)}]


def _materialize(root, cache, assets, *, sources=None, ops=None, instance=None, partition=None):
    from dagster import DagsterInstance, MultiPartitionKey, materialize

    from resources import MlflowTracking, WarehouseResource

    cfg = {"cache_dir": str(cache), "limit": LIMIT, "per_problem": PER, **({"sources": sources} if sources else {})}
    key = MultiPartitionKey({"policy": partition[0], "seed": partition[1]}) if partition else None
    names = {a.node_def.name for a in assets if hasattr(a, "node_def")}
    run_ops = {"task_suite": {"config": cfg}, **(ops or {})}
    return materialize(assets, partition_key=key, instance=instance or DagsterInstance.ephemeral(),
                       resources={"warehouse": WarehouseResource(home=str(root)),
                                  "tracking": MlflowTracking(home=str(root))},
                       run_config={"ops": {k: v for k, v in run_ops.items() if k in names}}, raise_on_error=False)


def _q(root, sql):
    from ratchet.warehouse import Warehouse

    w = Warehouse(Path(root) / "warehouse.duckdb")
    w.ensure_schema()
    with w.connect() as con:
        return store.fetch(con, sql)


def _short(task: str) -> str:
    return task.rsplit("/", 1)[-1] if task.startswith("/") else task


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("humaneval-suite")


def test_own_tasks_beside_humaneval_through_splits_holdout_and_one_evaluation(home, cache, user_tasks):
    from dagster import DagsterInstance

    from assets.evaluation import holdout_eval, register_policies
    from assets.splits import contamination, dedup_clusters, holdout_manifest, split_assignments
    from assets.tasks import task_suite

    res = _materialize(home.root, cache, [task_suite, dedup_clusters, split_assignments, contamination,
                                          holdout_manifest], sources=_sources(user_tasks),
                       ops={"split_assignments": {"config": {"train": 2, "val": 1, "holdout": 3}}})
    assert res.success, [e.event_specific_data.error.to_string() for e in res.all_events
                         if e.event_type_value == "STEP_FAILURE"]
    meta = res.asset_materializations_for_node("task_suite")[0].metadata
    sources = meta["sources"].value
    assert {k: (v["accepted"], v["rejected"]) for k, v in sources.items() if k != "humaneval"} == \
        {"harbor": (1, 4), "swebench": (1, 5)}
    assert sources["humaneval"]["accepted"] == LIMIT * PER and meta["tasks_rejected"].value == 9

    tasks = {r["task_id"]: r for r in _q(home.root, "SELECT * FROM tasks")}
    assert len(tasks) == LIMIT * PER + 2
    harbor, swe = tasks["harbor/title-case"], tasks["acme__text-1"]
    # each task keeps its source, environment id and digest; slices come from the source's metadata
    assert harbor["environment_id"] == "env://harbor/title-case" and swe["environment_id"] == "env://swebench/acme/text@0.1"
    assert harbor["slice"] == "strings" and swe["slice"] == "<15 min fix"
    assert json.loads(harbor["slices"]) == {"source": "harbor", "repo": "harbor/title-case", "difficulty": "easy",
                                            "category": "strings"}
    from sandboxes.bundle import TaskBundle

    for r in (harbor, swe):
        b = TaskBundle.from_dict(json.loads(r["bundle"]))
        assert r["environment_digest"] == b.environment_digest and b.metadata["source"] in ("harbor", "swebench")

    rej = _q(home.root, "SELECT * FROM task_rejections ORDER BY source, task")
    assert {(r["source"], _short(r["task"]), r["reason"]) for r in rej} == EXPECTED_REJECTIONS
    assert all(r["detail"] and r["dagster_run_id"] == res.run_id and r["rejected_at"] for r in rej)
    why = {_short(r["task"]): r["detail"] for r in rej}
    assert "test_empty" in why["acme__text-2"] and "globex/elsewhere" in why["elsewhere-1"]
    assert "tests/test_text.py::test_words (failed)" in why["harbor/wrong-fix"]

    # governance treats them as the suite: every task is clustered, split, and the holdout is locked
    splits = {r["source_id"]: r["split"] for r in _q(home.root, "SELECT * FROM split_assignments WHERE kind = 'task'")}
    assert set(splits) == set(tasks)
    checks = {e.check_name: e.passed for e in res.get_asset_check_evaluations()}
    assert checks == {"contamination": True}
    held = {r["task_id"] for r in _q(home.root, "SELECT task_id FROM v_holdout")}
    assert held == {t for t, s in splits.items() if s == "holdout"}
    users_held = held & {"harbor/title-case", "acme__text-1"}
    assert users_held, f"the split seed puts no user task in the holdout: {splits}"

    instance = DagsterInstance.ephemeral()
    register_policies(instance, ("harness:sbfl",))
    ev = _materialize(home.root, cache, [holdout_eval], instance=instance, partition=("harness:sbfl", "0"),
                      ops={"holdout_eval": {"config": {"workers": 1}}})
    assert ev.success
    eps = {r["task_id"]: r for r in _q(home.root, "SELECT * FROM eval_episodes")}
    assert set(eps) == held
    for t in users_held:              # the user's task ran in the sandbox, in its own environment
        print({k: eps[t][k] for k in ("task_id", "outcome", "environment_id", "slice", "difficulty", "category")})
        assert eps[t]["outcome"] != "infra_failure", eps[t]
        assert eps[t]["environment_id"] == tasks[t]["environment_id"]


def test_a_second_run_reuses_the_checks_and_gives_the_same_tasks(home, cache, user_tasks):
    from assets.tasks import task_suite

    first = _materialize(home.root, cache, [task_suite], sources=_sources(user_tasks))
    before = _q(home.root, "SELECT task_id, environment_digest, bundle FROM tasks ORDER BY task_id")
    again = _materialize(home.root, cache, [task_suite], sources=_sources(user_tasks))
    assert first.success and again.success
    sources = again.asset_materializations_for_node("task_suite")[0].metadata["sources"].value
    # checked: 4 harbor folders with tests (notes is no task), 3 instances that reached the sandbox
    assert sources["harbor"]["checks_reused"] == 4 and sources["swebench"]["checks_reused"] == 3
    assert _q(home.root, "SELECT task_id, environment_digest, bundle FROM tasks ORDER BY task_id") == before


def test_the_default_is_the_humaneval_suite_as_before(home, cache):
    """No sources (and `[{kind: humaneval}]`): the rows the suite always gave, nothing rejected."""
    from assets.tasks import task_suite
    from ratchet.governance.tasks import task_rows
    from sandboxes.humaneval import build_suite
    from sandboxes.humaneval.suite import cache_key

    suite = build_suite(seed=0, limit=LIMIT, per_problem=PER, cache_dir=cache)
    want = [{k: r[k] for k in ("task_id", "slice", "environment_id", "environment_digest", "bundle", "suite_key")}
            for r in sorted(task_rows(suite.tasks, suite_key=cache_key(suite.params)), key=lambda r: r["task_id"])]
    for sources in (None, [{"kind": "humaneval"}]):
        res = _materialize(home.root, cache, [task_suite], sources=sources)
        assert res.success
        got = _q(home.root, "SELECT task_id, slice, environment_id, environment_digest, bundle, suite_key "
                            "FROM tasks ORDER BY task_id")
        assert [{**r, "bundle": json.loads(r["bundle"])} for r in got] == \
            [{**r, "bundle": json.loads(r["bundle"])} for r in want]
        assert _q(home.root, "SELECT count(*) AS n FROM task_rejections")[0]["n"] == 0


@pytest.mark.parametrize("bad, message", [
    ({"kind": "gitlab", "path": "x"}, "kind 'gitlab' is not one of"),
    ({"kind": "harbor"}, "`path` is required"),
    ({"kind": "harbor", "path": "/nonexistent/harbor"}, "/nonexistent/harbor does not exist"),
    ({"kind": "swebench", "path": "/nonexistent/i.jsonl"}, "`repos`"),
    ({"kind": "harbor", "path": "/tmp", "limits": {"verify_s": 5}}, "`limits` is for swebench sources"),
    ({"kind": "humaneval", "limit": 3}, "size it with the tasks asset's own seed / limit / per_problem"),
])
def test_a_bad_source_fails_the_run_and_loses_nothing(home, cache, bad, message):
    from assets.tasks import task_suite

    assert _materialize(home.root, cache, [task_suite]).success
    before = _q(home.root, "SELECT task_id FROM tasks ORDER BY 1")
    res = _materialize(home.root, cache, [task_suite], sources=[{"kind": "humaneval"}, bad])
    assert not res.success
    errors = [e.event_specific_data.error.to_string() for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert any(message in e and "SourceError" in e for e in errors), errors
    assert _q(home.root, "SELECT task_id FROM tasks ORDER BY 1") == before and before


def test_two_sources_with_one_label_and_duplicate_task_ids(tmp_path, user_tasks):
    from ratchet.task_sources import Loaded, SourceError, SourceSpec, drop_duplicates, parse_sources

    harbor, _, _ = user_tasks
    with pytest.raises(SourceError, match="give each a distinct `name`"):
        parse_sources([{"kind": "harbor", "path": str(harbor)}, {"kind": "harbor", "path": str(harbor)}])
    from sandboxes.importers import from_harbor

    b = from_harbor(harbor / "title-case")
    ids, owners = set(), {}
    first, second = Loaded(SourceSpec("harbor", name="a"), [b]), Loaded(SourceSpec("harbor", name="b"), [b])
    drop_duplicates(ids, first, owners)
    drop_duplicates(ids, second, owners)
    assert first.bundles == [b] and second.bundles == []
    assert [(r.task, r.reason) for r in second.rejections] == [("harbor/title-case", "duplicate_task_id")]
    assert "a already has" in second.rejections[0].detail


def test_quixbugs_instances_through_the_swebench_source(tmp_path, runtime):
    """Six QuixBugs programs (tests/sandboxes/fixtures/quixbugs, MIT), a suite we did not write:
    every buggy program fails its tests (bitcount loops forever: the per-test CPU limit ends it)
    and every fixed one passes, so all six are accepted; the clone is found case-insensitively."""
    from ratchet.task_sources import load_source, parse_sources
    from tests.sandboxes import quixbugs as qb

    repos = tmp_path / "repos"
    repos.mkdir()
    _, base = qb.repo(repos)                      # repos/quixbugs for jkoppel/QuixBugs
    jsonl = tmp_path / "quixbugs.jsonl"
    jsonl.write_text("".join(json.dumps(qb.instance(n, base)) + "\n" for n in qb.PROGRAMS))
    spec, = parse_sources([{"kind": "swebench", "path": str(jsonl), "repos": str(repos),
                            "limits": {"wall_s": 5, "cpu_s": 5, "verify_s": 20, "test_cpu_s": 2}}])
    loaded = load_source(spec, lambda: runtime)
    assert [(r.task, r.reason, r.detail) for r in loaded.rejections] == []
    assert sorted(b.task_id for b in loaded.bundles) == sorted(f"quixbugs__{n}" for n in qb.PROGRAMS)
    assert all(b.limits.cpu_s == 5 and b.limits.test_cpu_s == 2.0 for b in loaded.bundles)


def test_harbor_reference_patch_and_tasks_without_a_reference(tmp_path, runtime, user_tasks):
    """A solution/*.patch is a reference fix too; `require_reference: false` keeps a task that has
    none once its tests fail on the unfixed code (and still rejects one whose tests pass)."""
    from ratchet.task_sources import load_source, parse_sources

    _, _, repos = user_tasks
    src = repos / "acme__text"
    d = harbor_task(tmp_path / "a", "patched", src, solve=None)
    (d / "solution").mkdir()
    (d / "solution" / "fix.patch").write_text("--- a/pkg/text.py\n+++ b/pkg/text.py\n@@ -1,2 +1,2 @@\n"
                                              " def title(s):\n-    return s.upper()\n+    return s.title()\n")
    harbor_task(tmp_path / "b", "no-solution", src, solve=None)
    harbor_task(tmp_path / "b", "already-solved", src, code=FIXED, solve=None)
    spec, = parse_sources([{"kind": "harbor", "path": str(tmp_path / "a")}])
    loaded = load_source(spec, lambda: runtime)
    assert [b.task_id for b in loaded.bundles] == ["harbor/patched"] and not loaded.rejections
    spec, = parse_sources([{"kind": "harbor", "path": str(tmp_path / "b"), "require_reference": False}])
    loaded = load_source(spec, lambda: runtime)
    assert [b.task_id for b in loaded.bundles] == ["harbor/no-solution"]
    assert [(r.task, r.reason) for r in loaded.rejections] == [("harbor/already-solved", "tests_pass_before_fix")]


def test_sources_from_one_folder(tmp_path, user_tasks):
    """What `--tasks-from PATH` would pass: the layouts the guide describes, and a clear error."""
    from ratchet.task_sources import SourceError, parse_sources, sources_from_path

    harbor, jsonl, repos = user_tasks
    root = jsonl.parent
    assert sources_from_path(root) == [{"kind": "humaneval"}, {"kind": "harbor", "path": str(harbor)},
                                       {"kind": "swebench", "path": str(jsonl), "repos": str(repos)}]
    assert sources_from_path(harbor, humaneval=False) == [{"kind": "harbor", "path": str(harbor)}]
    assert sources_from_path(jsonl)[1:] == [{"kind": "swebench", "path": str(jsonl), "repos": str(repos)}]
    assert len(parse_sources(sources_from_path(root))) == 3
    (tmp_path / "i.jsonl").write_text("")
    with pytest.raises(SourceError, match="needs a repos/ folder"):
        sources_from_path(tmp_path)
    with pytest.raises(SourceError, match="no Harbor task folders"):
        sources_from_path(repos)


def test_no_accepted_task_keeps_the_suite_and_records_why(home, cache, user_tasks, tmp_path):
    """Only rejects: the run fails, the previous tasks stay, the rejections are there to read."""
    from assets.tasks import task_suite

    _, _, repos = user_tasks
    harbor_task(tmp_path / "bad", "already-solved", repos / "acme__text", code=FIXED)
    assert _materialize(home.root, cache, [task_suite]).success
    before = _q(home.root, "SELECT task_id FROM tasks ORDER BY 1")
    res = _materialize(home.root, cache, [task_suite], sources=[{"kind": "harbor", "path": str(tmp_path / "bad")}])
    assert not res.success
    errors = [e.event_specific_data.error.to_string() for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert any("no source gave a task" in e for e in errors), errors
    assert _q(home.root, "SELECT task_id FROM tasks ORDER BY 1") == before and before
    assert [(r["task"], r["reason"]) for r in _q(home.root, "SELECT task, reason FROM task_rejections")] == \
        [("harbor/already-solved", "tests_pass_before_fix")]


def test_a_task_row_takes_its_solution_slice_and_load_time_from_the_bundle():
    """`solution` (what contamination compares) is `solution.py` where a bundle has one, else its
    first non-test Python file by path; `slice` is the operator family, else the root cause's
    family; `loaded_at` is the time given, else the time of the call."""
    from datetime import datetime, timezone

    from ratchet.governance.tasks import task_rows
    from sandboxes.bundle import TaskBundle

    humaneval = TaskBundle(task_id="he", files={"solution.py": "S", "a.py": "A", "test_solution.py": "T"},
                           metadata={"slices": {"operator_family": "compare"}, "root_cause": {"family": "other"}})
    own = TaskBundle(task_id="own", files={"README.md": "R", "tests/test_text.py": "T", "pkg/text.py": FIXED,
                                           "pkg/zz.py": "Z"},
                     metadata={"root_cause": {"family": "string-case"}})
    no_python = TaskBundle(task_id="doc", files={"notes.txt": "N", "tests/test_x.py": "T"})
    at = datetime(2026, 10, 1, tzinfo=timezone.utc)
    rows = {r["task_id"]: r for r in task_rows([humaneval, own, no_python], suite_key="k", loaded_at=at)}
    assert [(rows[t]["solution"], rows[t]["slice"]) for t in ("he", "own", "doc")] == [
        ("S", "compare"), (FIXED, "string-case"), (None, None)]
    assert {r["loaded_at"] for r in rows.values()} == {at}
    before = datetime.now(timezone.utc)
    (row,) = task_rows([own], suite_key="k")
    assert before <= row["loaded_at"] <= datetime.now(timezone.utc)
