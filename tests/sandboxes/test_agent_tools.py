"""The tools real coding agents use, served by RepairEnv in the real sandbox: `bash`
(mini-swe-agent's one tool) and `str_replace_editor` (SWE-agent's and OpenHands' editor)."""
import pytest

from sandboxes.env import RepairEnv
from sandboxes.humaneval import build_suite

pytestmark = pytest.mark.evaluation


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    suite = build_suite(seed=0, limit=1, per_problem=1, cache_dir=tmp_path_factory.mktemp("suite"))
    return suite.tasks[0]


@pytest.fixture
def env(runtime, task):
    with RepairEnv(task, runtime=runtime) as e:
        e.reset()
        yield e


def test_bash_runs_in_the_worktree_and_reports_the_exit_code(env):
    assert env.step("bash", {"command": "python -c 'print(6 * 7)'"}) == "42\n[exit code 0]"
    assert env.step("bash", {"command": "ls solution.py && exit 3"}) == "solution.py\n[exit code 3]"
    env.step("bash", {"command": "printf 'hello\\n' > note.txt"})
    assert env.episode.read_file("note.txt") == "hello\n"            # it ran in the episode's worktree
    assert env.step("bash", {"command": "  "}).startswith("error: command must not be empty")
    assert env.step("bash", {}).startswith("error: bash is missing required argument(s) ['command']")
    # no network in the sandbox
    out = env.step("bash", {"command": "python -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\""})
    assert "[exit code 1]" in out and "exit code 0" not in out


def test_the_editor_fixes_the_bug_and_the_fix_is_scored(env, task):
    fix = task.metadata["fix"]
    line = env.episode.read_file(fix["file"]).splitlines()[fix["line"] - 1]
    view = env.step("str_replace_editor", {"command": "view", "path": f"/testbed/{fix['file']}",
                                           "view_range": [fix["line"], fix["line"]]})
    assert view == f"{fix['file']}:\n{fix['line']:6d}\t{line}"
    fixed = line[:fix["col"]] + fix["new"] + line[fix["end_col"]:]
    out = env.step("str_replace_editor", {"command": "str_replace", "path": fix["file"], "old_str": line,
                                          "new_str": fixed})
    assert out.startswith(f"edited {fix['file']}:") and f"{fix['line']:6d}\t{fixed}" in out
    env.step("str_replace_editor", {"command": "undo_edit", "path": fix["file"]})
    assert env.episode.read_file(fix["file"]).splitlines()[fix["line"] - 1] == line
    env.step("str_replace_editor", {"command": "str_replace", "path": fix["file"], "old_str": line, "new_str": fixed})
    assert "1 failed" not in env.step("run_tests", {}) and "passed" in env.step("run_tests", {})
    env.step("submit", {"explanation": f"{task.metadata['entry_point']} line {fix['line']}: {fix['old']} "
                                       f"should be {fix['new']}"})
    assert env.done and env.reward.components["tests"] == 1.0


def test_the_editor_creates_inserts_and_refuses_what_it_cannot_do(env):
    ed = lambda **a: env.step("str_replace_editor", a)          # noqa: E731
    assert ed(command="create", path="helper.py", file_text="A = 1\n") == "created helper.py"
    assert ed(command="create", path="helper.py", file_text="B = 2\n").startswith("error: helper.py already exists")
    ed(command="insert", path="helper.py", insert_line=0, new_str="# top")
    ed(command="insert", path="helper.py", insert_line=2, new_str="C = 3")
    assert env.episode.read_file("helper.py") == "# top\nA = 1\nC = 3\n"
    assert ed(command="insert", path="helper.py", insert_line=9, new_str="x").startswith("error: insert_line 9")
    assert ed(command="str_replace", path="helper.py", old_str="nowhere", new_str="x").startswith(
        "error: old_str not found")
    assert "occurs 0 times" not in ed(command="str_replace", path="helper.py", old_str="nowhere", new_str="")
    assert ed(command="view", path="helper.py", view_range=[1, -1]) == "helper.py:\n     1\t# top\n     2\tA = 1\n     3\tC = 3"
    assert ed(command="view", path="/repo").startswith(env.step("list_files", {}).split("\n")[0])
    assert ed(command="undo_edit", path="nothing.py").startswith("error: no edit of nothing.py to undo")
    assert ed(command="view", path="../../etc/passwd").startswith("error: path not allowed")
    assert ed(command="view", path="helper.py", view_range=["1", "2"]).startswith("error: argument 'view_range'")
    assert ed(command="delete", path="helper.py").startswith("error: argument 'command' of str_replace_editor must be one of")
