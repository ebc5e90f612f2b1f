"""Tools and RepairEnv on a real suite task in the real sandbox: happy and error paths."""
import dataclasses
import json

import pytest

from sandboxes.env import RepairEnv
from sandboxes.humaneval import build_suite
from sandboxes.tools import TOOL_NAMES, TOOL_SCHEMAS

pytestmark = pytest.mark.evaluation


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    suite = build_suite(seed=0, limit=1, per_problem=1, cache_dir=tmp_path_factory.mktemp("suite"))
    return suite.tasks[0]        # has_close_elements with a planted bug


@pytest.fixture
def env(runtime, task):
    with RepairEnv(task, runtime=runtime) as e:
        e.reset()
        yield e


def test_schemas_are_openai_function_tools():
    assert [s["function"]["name"] for s in TOOL_SCHEMAS] == list(TOOL_NAMES)
    for s in TOOL_SCHEMAS:
        assert s["type"] == "function" and s["function"]["description"]
        p = s["function"]["parameters"]
        assert p["type"] == "object" and set(p["required"]) <= set(p["properties"])
    json.dumps(TOOL_SCHEMAS)


def test_reset_gives_system_and_issue_prompt(runtime, task):
    with RepairEnv(task, runtime=runtime) as e:
        msgs = e.reset()
        assert [m["role"] for m in msgs] == ["system", "user"]
        assert task.issue_id in msgs[1]["content"] and task.issue_title in msgs[1]["content"]
        assert {s["function"]["name"] for s in e.tool_schemas()} == set(task.tool_allowlist)


def test_view_issue_goes_through_the_http_mock(env, task, monkeypatch):
    import urllib.request
    seen = []
    real = urllib.request.OpenerDirector.open

    def spy(self, req, *a, **kw):
        seen.append(req if isinstance(req, str) else req.full_url)
        return real(self, req, *a, **kw)

    monkeypatch.setattr(urllib.request.OpenerDirector, "open", spy)
    obs = env.step("view_issue", {})
    assert task.issue_title in obs and task.issue_body.strip()[:40] in obs
    assert len(seen) == 1 and seen[0].startswith("http://127.0.0.1:") and task.issue_id in seen[0]
    assert env.step("view_issue", {"issue_id": "HE-999-nope"}).startswith("error: issue 'HE-999-nope' not found")


def test_sandbox_cannot_reach_the_tracker(env):
    port = env.tracker.url.rsplit(":", 1)[1]
    r = env.episode.run(["python3", "-c", f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/', timeout=2)"])
    assert r.returncode != 0


def test_list_read_search(env, task):
    assert env.step("list_files", {}).splitlines() == sorted(task.files)
    assert env.step("list_files", {"path": "nope"}).startswith("error:")
    rc = task.metadata["root_cause"]
    line = rc["line"]
    out = env.step("read_file", {"path": "solution.py", "start_line": line, "end_line": line})
    assert out == f"{line:4d}| " + task.files["solution.py"].splitlines()[line - 1]
    assert env.step("read_file", {"path": "solution.py", "start_line": 999}).startswith("error: line range")
    assert env.step("read_file", {"path": "missing.py"}).startswith("error: no such file")
    assert env.step("read_file", {"path": "../../etc/passwd"}).startswith("error: path not allowed")
    hits = env.step("search", {"pattern": rc["function"]})
    assert "solution.py:" in hits and "def " + rc["function"] in hits
    assert env.step("search", {"pattern": "zz_not_there"}).startswith("no matches")
    assert env.step("search", {"pattern": "(", "regex": True}).startswith("error: search failed")


def test_edit_exact_absent_ambiguous(env):
    src = env.episode.read_file("solution.py")
    assert env.step("edit", {"path": "solution.py", "old": "no such text", "new": "x"}).startswith(
        "error: old text not found")
    assert "occurs" in env.step("edit", {"path": "solution.py", "old": "return", "new": "x"})
    assert env.episode.read_file("solution.py") == src
    ok = env.step("edit", {"path": "solution.py", "old": "def has_close_elements", "new": "def has_close_elements"})
    assert ok.startswith("edited solution.py")


def test_run_tests_localize_propose_apply(env, task):
    rc = task.metadata["root_cause"]
    out = env.step("run_tests", {})
    assert f"{len(task.fail_to_pass)} failed" in out and all(t in out for t in task.fail_to_pass)
    one = env.step("run_tests", {"tests": [task.pass_to_pass[0]]})
    assert one.startswith("1 passed")
    loc = env.step("localize", {"top": 3})
    assert f"solution.py:{rc['line']}" in loc.splitlines()[1]
    cands = env.step("propose_edits", {"path": "solution.py", "line": rc["line"]})
    fix = next(l for l in cands.splitlines() if f"with `{rc['original']}`" in l)
    index = int(fix[1:fix.index("]")])
    assert env.step("apply_edit", {"path": "solution.py", "line": rc["line"], "index": 99}).startswith(
        "error: no candidate 99")
    assert env.step("propose_edits", {"path": "solution.py", "line": 9999}).startswith("error:")
    assert env.step("apply_edit", {"path": "solution.py", "line": rc["line"], "index": index}).startswith("applied")
    assert env.step("run_tests", {}).startswith(f"{len(task.fail_to_pass) + len(task.pass_to_pass)} passed")
    assert env.step("localize", {}) == "no failing tests: nothing to localize"
    obs = env.step("submit", {"explanation": f"`{rc['function']}` line {rc['line']}: `{rc['mutated']}` "
                                             f"should be `{rc['original']}`"})
    assert obs.startswith("submitted:") and env.done
    assert env.reward.status == "scored" and env.reward.components["tests"] == 1.0 and env.reward.value > 0.9
    assert env.step("run_tests", {}).startswith("error: the episode is over")
    assert [s.tool for s in env.steps][-1] == "submit"
    assert all(isinstance(s.observation, str) and s.observation for s in env.steps)
    assert [s.index for s in env.steps] == list(range(len(env.steps)))
    assert sum(s.duration_s for s in env.steps) > 0 and env.sandbox_s > 0


def test_bad_calls_are_error_observations(env):
    cases = [("no_such_tool", {}), ("read_file", "{not json"), ("read_file", "[1, 2]"),
             ("read_file", {}), ("read_file", {"path": 3}), ("read_file", {"path": "solution.py", "bogus": 1}),
             ("propose_edits", {"path": "solution.py", "line": 0}), ("localize", {"formula": "magic"}),
             ("run_tests", {"tests": [1, 2]})]
    for tool, args in cases:
        obs = env.step(tool, args)
        assert obs.startswith("error:"), (tool, args, obs)
    assert all(s.error for s in env.steps) and len(env.steps) == len(cases)
    assert env.steps[1].arguments == "{not json"      # recorded as sent


def test_oversize_output_is_an_error(runtime, task):
    small = dataclasses.replace(task, limits=dataclasses.replace(task.limits, max_output_chars=200))
    with RepairEnv(small, runtime=runtime) as e:
        e.reset()
        assert e.step("read_file", {"path": "solution.py"}).startswith("error: the output of read_file is")
        assert len(e.step("read_file", {"path": "solution.py", "start_line": 1, "end_line": 2})) < 200


def test_turn_limit_ends_and_scores(runtime, task):
    with RepairEnv(task, runtime=runtime, max_turns=3) as e:
        e.reset()
        e.step("list_files", {})
        e.step("list_files", {})
        obs = e.step("list_files", {})
        assert "turn limit 3 reached" in obs and e.done
        assert e.reward.status == "scored" and e.reward.components["tests"] == 0.0


@pytest.mark.security
def test_allowlist_is_enforced_by_the_env(runtime, task):
    no_edit = dataclasses.replace(task, tool_allowlist=tuple(t for t in task.tool_allowlist if t != "edit"))
    with RepairEnv(no_edit, runtime=runtime) as e:
        e.reset()
        before = e.episode.read_file("solution.py")
        obs = e.step("edit", {"path": "solution.py", "old": "return", "new": "raise"})
        assert obs == "error: tool 'edit' is not allowed in this environment"
        assert e.episode.read_file("solution.py") == before and e.episode.changed_paths() == []
        assert "edit" not in {s["function"]["name"] for s in e.tool_schemas()}
