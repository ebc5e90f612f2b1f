"""Each tool's observation formatter against the parser beside it (`sandboxes.observations`):
format -> parse gives back what went in, for hostile values (paths with spaces, colons and
brackets, unicode, code that looks like tool output, empty results, long lists). A format
change the parser does not follow fails the round trip; any format change at all fails the
pinned examples (so the parser is looked at). The last test runs the real tools in the real
sandbox and parses what they print."""
import pytest

from sandboxes import observations as ob
from sandboxes.runtime import TestReport

PATHS = ["solution.py", "dir with space/a b.py", "c:d/e:f.py", "ünïcødé/çödé_π.py", "[0] odd.py",
         "deep/" * 30 + "x.py"]


# --------------------------------------------------------------------------- list_files
@pytest.mark.parametrize("files", [
    [], ["solution.py"], PATHS, [f"pkg/m{i:04d}.py" for i in range(500)],
    ["(no files under .).py", "a.py"],
], ids=["empty", "one", "hostile", "500", "marker-lookalike"])
@pytest.mark.parametrize("path", [".", "dir with space", "ünï:x"])
def test_list_files_roundtrip(files, path):
    assert ob.parse_file_list(ob.format_file_list(path, files)) == files


# --------------------------------------------------------------------------- read_file
SOURCES = {
    "empty": "",
    "one": "x = 1\n",
    "blank-lines": "\n\nx = 1\n\n",
    "indented": "def f():\n    if a:\n\t\treturn '  spaced  '\n",
    "lookalikes": "   3| not a line number\n12| x\n|\n 1.  a.py:3  score=1.000  | y\n[0] z\nerror: no\n",
    "unicode": "naïve = 'ß∂ƒ'\nπ = 3.14  # ünï\n😀 = None\n",
    "trailing-space": "x = 1   \ny = 2 \n",
    "long": "".join(f"v{i} = {i}\n" for i in range(12_000)),    # line numbers past 4 digits
}


@pytest.mark.parametrize("name", SOURCES)
@pytest.mark.parametrize("path", ["solution.py", "dir with space/a:b.py"])
def test_read_file_roundtrip_whole_file(name, path):
    lines = SOURCES[name].splitlines()
    obs = ob.format_source(path, lines, 1, len(lines))
    assert ob.parse_source(obs) == "".join(line + "\n" for line in lines)


@pytest.mark.parametrize("start,end", [(1, 1), (2, 4), (5, 6), (6, 6)])
def test_read_file_roundtrip_ranges(start, end):
    lines = SOURCES["lookalikes"].splitlines()
    assert ob.parse_source(ob.format_source("a.py", lines, start, end)) == \
        "".join(line + "\n" for line in lines[start - 1:end])


# --------------------------------------------------------------------------- run_tests
IDS = ["test_a.py::test_x", "tests/dir with space/test_b.py::TestK::test_y[a b: c]",
       "test_ü.py::test_π[ünï-😀]", "test_c.py::test_z[1-2] - looks like a summary",
       "ERROR odd.py::test_e", "test_d.py::test_w[::]"]
NOISELESS_OUTPUT = "E   assert 1 == 2\nE    +  where 1 = f()\ntest_a.py:3: AssertionError\n"


def _report(outcomes, *, timed_out=False, fault=None, output=""):
    return TestReport(dict(outcomes), timed_out=timed_out, output=output, agent_fault=fault)


RUNS = {
    "none-ran": _report({}),
    "all-passed": _report({t: "passed" for t in IDS}),
    "mixed": _report(dict(zip(IDS, ["passed", "failed", "error", "skipped", "failed", "passed"], strict=True))),
    "timed-out": _report({t: "error" for t in IDS[:2]}, timed_out=True),
    "crashed": _report({IDS[0]: "error"}, fault="worker died: SIGKILL"),
    "crashed-multiline": _report({IDS[0]: "error", IDS[2]: "error"},
                                 fault="pytest worker died or hung: Traceback:\n  File x, line 1\nMemoryError"),
    "crashed-long": _report({IDS[0]: "error"}, fault="ü" * 1000),
    "tail": _report({IDS[0]: "failed", IDS[1]: "passed"}, output=NOISELESS_OUTPUT),
    "many": _report({f"test_m.py::test_{i}[{i}: x]": ("failed" if i % 3 else "passed") for i in range(300)}),
}


@pytest.mark.parametrize("name", RUNS)
def test_run_tests_roundtrip(name):
    rep = RUNS[name]
    obs = ob.format_test_summary(rep, limit=1_000_000)
    got = ob.parse_test_summary(obs)
    counts = {}
    for o in rep.outcomes.values():
        counts[o] = counts.get(o, 0) + 1
    assert got.counts == counts
    assert got.timed_out is rep.timed_out
    assert got.crashed == (rep.agent_fault[:300] if rep.agent_fault else None)
    assert got.not_passed == {t: o for t, o in rep.outcomes.items() if o != "passed"}
    shows_tail = bool(rep.output) and any(o != "passed" for o in rep.outcomes.values())
    assert got.output == (rep.output if shows_tail else "")
    passed = "passed" in counts and "failed" not in counts and "error" not in counts
    assert ob.tests_all_passed(obs) is passed
    assert sorted(ob.failing_tests(obs)) == sorted(t for t, o in rep.outcomes.items() if o in ("failed", "error"))


def test_run_tests_output_tail_is_cut_to_the_limit_and_aggregates_are_counted_once():
    rep = _report({"t.py::f": "failed", "t.py::f[1]": "failed", "t.py::f[2]": "passed"},
                  output="x" * 5000 + " at 0xdeadbeef> in 0.25s")
    got = ob.parse_test_summary(ob.format_test_summary(rep, limit=1000))
    assert got.counts == {"failed": 1, "passed": 1}      # `t.py::f` stands for its two items
    assert got.not_passed == {"t.py::f[1]": "failed"}
    assert 200 < len(got.output) < 1000 and got.output.endswith("x>")     # noise dropped
    assert ob.parse_test_summary(ob.format_test_summary(rep, limit=100)).output == ""


# --------------------------------------------------------------------------- localize
CODE = ["return a < b", "x = 'a.py:3  score=1.000  | y'", "", "ünï = '😀' | 2", "s = f'{a}:{b}  score=9'"]


@pytest.mark.parametrize("rows", [
    [],
    [("solution.py", 7, 1.0, "if d < threshold:")],
    [(p, i + 1, s, c) for i, (p, s, c) in enumerate(zip(PATHS, [1.0, 0.5, 0.125, float("inf"), 0.333, 0.001],
                                                        CODE + ["x"], strict=True))],
    [(f"m{i % 7}.py", i + 1, round(1 - i / 100, 3), f"line {i}") for i in range(50)],
    [("a.py", 10**6, 0.9, "far down")],
], ids=["empty", "one", "hostile", "50", "big-line"])
@pytest.mark.parametrize("formula", ["ochiai", "dstar"])
def test_localize_roundtrip(rows, formula):
    obs = ob.format_localize(formula, 3, rows)
    assert ob.parse_localize(obs) == [(f, line, score) for f, line, score, _ in rows]


# --------------------------------------------------------------------------- propose_edits
DESCRIPTIONS = ["replace `<` with `<=`: `if a <= b:`", "drop `not`: `if x:`", "[1] looks like an index",
                "ünï: `π = 3.15`", "", "  leading spaces kept? no: the separator eats them"]


@pytest.mark.parametrize("cands", [
    [], [(0, DESCRIPTIONS[0])], list(enumerate(DESCRIPTIONS[:5])),
    [(i, f"replace `{i}` with `{i + 1}`: `x = {i + 1}`") for i in range(200)],
], ids=["empty", "one", "hostile", "200"])
@pytest.mark.parametrize("path", PATHS[:5])
def test_propose_edits_roundtrip(cands, path):
    assert ob.parse_candidates(ob.format_candidates(path, 12, cands)) == cands


def test_propose_edits_separator_spaces_are_not_part_of_the_description():
    assert ob.parse_candidates(ob.format_candidates("a.py", 1, [(3, DESCRIPTIONS[5])])) == \
        [(3, DESCRIPTIONS[5].lstrip())]


# --------------------------------------------------------------------------- apply_edit
@pytest.mark.parametrize("new_line", ["    return a <= b", "x = `y`  # backticks: `z`", "s = f'{a}: `{b}`'",
                                      "π = 3.15  # ünï 😀", "", "  a:3: `b`  "])
@pytest.mark.parametrize("path", PATHS)
def test_apply_edit_roundtrip(path, new_line):
    got = ob.parse_applied(ob.format_applied(7, path, 41, new_line))
    assert got == ob.Applied(7, path, 41, new_line.strip())


def test_apply_edit_with_a_note_after_it_is_not_read():
    obs = ob.format_applied(0, "a.py", 1, "x = 1") + "\n(turn limit 5 reached: the episode ended and was scored)"
    assert ob.parse_applied(obs) is None


# --------------------------------------------------------------------------- errors and pinned formats
@pytest.mark.parametrize("parse,nothing", [
    (ob.parse_file_list, []), (ob.parse_source, ""), (ob.parse_test_summary, None), (ob.tests_all_passed, False),
    (ob.failing_tests, []), (ob.parse_localize, []), (ob.parse_candidates, []), (ob.parse_applied, None),
])
@pytest.mark.parametrize("obs", ["error: sandbox infrastructure failure: x",
                                 "error: no such file or folder: a.py\n   1| x\n[0] y\nFAILED t.py::z"])
def test_error_observations_parse_as_nothing(parse, nothing, obs):
    assert parse(obs) == nothing


PINNED = [
    (ob.format_file_list(".", ["a.py", "b/c.py"]), "a.py\nb/c.py"),
    (ob.format_file_list("src", []), "(no files under src)"),
    (ob.format_source("a.py", ["x = 1", "  y"], 1, 2), "   1| x = 1\n   2|   y"),
    (ob.format_source("a.py", [], 1, 0), "(a.py is empty)"),
    (ob.format_test_summary(_report({"t.py::a": "passed", "t.py::b": "failed"}, timed_out=True, fault="boom",
                                    output="E assert 0"), 10_000),
     ("1 failed, 1 passed [timed out]\nthe test run crashed (caused by the code under test): boom\n"
      "FAILED t.py::b\n\n--- pytest output (tail) ---\nE assert 0")),
    (ob.format_test_summary(_report({}), 10_000), "no tests ran"),
    (ob.format_localize("ochiai", 2, [("a.py", 3, 0.5, "x < y"), ("b.py", 10, float("inf"), "")]),
     "suspicious lines (ochiai; 2 failing test(s)):\n 1. a.py:3  score=0.500  | x < y\n 2. b.py:10  score=inf  | "),
    (ob.format_localize("ochiai", 2, []), "failing tests covered no lines outside the test files"),
    (ob.format_candidates("a.py", 3, [(0, "swap"), (1, "drop")]), "candidates for a.py:3:\n[0] swap\n[1] drop"),
    (ob.format_candidates("a.py", 3, []), "no candidate edits for a.py:3"),
    (ob.format_applied(2, "a.py", 3, "    x = 1\n"), "applied [2] to a.py:3: `x = 1`"),
]


@pytest.mark.parametrize("got,want", PINNED, ids=[f"pinned-{i}" for i in range(len(PINNED))])
def test_pinned_formats(got, want):
    assert got == want


# --------------------------------------------------------------------------- the real tools
def test_real_tools_parse_back(runtime, tmp_path_factory):
    """The tools print through these formatters: parse what the real env shows."""
    from sandboxes.env import RepairEnv
    from sandboxes.humaneval import build_suite

    task = build_suite(seed=0, limit=1, per_problem=1, cache_dir=tmp_path_factory.mktemp("suite")).tasks[0]
    rc = task.metadata["root_cause"]
    odd = "dir with space/ünï:x.py"
    with RepairEnv(task, runtime=runtime) as env:
        env.reset()
        assert env.step("write_file", {"path": odd, "content": "def f(a, b):\n    return a < b\n"}).startswith("created")
        assert ob.parse_file_list(env.step("list_files", {})) == sorted([*task.files, odd])
        assert ob.parse_source(env.step("read_file", {"path": "solution.py"})) == task.files["solution.py"]
        summary = ob.parse_test_summary(env.step("run_tests", {}))
        assert summary.not_passed == {t: "failed" for t in task.fail_to_pass}
        assert summary.counts == {"failed": len(task.fail_to_pass), "passed": len(task.pass_to_pass)}
        ranked = ob.parse_localize(env.step("localize", {"top": 3}))
        assert ranked[0][:2] == ("solution.py", rc["line"]) and 0 < ranked[0][2] <= 1
        cands = ob.parse_candidates(env.step("propose_edits", {"path": odd, "line": 2}))
        assert [i for i, _ in cands] == list(range(len(cands))) and any("<=" in d for _, d in cands)
        index = next(i for i, d in cands if d.endswith("`return a <= b`"))
        applied = ob.parse_applied(env.step("apply_edit", {"path": odd, "line": 2, "index": index}))
        assert applied == ob.Applied(index, odd, 2, "return a <= b")
        assert env.episode.read_file(odd).splitlines()[1].strip() == applied.text
