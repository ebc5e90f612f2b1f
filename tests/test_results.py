"""Recorded bench results: a bench's final JSON line is kept with where and when it ran, and the
results page is a pure function of the recorded lines."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from datetime import datetime, timezone

from pipelines.cli import _bench_recorded, main
from ratchet import results

ROOT = Path(__file__).resolve().parent.parent

FAKE_BENCH = """
import json, sys
print("a table a reader looks at")
print(json.dumps({"bench": "sandbox", "test_run_p50_ms": float(sys.argv[1]), "baseline": "cold pytest",
                  "ratio": 9.5}))
"""


def _record(tmp_path, p50, when):
    res = {"bench": "sandbox", "test_run_p50_ms": p50, "baseline": "cold pytest", "ratio": 10.0}
    rec = results.make_record("sandbox", ["--tasks", "3"], res, when, 1.5, (0.5, 0, 0), (0.7, 0, 0))
    results.append_record(rec, tmp_path)
    return rec


def test_record_keeps_commit_machine_load_and_the_bench_line(tmp_path):
    rec = _record(tmp_path, 21.0, datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    line = json.loads((tmp_path / "sandbox.jsonl").read_text())
    assert line == rec
    assert line["recorded_at"] == "2026-01-02T03:04:05Z"
    assert line["machine"]["cores"] >= 1 and line["loadavg_1m"] == [0.5, 0.7]
    assert len(line["commit"]) == 12 and isinstance(line["dirty"], bool)
    assert line["result"]["test_run_p50_ms"] == 21.0


def test_page_is_a_pure_function_of_the_lines(tmp_path):
    for i, p50 in enumerate([30.0, 24.0, 22.0]):
        _record(tmp_path, p50, datetime(2026, 1, 1 + i, tzinfo=timezone.utc))
    first = results.write_page(tmp_path).read_bytes()
    png = (tmp_path / "sandbox.png").read_bytes()
    second = results.write_page(tmp_path).read_bytes()
    assert first == second and (tmp_path / "sandbox.png").read_bytes() == png
    page = first.decode()
    # latest value, its target verdict, the history newest first, the plot
    assert "| [sandbox](#sandbox) | 2026-01-03 | 22 ms per warm test run (p50) | cold pytest | 10 |" in page
    assert "warm test run p50 <= 25 ms: met" in page
    hist = page[page.index("History"):]
    assert hist.index("| 22 |") < hist.index("| 24 |") < hist.index("| 30 |")
    assert "![sandbox history](sandbox.png)" in page
    assert "Not recorded yet:" in page and "`learning`" in page


def test_target_not_met_and_missing_figure_are_said(tmp_path):
    _record(tmp_path, 40.0, datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert "warm test run p50 <= 25 ms: not met" in results.render(tmp_path, plots=False)
    t = results.Target("paired.rl_minus_sft.0", ">=", 0.05, "x")
    assert t.met({"paired": {"rl_minus_sft": [0.06, -0.01, 0.1]}}) is True
    assert t.met({"paired": {"rl_minus_sft": [0.01, -0.01, 0.1]}}) is False
    assert t.met({}) is None


def test_check_fails_until_the_page_is_rendered(tmp_path, capsys):
    _record(tmp_path, 22.0, datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert main(["results", "--check", "--results-dir", str(tmp_path)]) == 1
    assert main(["results", "--results-dir", str(tmp_path)]) == 0
    assert main(["results", "--check", "--results-dir", str(tmp_path)]) == 0
    (tmp_path / "sandbox.jsonl").write_text("{not json\n")
    assert main(["results", "--results-dir", str(tmp_path)]) == 2
    assert "not a JSON line" in capsys.readouterr().err


def test_bench_record_runs_the_bench_and_keeps_its_final_line(tmp_path, capsys):
    bench = tmp_path / "fake.py"
    bench.write_text(FAKE_BENCH)
    out = tmp_path / "results"
    assert _bench_recorded("sandbox", bench, ["23.5"], out) == 0
    assert "a table a reader looks at" in capsys.readouterr().out  # the bench's own output is shown
    (line,) = (out / "sandbox.jsonl").read_text().splitlines()
    rec = json.loads(line)
    assert rec["argv"] == ["23.5"] and rec["result"]["test_run_p50_ms"] == 23.5
    assert "23.5 ms per warm test run" in (out / "README.md").read_text()


def test_bench_record_keeps_nothing_when_the_bench_fails(tmp_path):
    bench = tmp_path / "broken.py"
    bench.write_text("import sys; print('{\"ratio\": 1}'); sys.exit(3)\n")
    assert _bench_recorded("sandbox", bench, [], tmp_path / "r") == 3
    assert not (tmp_path / "r").exists()
    bench.write_text("print('no json here')\n")
    assert _bench_recorded("sandbox", bench, [], tmp_path / "r") == 1
    assert not (tmp_path / "r" / "sandbox.jsonl").exists()


def _mutmut_cache(path):
    """An empty cache with mutmut 2's tables (SourceFile -> Line -> Mutant), open for inserts."""
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE SourceFile (id INTEGER PRIMARY KEY, filename TEXT, hash TEXT);
        CREATE TABLE Line (id INTEGER PRIMARY KEY, sourcefile INTEGER, line TEXT, line_number INTEGER);
        CREATE TABLE Mutant (id INTEGER PRIMARY KEY, line INTEGER, "index" INTEGER, tested_against_hash TEXT,
                             status TEXT);
    """)
    return con


def _pkg_run(root, source: str, cache, lines: str, mutants: str):
    """`root`/pkg/m.py holding `source`, and a mutmut cache at `cache` with the given Line and
    Mutant rows of that file (SourceFile 1)."""
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "m.py").write_text(source)
    con = _mutmut_cache(cache)
    con.executescript(f"""
        INSERT INTO SourceFile VALUES (1, 'pkg/m.py', 'h');
        INSERT INTO Line VALUES {lines};
        INSERT INTO Mutant VALUES {mutants};
    """)
    con.commit()
    con.close()
    return cache


def test_mutation_results_come_from_mutmuts_cache(tmp_path):
    """`make mutation` records what mutmut's cache says: counts per file and every survivor with
    its source line (mutmut numbers lines from 0)."""

    from ratchet import mutation

    cache = tmp_path / ".mutmut-cache"
    con = _mutmut_cache(cache)
    con.executescript("""
        INSERT INTO SourceFile VALUES (1, 'ratchet/governance/holdout.py', 'h');
        INSERT INTO Line VALUES (1, 1, '    if left or entered:', 9), (2, 1, 'x = 1', 20);
        INSERT INTO Mutant VALUES (1, 1, 0, 'h', 'ok_killed'), (2, 1, 1, 'h', 'bad_survived'),
                                  (3, 2, 0, 'h', 'bad_timeout'), (4, 2, 1, 'h', 'untested');
    """)
    con.commit()
    con.close()
    res = mutation.read_cache(cache)
    assert (res["mutants"], res["killed"], res["survived"], res["timeout"], res["untested"]) == (4, 1, 1, 1, 1)
    assert res["survivors"] == [{"id": 2, "file": "ratchet/governance/holdout.py", "line": 10,
                                 "code": "if left or entered:", "index": 1, "text": "    if left or entered:"}]
    assert res["ratio"] == round(1 / 3, 4)
    assert mutation.main(["--cache", str(cache), "--label", "governance", "--results-dir", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "mutation.md").read_text()
    assert "- 2: `ratchet/governance/holdout.py:10` `if left or entered:`" in page
    assert "mutmut over governance" in page
    assert mutation.main(["--cache", str(tmp_path / "none"), "--label", "x", "--results-dir", str(tmp_path)]) == 2


def test_a_mutation_record_lists_every_line_mutmut_was_told_to_skip(tmp_path):
    """`# pragma: no mutate` hides a line from mutmut; the record and the page name each such line
    with the reason written after the pragma, so no exemption is silent. And every exemption in
    the modules `make mutation` covers says why."""
    import re

    from ratchet import mutation

    src = tmp_path / "tree" / "pkg" / "m.py"
    src.parent.mkdir(parents=True)
    src.write_text("ROWS = 4096  # pragma: no mutate (a batch size: any value gives the same rows)\n"
                   "LIMIT = 3  # pragma: no mutate\n"
                   "x = '# pragma: not this one'\n")
    cache = tmp_path / ".mutmut-cache"
    con = _mutmut_cache(cache)
    con.executescript("""
        INSERT INTO SourceFile VALUES (1, 'pkg/m.py', 'h');
        INSERT INTO Line VALUES (1, 1, "x = '# pragma: not this one'", 2);
        INSERT INTO Mutant VALUES (1, 1, 0, 'h', 'ok_killed');
    """)
    con.commit()
    con.close()
    assert mutation.main(["--cache", str(cache), "--label", "pkg", "--root", str(tmp_path / "tree"),
                          "--results-dir", str(tmp_path / "r")]) == 0
    rec = json.loads((tmp_path / "r" / "mutation.jsonl").read_text().splitlines()[-1])
    assert rec["result"]["exempt"] == [
        {"file": "pkg/m.py", "line": 1, "code": "ROWS = 4096", "why": "a batch size: any value gives the same rows"},
        {"file": "pkg/m.py", "line": 2, "code": "LIMIT = 3", "why": "(no reason given)"}]
    page = (tmp_path / "r" / "mutation.md").read_text()
    assert "Lines not mutated (`# pragma: no mutate`, each with its reason): 2" in page
    assert "- `pkg/m.py:1` `ROWS = 4096`: a batch size: any value gives the same rows" in page

    targets = re.findall(r"^mut_paths_\w+ *[:?]?= *(.+)$", (ROOT / "Makefile").read_text(), re.M)
    files = sorted({str(f.relative_to(ROOT)) for t in targets for p in t.split(",")
                    for f in ([ROOT / p.strip()] if p.strip().endswith(".py") else (ROOT / p.strip()).rglob("*.py"))})
    assert any(f.endswith("ratchet/ingest.py") for f in files), targets
    unexplained = [e for e in mutation.exempt_lines(files, ROOT) if e["why"] == "(no reason given)"]
    assert not unexplained, unexplained


def test_a_mutant_of_an_unevaluated_annotation_is_skipped_not_run(tmp_path):
    """mutmut mutates `str | None` in an annotation to `str & None`; where annotations are never
    evaluated (`from __future__ import annotations`) no test can kill it, so `pre_mutation` skips it
    (recorded `skipped`, outside the ratio) instead of running the tests for a false survivor. A run of
    mutmut for real: the annotation mutants are skipped, the code's own are killed; without the future
    import an annotation is evaluated, and its mutants run."""
    import subprocess
    import sys

    from ratchet import mutation

    lazy = "from __future__ import annotations\n\n\ndef f(x: int | None = None) -> int | None:\n    y: int | None = x\n    return y + 1\n"
    assert mutation.annotation_only(lazy, lazy.replace("x: int | None", "x: int & None"))
    assert mutation.annotation_only(lazy, lazy.replace("-> int | None", "-> int & None"))
    assert mutation.annotation_only(lazy, lazy.replace("y: int | None", "y: int & None"))
    assert not mutation.annotation_only(lazy, lazy.replace("y + 1", "y + 2"))
    assert not mutation.annotation_only(lazy, lazy.replace("= None)", "= 0)"))
    assert not mutation.annotation_only(lazy, lazy)
    eager = lazy.split("\n", 3)[3]
    assert not mutation.annotation_only(eager, eager.replace("x: int | None", "x: int & None"))

    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        pytest.skip("mutmut is in the dev extra: pip install -e '.[dev]'")
    (tmp_path / "m.py").write_text(lazy)
    (tmp_path / "mutmut_config.py").write_text("from ratchet.mutation import pre_mutation  # noqa: F401\n")
    runner = f"{sys.executable} -c \"import m;assert m.f(1)==2 and m.f(5)==6\""
    subprocess.run([str(mutmut), "run", "--paths-to-mutate", "m.py", "--runner", runner, "--tests-dir", ".",
                    "--simple-output", "--no-progress", "--CI"], cwd=tmp_path, capture_output=True, check=False,
                   env={k: v for k, v in os.environ.items() if k != "RATCHET_MUTMAP"})
    res = mutation.read_cache(tmp_path / ".mutmut-cache")
    # mutmut mutates `y: int | None` (and `= x`, and the `+ 1` twice), not the signature's annotations
    assert (res["mutants"], res["skipped"], res["killed"], res["untested"]) == (4, 1, 3, 0), res
    assert res["ratio"] == 1.0


def test_a_seeded_mutation_run_does_not_rerun_killed_mutants(tmp_path):
    """`make mutation` keeps its cache between runs (`ratchet.mutation seed`): mutmut, run for real
    on a small module, kills its mutants once; a second run in a fresh copy seeded from the first
    cache runs none of them again, and a changed line gets its mutants run."""
    import shutil
    import subprocess
    import sys

    from ratchet import mutation

    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        pytest.skip("mutmut is in the dev extra: pip install -e '.[dev]'")

    def run(folder: Path, cache_from: Path | None = None) -> int:
        if cache_from is not None:
            assert mutation.main(["seed", "--cache", str(cache_from), "--out", str(folder / ".mutmut-cache")]) == 0
        log = folder / "runs.log"
        runner = f"{sys.executable} -c \"open('runs.log','a').write('x');import m;assert m.f(1)==2 and m.f(5)==6 and m.g(3)==6\""
        subprocess.run([str(mutmut), "run", "--paths-to-mutate", "m.py", "--runner", runner, "--tests-dir", ".",
                        "--simple-output", "--no-progress", "--CI"], cwd=folder, capture_output=True, check=False)
        return len(log.read_text()) if log.exists() else 0

    first = tmp_path / "a"
    first.mkdir()
    (first / "m.py").write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x * 2\n")
    runs_first = run(first)
    res = mutation.read_cache(first / ".mutmut-cache")
    assert res["killed"] >= 2 and res["untested"] == 0 and runs_first >= res["killed"] + 1

    second = tmp_path / "b"
    second.mkdir()
    shutil.copy(first / "m.py", second / "m.py")
    assert run(second, first / ".mutmut-cache") <= 1          # the baseline run at most
    assert mutation.read_cache(second / ".mutmut-cache")["killed"] == res["killed"]

    third = tmp_path / "c"
    third.mkdir()
    (third / "m.py").write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + x\n")
    runs_third = run(third, first / ".mutmut-cache")
    assert 1 <= runs_third < runs_first                       # the new line's mutants only


def test_mutation_verdicts_saved_to_the_state_file_resume_on_another_machine(tmp_path):
    """`ratchet.mutation save` writes a run's verdicts to a committed JSON file and `resume` builds
    a new machine's cache from it: mutmut, run for real, runs none of the saved mutants again, a
    moved line keeps its verdicts, a changed line gets its mutants run, and other files' saved
    verdicts are kept by a later save."""
    import json
    import shutil
    import subprocess
    import sys

    from ratchet import mutation

    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        pytest.skip("mutmut is in the dev extra: pip install -e '.[dev]'")
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"format": 1, "files": {"other.py": [[0, "x = 1", 0, "ok_killed", "h"]]}}))

    def run(folder: Path, resume: bool) -> int:
        if resume:  # a process each, as `make mutation` runs it (mutmut's ORM binds once a process)
            subprocess.run([sys.executable, "-m", "ratchet.mutation", "resume", "--state", str(state),
                            "--out", str(folder / ".mutmut-cache"), "--paths", "m.py", "--root", str(folder)], check=True)
        log = folder / "runs.log"
        runner = f"{sys.executable} -c \"open('runs.log','a').write('x');import m;assert m.f(1)==2 and m.f(5)==6 and m.g(3)==6\""
        subprocess.run([str(mutmut), "run", "--paths-to-mutate", "m.py", "--runner", runner, "--tests-dir", ".",
                        "--simple-output", "--no-progress", "--CI"], cwd=folder, capture_output=True, check=False)
        return len(log.read_text()) if log.exists() else 0

    src = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x * 2\n"
    first = tmp_path / "a"
    first.mkdir()
    (first / "m.py").write_text(src)
    runs_first = run(first, resume=False)
    killed = mutation.read_cache(first / ".mutmut-cache")["killed"]
    assert killed >= 2
    assert mutation.main(["save", "--cache", str(first / ".mutmut-cache"), "--state", str(state)]) == 0
    saved = json.loads(state.read_text())["files"]
    assert len(saved["m.py"]) == killed and saved["other.py"] == [[0, "x = 1", 0, "ok_killed", "h"]]

    second = tmp_path / "b"
    second.mkdir()
    (second / "m.py").write_text("# moved down a line\n" + src)
    assert run(second, resume=True) <= 1                      # the baseline run at most
    assert mutation.read_cache(second / ".mutmut-cache")["killed"] == killed

    third = tmp_path / "c"
    third.mkdir()
    (third / "m.py").write_text(src.replace("x * 2", "x + x"))
    runs_third = run(third, resume=True)
    assert 1 <= runs_third < runs_first                       # the changed line's mutants only
    shutil.rmtree(first)


def test_a_survivor_judged_equivalent_is_not_run_again_when_the_tests_change(tmp_path):
    """mutmut runs every survivor again once its tests change; one judged equivalent cannot be
    killed, and one of `ingest()` costs every ingest test. `resume --judged` marks it tested against
    the tests as they are; the other survivors run again, and a judgment whose mutant changed
    (stale) holds nothing back."""
    import json
    import subprocess
    import sys

    from ratchet import mutation

    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        pytest.skip("mutmut is in the dev extra: pip install -e '.[dev]'")
    src = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x * 2\n"
    runner = f"{sys.executable} -c \"open('runs.log','a').write('x');import m;assert m.f(1)==2\""

    def run(folder: Path, test_text: str, judged: Path | None = None, source: str = src) -> int:
        folder.mkdir()
        (folder / "m.py").write_text(source)
        (folder / "tests").mkdir()
        (folder / "tests" / "test_m.py").write_text(test_text)
        if state.exists():
            cmd = [sys.executable, "-m", "ratchet.mutation", "resume", "--state", str(state),
                   "--out", str(folder / ".mutmut-cache"), "--paths", "m.py", "--root", str(folder)]
            if judged is not None:
                cmd += ["--judged", str(judged), "--tests-dir", "tests"]
            subprocess.run(cmd, check=True)
        subprocess.run([str(mutmut), "run", "--paths-to-mutate", "m.py", "--runner", runner, "--tests-dir", "tests",
                        "--simple-output", "--no-progress", "--CI"], cwd=folder, capture_output=True, check=False)
        log = folder / "runs.log"
        return len(log.read_text()) if log.exists() else 0

    state, judged = tmp_path / "state.json", tmp_path / "equivalent.json"
    run(tmp_path / "a", "# v1\n")
    first = mutation.read_cache(tmp_path / "a" / ".mutmut-cache")
    on_g = sorted((m for m in first["survivors"] if m["line"] == 6), key=lambda m: m["index"])
    assert len(on_g) == 2                                   # `x * 2`: the operator and the constant
    mutation.main(["save", "--cache", str(tmp_path / "a" / ".mutmut-cache"), "--state", str(state)])
    mutation.judge(tmp_path / "a" / ".mutmut-cache", [on_g[0]["id"]], tmp_path / "a", "planted for the test", judged)
    assert [e["index"] for e in json.loads(judged.read_text())["mutants"]] == [on_g[0]["index"]]

    # the tests changed: without --judged both survivors of g run again, with it only the other one
    runs_all = run(tmp_path / "b", "# v2\n")
    runs_judged = run(tmp_path / "c", "# v2\n", judged)
    assert runs_all - runs_judged == 1, (runs_all, runs_judged)
    held = mutation.read_cache(tmp_path / "c" / ".mutmut-cache")
    assert sorted(m["index"] for m in held["survivors"] if m["line"] == 6) == [0, 1]
    # a judgment that no longer describes its mutant holds nothing back
    stale = json.loads(judged.read_text())
    stale["mutants"][0]["mutant"] = "return x ** 2"
    judged.write_text(json.dumps(stale))
    assert run(tmp_path / "d", "# v2\n", judged) == runs_all


def test_a_module_level_mutant_runs_the_tests_that_name_what_its_line_defines(tmp_path, monkeypatch):
    """Mutation test selection: a mutant inside a function runs the tests that called it; a
    mutant of a module-level constant also runs every test in a file naming the constant (a test
    that runs a query string reads it without calling anything of its file), and the whole runner
    when nothing else selects a test."""
    from ratchet import mutation

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_q.py").write_text("from m import QUERY\n\ndef test_q():\n    assert QUERY\n")
    (tmp_path / "tests" / "test_f.py").write_text("from m import f\n\ndef test_f():\n    assert f() == 1\n")
    (tmp_path / "tests" / "test_other.py").write_text("def test_other():\n    assert QUERY_TWO\n")
    source = 'QUERY = "SELECT 1"\nLIMIT: int = 3\n\n\ndef f():\n    return 1\n\n\nclass C:\n    size: int = 4\n'
    mapping = {"files": {"m.py": {"5:f": ["tests/test_f.py::test_f"]}},
               "tests": {"tests/test_q.py::test_q": 0.2, "tests/test_f.py::test_f": 0.1, "tests/test_other.py::test_other": 0.3}}
    assert mutation.select_tests(mapping, "m.py", 6, source) == ["tests/test_f.py::test_f"]
    assert mutation.select_tests(mapping, "m.py", 1, source) == ["tests/test_f.py::test_f", "tests/test_q.py::test_q"]
    assert mutation.select_tests(mapping, "m.py", 2, source) == ["tests/test_f.py::test_f"]  # no test names LIMIT
    assert mutation._names_defined_at(source, 10) == {"C", "size"}
    # a module no test calls into and no test names: its constants' mutants run the whole runner
    assert mutation.select_tests(mapping, "schemas.py", 1, "SCHEMAS = {'t': 1}\n") is None
    assert mutation.select_tests(mapping, "schemas.py", 2, "X = 1\n\n\ndef g():\n    return 2\n") is None
    assert mutation.select_tests(mapping, "schemas.py", 5, "X = 1\n\n\ndef g():\n    return 2\n") == []


def test_a_mutant_runs_only_the_tests_that_ran_its_statement(tmp_path):
    """`ratchet.mutation map`, run for real on a small project: a mutant of a branch runs the test
    that took it, not every test of its function; a statement written over two lines is one
    statement (the tracer sees no line whose constant folded into the line above); a line run in a spawned pool worker counts for the test that started it."""
    import json

    from ratchet import mutation

    source = ("def f(x):\n"
              "    if x > 0:\n"
              "        return x + 1\n"
              "    return (x\n"
              "            - 1)\n"
              "\n"
              "\n"
              "def g(n):\n"
              "    return [i for i in range(n)]\n"
              "\n"
              "\n"
              "def h(x):\n"
              "    return x in (1,\n"
              "                 2)\n")
    (tmp_path / "m.py").write_text(source)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_pos.py").write_text("from m import f\n\ndef test_pos():\n    assert f(1) == 2\n")
    (tmp_path / "tests" / "test_neg.py").write_text("from m import f, h\n\ndef test_neg():\n    assert f(-1) == -2 and h(2)\n")
    (tmp_path / "tests" / "test_pool.py").write_text(
        "import multiprocessing as mp\nfrom concurrent.futures import ProcessPoolExecutor\nimport m\n\n"
        "def test_pool():\n"
        "    with ProcessPoolExecutor(1, mp_context=mp.get_context('spawn')) as ex:\n"
        "        assert ex.submit(m.g, 3).result() == [0, 1, 2]\n")
    mapping = mutation.build_map(["m.py"], ["-q", "-p", "no:cacheprovider", "tests"], tmp_path / "map.json", tmp_path)
    assert json.loads((tmp_path / "map.json").read_text()) == mapping
    pos, neg, pool = "tests/test_pos.py::test_pos", "tests/test_neg.py::test_neg", "tests/test_pool.py::test_pool"
    assert mutation.select_tests(mapping, "m.py", 3, source) == [pos]
    assert mutation.select_tests(mapping, "m.py", 5, source) == [neg]      # the second line of `return (x - 1)`
    assert sorted(mutation.select_tests(mapping, "m.py", 2, source)) == sorted([pos, neg])
    assert mutation.select_tests(mapping, "m.py", 9, source) == [pool]
    assert mutation.select_tests(mapping, "m.py", 14, source) == [neg]     # folded into line 13's constant
    # a map of calls only (no line data) selects by function, as before
    calls_only = {k: v for k, v in mapping.items() if k not in ("lines", "test_ids")}
    assert sorted(mutation.select_tests(calls_only, "m.py", 3, source)) == sorted([pos, neg])


def test_a_test_that_exhausts_the_stack_does_not_end_the_mapping_of_later_tests(tmp_path):
    """CPython drops a trace function that fails (a RecursionError raised while calling it): one
    test of code nested too deep left every later test of the run unmapped, and their mutants
    survived without a test run. The tracer is armed again before each test and when a thread
    ends, and the test that lost it (its later lines unseen) is run for every mutant of a
    function body."""
    from ratchet import mutation

    source = ("def f(x):\n    return x + 1\n\n\ndef deep(n):\n    return deep(n + 1)\n\n\n"
              "def after():\n    return 5\n\n\nLIMIT = 3\n")
    (tmp_path / "m.py").write_text(source)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a_deep.py").write_text(
        "import pytest\nfrom m import after, deep\n\ndef test_deep():\n"
        "    with pytest.raises(RecursionError):\n        deep(0)\n    assert after() == 5\n")
    (tmp_path / "tests" / "test_a_thread.py").write_text(   # the same in a worker thread
        "import pytest, threading\nfrom m import after, deep\n\ndef test_thread():\n"
        "    def work():\n        with pytest.raises(RecursionError):\n            deep(0)\n        after()\n"
        "    t = threading.Thread(target=work)\n    t.start()\n    t.join()\n")
    (tmp_path / "tests" / "test_b_later.py").write_text("from m import f\n\ndef test_later():\n    assert f(1) == 2\n")
    mapping = mutation.build_map(["m.py"], ["-q", "-p", "no:cacheprovider", "tests"], tmp_path / "map.json", tmp_path)
    deep, later = "tests/test_a_deep.py::test_deep", "tests/test_b_later.py::test_later"
    thread = "tests/test_a_thread.py::test_thread"
    assert mapping["untraced"] == [deep, thread]
    assert sorted(mutation.select_tests(mapping, "m.py", 2, source)) == sorted([deep, thread, later])
    assert sorted(mutation.select_tests(mapping, "m.py", 10, source)) == [deep, thread]   # after the loss
    assert sorted(mutation.select_tests(mapping, "m.py", 13, source)) == sorted([deep, thread, later])  # module level


def test_show_prints_a_mutants_diff_from_the_unmutated_copy_and_never_writes_the_cache(tmp_path):
    """`mutmut show` during a run re-aligned the cache with the file holding the mutant under test,
    and the run stopped; `ratchet.mutation show` reads the cache only, and the file from --root."""
    import hashlib

    from ratchet import mutation

    root = tmp_path / "repo"
    cache = _pkg_run(root, "def f(x):\n    return x + 1\n", tmp_path / ".mutmut-cache",
                     "(1, 1, 'def f(x):', 0), (2, 1, '    return x + 1', 1)", "(1, 2, 0, 'h', 'bad_survived')")
    before = hashlib.sha256(cache.read_bytes()).hexdigest()
    out = mutation.show_mutant(cache, 1, root)
    assert out.startswith("# mutant 1: bad_survived")
    assert "-    return x + 1\n+    return x - 1" in out
    assert hashlib.sha256(cache.read_bytes()).hexdigest() == before
    assert mutation.main(["show", "--cache", str(cache), "--root", str(root), "1"]) == 0
    # the file changed since the run (here: the mutant is on disk): refused, never a wrong diff
    (root / "pkg" / "m.py").write_text("def f(x):\n    return x - 1\n")
    with pytest.raises(ValueError, match="has changed since the run"):
        mutation.show_mutant(cache, 1, root)
    with pytest.raises(ValueError, match="no mutant 7"):
        mutation.show_mutant(cache, 7, root)
    assert mutation.main(["show", "--cache", str(cache), "--root", str(root), "1"]) == 2


def test_a_survivor_judged_equivalent_is_listed_with_its_reason_and_a_changed_line_drops_the_judgment(tmp_path):
    """`judge` writes a survivor down as equivalent with the reason; the results page then lists it
    apart from the survivors that still need a test. A judgment is keyed by the line's text and the
    mutant's index and keeps the mutated line: once the code changes it is reported stale and the
    survivor is open again."""
    from ratchet import mutation

    root = tmp_path / "repo"
    src = "BUF = 4096\n\ndef f(x):\n    return x + 1\n\ndef g():\n    return 0\n\ndef h():\n    return 0\n"
    cache = _pkg_run(root, src, tmp_path / ".mutmut-cache",
                     "(1, 1, 'BUF = 4096', 0), (2, 1, '    return x + 1', 3), (3, 1, '    return 0', 6), "
                     "(4, 1, '    return 0', 9)",
                     "(1, 1, 0, 'h', 'bad_survived'), (2, 2, 0, 'h', 'bad_survived'), (3, 2, 1, 'h', 'ok_killed'), "
                     "(4, 3, 0, 'h', 'bad_survived'), (5, 4, 0, 'h', 'bad_survived')")
    judged = root / mutation.JUDGED_FILE
    assert mutation.main(["judge", "--cache", str(cache), "--root", str(root), "--file", str(judged), "--why",
                          "a buffer size: any value reads the same bytes", "1"]) == 0
    entries = mutation.load_judged(judged)
    assert entries == [{"file": "pkg/m.py", "line": "BUF = 4096", "index": 0, "mutant": "BUF = 4097",
                        "why": "a buffer size: any value reads the same bytes"}]
    # judging again adds nothing; a killed mutant, an unknown id or no reason are refused
    assert mutation.main(["judge", "--cache", str(cache), "--root", str(root), "--file", str(judged), "--why", "x", "1"]) == 0
    assert len(mutation.load_judged(judged)) == 1
    for bad in (["--why", "x", "3"], ["--why", "x", "9"], ["--why", " ", "2"]):
        assert mutation.main(["judge", "--cache", str(cache), "--root", str(root), "--file", str(judged), *bad]) == 2
    assert len(mutation.load_judged(judged)) == 1
    # a line whose text is on several lines is judged at its own number only
    assert mutation.main(["judge", "--cache", str(cache), "--root", str(root), "--file", str(judged), "--why",
                          "g's value is never read", "4"]) == 0
    assert [e for e in mutation.load_judged(judged) if e.get("at")] == [{"file": "pkg/m.py", "line": "    return 0", "index": 0, "at": 7,
                                               "mutant": "return 1", "why": "g's value is never read"}]
    assert mutation.stale_judgments(judged, root) == []

    out = tmp_path / "r"
    assert mutation.main(["--cache", str(cache), "--label", "pkg", "--results-dir", str(out), "--root", str(root)]) == 0
    rec = json.loads((out / "mutation.jsonl").read_text().splitlines()[-1])["result"]
    assert (rec["survived"], rec["equivalent"], rec["open"]) == (4, 2, 2)
    assert "Surviving mutants" not in (out / "README.md").read_text()   # the lists have their own page
    assert "[mutation.md](mutation.md)" in (out / "README.md").read_text()
    page = (out / "mutation.md").read_text()
    assert page.startswith("# Mutation testing") and "[the results page](README.md#mutation)" in page
    open_part, judged_part = page.split("Surviving mutants judged equivalent")
    assert "- 2: `pkg/m.py:4` `return x + 1`" in open_part.split("each needs a test")[1]
    assert "- 5: `pkg/m.py:10` `return 0`" in open_part.split("each needs a test")[1]
    assert "- g's value is never read: `m.py:7`" in judged_part
    assert "- a buffer size: any value reads the same bytes: `m.py:1`" in judged_part
    assert "BUF" not in open_part.split("each needs a test")[1]
    from ratchet import results
    assert results.stale(out) == []
    (out / "mutation.md").write_text(page + "edited by hand\n")    # a generated page: --check says so
    assert results.stale(out) == [str(out / "mutation.md")]

    # the line changes: the judgment is stale and no longer applies
    (root / "pkg" / "m.py").write_text("\n" + src.replace("4096", "8192"))
    assert sorted(mutation.stale_judgments(judged, root)) == ["pkg/m.py: the line 'BUF = 4096' is gone",
                                                              "pkg/m.py: the line 'return 0' is gone from line 7"]


def test_a_survivor_no_test_runs_is_marked_from_the_runs_test_map(tmp_path):
    """The run's test map (beside its cache) says which lines the tests ran: a survivor on a line
    none ran is marked `no_test` on the page (a hole in what is run, not in what is checked)."""
    from ratchet import mutation

    run = tmp_path / "mutation"
    cache = _pkg_run(run, "def f(x):\n    return x + 1\n\ndef g():\n    return 0\n", run / ".mutmut-cache",
                     "(1, 1, '    return x + 1', 1), (2, 1, '    return 0', 4)",
                     "(1, 1, 0, 'h', 'bad_survived'), (2, 2, 0, 'h', 'bad_survived')")
    res = mutation.read_cache(cache)
    assert mutation.mark_unrun(res, [cache])["no_test"] == 0            # no map: nothing is claimed
    (run / ".mutmap-pkg.json").write_text(json.dumps({
        "files": {"pkg/m.py": {"f": ["tests/test_m.py::test_f"]}}, "lines": {"pkg/m.py": {"1": [0], "2": [0]}},
        "test_ids": ["tests/test_m.py::test_f"], "tests": {"tests/test_m.py::test_f": 0.1}, "pytest": []}))
    res = mutation.mark_unrun(mutation.read_cache(cache), [cache])
    assert res["no_test"] == 1 and [bool(m.get("no_test")) for m in res["survivors"]] == [False, True]
    out = tmp_path / "r"
    assert mutation.main(["--cache", str(cache), "--label", "pkg", "--results-dir", str(out), "--root", str(tmp_path)]) == 0
    page = (out / "mutation.md").read_text()
    assert "- 1: `pkg/m.py:2` `return x + 1`\n" in page and "- 2: `pkg/m.py:5` `return 0` (no test runs this line)" in page


def test_every_committed_equivalence_judgment_still_describes_the_code():
    """A judgment whose line changed would no longer apply to any survivor: re-judge it with
    `python -m ratchet.mutation judge` after the next run, or delete its entry."""
    from ratchet import mutation

    assert mutation.stale_judgments(ROOT / mutation.JUDGED_FILE, ROOT) == []


def test_judged_survivors_are_listed_once_a_reason_with_their_lines_by_file_and_a_long_reason_cut():
    """The page stays under its size limit as judgments accumulate: one line a reason, its lines
    grouped by file, a reason longer than MAX_REASON cut at a word (the judgments file keeps it)."""
    from ratchet.results import MAX_REASON, _mutation_detail

    long_why = "a reason " + "that goes on " * 20
    surv = [{"id": i, "file": f, "line": ln, "code": "x", "equivalent": why} for i, (f, ln, why) in enumerate([
        ("pkg/a.py", 3, "short"), ("pkg/a.py", 9, "short"), ("pkg/b.py", 2, "short"), ("pkg/a.py", 3, "short"),
        ("pkg/a.py", 5, long_why)])]
    page = "\n".join(_mutation_detail({"files": {}, "survivors": surv}))
    assert "- short: `a.py:3,9`, `b.py:2`" in page
    cut = [ln for ln in page.splitlines() if ln.startswith("- a reason")][0]
    assert cut.endswith(" …: `a.py:5`") and len(cut.split(" …:")[0]) <= MAX_REASON + 2 and long_why.startswith(cut[2:-12])
