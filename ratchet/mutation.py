"""Mutation-testing results into the results page: what `make mutation` ran and which mutants the
tests did not kill.

mutmut keeps every mutant's status in its cache (`.mutmut-cache`, SQLite: SourceFile -> Line ->
Mutant); this reads it directly rather than parsing `mutmut results`' text, and appends one line
to docs/results/mutation.jsonl (the same record shape as a bench's, so `ratchet results` renders
it: counts per file and every survivor with its source line).

    .venv/bin/python -m ratchet.mutation --cache DIR/.mutmut-cache --label governance [--tests "..."] [--wall-s S]

(`--cache` again for each further copy when files were mutated in several copies at once.)

`map` (run by `make mutation` in the mutation copy) records which tests call each function and run
each line, so a mutant runs those tests, not its whole folder (see `pre_mutation`):

    .venv/bin/python -m ratchet.mutation map --paths ratchet/governance/ --runner "python -m pytest tests/governance" --out MAP
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from datetime import datetime, timezone
from pathlib import Path

KILLED = {"ok_killed"}
SURVIVED = {"bad_survived"}
# mutmut's other statuses: bad_timeout (the tests hung: counted apart), ok_suspicious (slow but
# killed), skipped (annotation-only: `pre_mutation`), untested (the run stopped before them).


def read_cache(path: Path) -> dict:
    """Counts per file and the surviving mutants (file, line number, source line, mutmut id)."""
    if not path.exists():
        raise FileNotFoundError(f"no mutmut cache at {path}: run `make mutation` first")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute("""SELECT m.id, m.status, l.line_number, l.line, f.filename, m."index"
                              FROM Mutant m JOIN Line l ON m.line = l.id JOIN SourceFile f ON l.sourcefile = f.id
                              ORDER BY f.filename, l.line_number, m.id""").fetchall()
    finally:
        con.close()
    files: dict[str, dict] = {}
    survivors = []
    for mid, status, line_no, line, filename, index in rows:
        f = files.setdefault(filename, {"mutants": 0, "killed": 0, "survived": 0, "timeout": 0, "skipped": 0,
                                        "untested": 0})
        f["mutants"] += 1
        if status in KILLED or status == "ok_suspicious":
            f["killed"] += 1
        elif status in SURVIVED:
            f["survived"] += 1
            survivors.append({"id": mid, "file": filename, "line": line_no + 1, "code": line.strip()[:160],
                              "index": index, "text": line})
        elif status == "bad_timeout":
            f["timeout"] += 1
        elif status == "skipped":
            f["skipped"] += 1
        else:
            f["untested"] += 1
    return _result(files, survivors)


def _result(files: dict, survivors: list) -> dict:
    """The record: totals over the files; the ratio is killed over the mutants a test could judge
    (not the skipped, annotation-only ones, nor those the run did not reach)."""
    total = {k: sum(f.get(k, 0) for f in files.values())
             for k in ("mutants", "killed", "survived", "timeout", "skipped", "untested")}
    tested = total["mutants"] - total["untested"] - total["skipped"]
    return {"bench": "mutation", **total, "files": files, "survivors": survivors,
            "baseline": "every mutant killed", "ratio": round(total["killed"] / tested, 4) if tested else None}



PRAGMA = "# pragma:"


def exempt_lines(files, root: Path) -> list[dict]:
    """The lines of the mutated files that mutmut leaves alone (`# pragma: no mutate`), each with
    the reason written after the pragma, so that a record lists every exemption: a line is exempt
    only where no value of it can change what the code returns (a batch size, a buffer)."""
    out = []
    for f in sorted(files):
        p = root / f
        if not p.is_file():
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            code, sep, rest = line.partition(PRAGMA)
            if sep and "no mutate" in rest:
                why = rest.split("no mutate", 1)[1].strip(" :-()")
                out.append({"file": f, "line": n, "code": code.strip()[:160], "why": why or "(no reason given)"})
    return out


# --- test selection: each mutant runs only the tests that run the statement it sits in -----------
#
# `map` runs the target's tests once under a tracer (every process: spawn pool workers and threads
# too, through a sitecustomize on PYTHONPATH) and writes, for every function and every line of the
# mutated files, the tests that ran it. mutmut's `pre_mutation` hook (the `mutmut_config.py` the
# Makefile writes into the copy) then narrows each mutant's pytest command to the tests that ran its
# statement, fastest first (by function with a map of calls only). A mutant in a statement no test
# runs survives without a run: no test executes that code. By line, not by function: one function
# such as `ingest()` is called by every ingest test, and its survivors each cost all of them.
# Lines outside any function body (constants, defaults, decorators: run at import) get every test
# that called anything in the file and the tests that name what the line defines, or the target's
# whole runner where that finds none.

_SITECUSTOMIZE = r'''
import os, sys, threading
_out = os.environ.get("RATCHET_MUTMAP_OUT")
_cur = [os.environ.get("RATCHET_MUTMAP_TEST", "")]   # the running test; the plugin sets it in-process
if _out:
    _targets = set(os.environ["RATCHET_MUTMAP_TARGETS"].split(os.pathsep))
    _seen = set()
    _lines_seen = set()
    _file = open(os.path.join(_out, "calls-%d.tsv" % os.getpid()), "a", buffering=1)
    _lfile = open(os.path.join(_out, "lines-%d.tsv" % os.getpid()), "a", buffering=1)  # pool workers may be killed

    _known = {}

    def _line(frame, event, arg):
        if event == "line":
            key = (_cur[0], frame.f_code.co_filename, frame.f_lineno)
            if key not in _lines_seen:
                _lines_seen.add(key)
                _lfile.write("%s\t%s\t%d\n" % (key[0], os.path.abspath(key[1]), key[2]))
        return _line

    def _trace(frame, event, arg):
        co = frame.f_code
        hit = _known.get(co.co_filename)
        if hit is None:
            hit = _known[co.co_filename] = os.path.abspath(co.co_filename) in _targets
        if hit:
            key = (_cur[0], os.path.abspath(co.co_filename), co.co_firstlineno, co.co_name)
            if key not in _seen:
                _seen.add(key)
                _file.write("\t".join(map(str, key)) + "\n")
            return _line
        return None

    # CPython drops a trace function that raises (a RecursionError deep in a test's stack); the
    # test it happened in is written down (its later lines went unseen) and the tracer armed again:
    # before each test (the plugin), when a thread ends and when a process exits
    _ufile = open(os.path.join(_out, "untraced-%d.tsv" % os.getpid()), "a", buffering=1)

    def _check(test=None):
        if sys.gettrace() is not _trace:
            if test is None:
                test = _cur[0]
            if test:
                _ufile.write(test + "\n")
            sys.settrace(_trace)

    _thread_run = threading.Thread.run

    def _run(self):
        try:
            _thread_run(self)
        finally:
            _check()

    threading.Thread.run = _run
    import atexit
    atexit.register(_check)
    sys.settrace(_trace)
    threading.settrace(_trace)
'''

_PLUGIN = r'''
import os, time
durations = {}

def pytest_runtest_protocol(item, nextitem):
    import sitecustomize
    os.environ["RATCHET_MUTMAP_TEST"] = sitecustomize._cur[0] = item.nodeid.split("[", 1)[0]
    sitecustomize._check("")

def pytest_runtest_logreport(report):
    import sitecustomize
    key = report.nodeid.split("[", 1)[0]
    durations[key] = durations.get(key, 0.0) + report.duration
    sitecustomize._check(key)

def pytest_sessionfinish(session, exitstatus):
    import json
    with open(os.path.join(os.environ["RATCHET_MUTMAP_OUT"], "durations.json"), "w") as f:
        json.dump(durations, f)
'''


def build_map(paths: list[str], pytest_argv: list[str], out: Path, root: Path) -> dict:
    """Run `pytest_argv` (a pytest command line, without its interpreter) once under the call
    tracer and write the map: {"pytest": the command's options, "tests": {test: seconds},
    "files": {file: {"LINE:NAME": [tests]}}}. Fails if the tests fail: a mutant run would be
    meaningless."""
    import json
    import subprocess
    import tempfile

    files = []
    for p in paths:
        p = root / p
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    # a module's co_filename is the path it was imported by: the link's and the real one both count
    targets = {}
    for f in files:
        rel = str(f.relative_to(root))
        targets[os.path.abspath(f)] = targets[os.path.realpath(f)] = rel
    with tempfile.TemporaryDirectory(prefix="mutmap-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        (Path(tmp) / "_ratchet_mutmap.py").write_text(_PLUGIN)
        env = dict(os.environ, RATCHET_MUTMAP_OUT=tmp, RATCHET_MUTMAP_TARGETS=os.pathsep.join(targets),
                   PYTHONPATH=os.pathsep.join([tmp] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        cmd = [sys.executable, "-m", "pytest", "-p", "_ratchet_mutmap", *pytest_argv]
        rc = subprocess.run(cmd, cwd=root, env=env).returncode
        if rc != 0:
            raise RuntimeError(f"the target's tests fail before any mutation (exit {rc}): {' '.join(cmd)}")
        durations = json.loads((Path(tmp) / "durations.json").read_text())
        untraced = sorted({t for f in Path(tmp).glob("untraced-*.tsv") for t in f.read_text().splitlines() if t})
        calls: dict[str, dict[str, set]] = {}
        for tsv in Path(tmp).glob("calls-*.tsv"):
            for row in tsv.read_text().splitlines():
                test, filename, line, name = row.split("\t")
                if test:      # "" is import time (collection): covered by the file-level fallback
                    calls.setdefault(targets[filename], {}).setdefault(f"{line}:{name}", set()).add(test)
        order = sorted(durations)
        index = {t: i for i, t in enumerate(order)}
        lines: dict[str, dict[int, set]] = {}
        for tsv in Path(tmp).glob("lines-*.tsv"):
            for row in tsv.read_text().splitlines():
                test, filename, line = row.split("\t")
                if test in index and filename in targets:
                    lines.setdefault(targets[filename], {}).setdefault(int(line), set()).add(index[test])
    opts = _drop_test_paths(pytest_argv, root)
    mapping = {"pytest": opts, "tests": durations,
               "files": {f: {k: sorted(v) for k, v in funcs.items()} for f, funcs in calls.items()},
               # which tests ran each line (indices into test_ids): a mutant of a branch few tests
               # take runs those few, not every test of its function
               "test_ids": order,
               # tests whose tracer CPython dropped part way (stack exhausted): what they ran after
               # is unknown, so every mutant of a function body runs them too
               "untraced": untraced,
               "lines": {f: {str(n): sorted(v) for n, v in sorted(ls.items())} for f, ls in lines.items()}}
    out.write_text(json.dumps(mapping, indent=1, sort_keys=True))
    return mapping


def _drop_test_paths(argv: list[str], root: Path) -> list[str]:
    """The pytest options of a runner command line without its test paths and --ignore's."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--ignore":
            skip = True
        elif a.startswith("--ignore="):
            pass
        elif not a.startswith("-") and (root / a.split("::")[0]).exists() and (kept[-1:] != ["-m"]):
            pass
        else:
            kept.append(a)
    return kept


def _function_key(source: str, line: int) -> tuple[str | None, bool]:
    """The innermost function whose body holds 1-based `line`, as "FIRSTLINE:NAME" (the code
    object's first line is its first decorator's), or None at module level."""
    import ast

    best = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.body[0].lineno <= line <= node.end_lineno:
                if best is None or node.body[0].lineno >= best.body[0].lineno:
                    best = node
    if best is None:
        return None, False
    first = min([d.lineno for d in best.decorator_list] + [best.lineno])
    return f"{first}:{best.name}", True


def _statement_span(source: str, line: int) -> tuple[int, int]:
    """The lines of the innermost statement holding 1-based `line` (a compound statement's header
    only: `if`, `for`, `def` up to its body). A tracer sees the lines a statement's code runs on,
    which need not be the line mutmut mutated in a statement written over several lines."""
    import ast

    best = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            body = getattr(node, "body", None)
            last = body[0].lineno - 1 if isinstance(body, list) and body and hasattr(body[0], "lineno") else node.end_lineno
            if line <= last and (best is None or node.lineno >= best[0]):
                best = (node.lineno, max(last, node.lineno))
    return best or (line, line)


def _names_defined_at(source: str, line: int) -> set[str]:
    """The names a module- or class-level statement holding 1-based `line` binds (a constant, a
    dataclass field, a class): a test can read them without calling anything of the file."""
    import ast

    names: set[str] = set()

    def visit(body):
        for node in body:
            if not (node.lineno <= line <= (node.end_lineno or node.lineno)):
                continue
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
                visit(node.body)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
                    names.update(n.attr for n in ast.walk(t) if isinstance(n, ast.Attribute))

    visit(ast.parse(source).body)
    return names


_MAP_CACHE: dict = {}
_TEST_TEXT: dict[str, str] = {}


def _test_text(test_id: str) -> str:
    path = test_id.split("::")[0]
    if path not in _TEST_TEXT:
        try:
            _TEST_TEXT[path] = Path(path).read_text()
        except OSError:
            _TEST_TEXT[path] = ""
    return _TEST_TEXT[path]


def select_tests(mapping: dict, filename: str, line: int, source: str) -> list[str] | None:
    """The tests that can kill a mutant of `filename` at 1-based `line`, fastest first: [] when
    no test runs that code. A line outside any function gets every test that called something of
    the file, and every test in a test file that names what the line defines (a query string a
    test runs itself calls nothing of the file: a mutant of it survived unrun); None (the target's
    whole runner) when that finds none: a module only other modules read (a table of schemas
    read through a registry) is still imported by the tests, so its mutant must run them. A
    test whose tracer was dropped part way (the map's "untraced") joins every function body's."""
    import re

    funcs = mapping["files"].get(filename, {})
    key, in_function = _function_key(source, line)
    if in_function and filename in mapping.get("lines", {}):
        ran, ids = mapping["lines"][filename], mapping["test_ids"]
        first, last = _statement_span(source, line)
        tests = {ids[i] for n in range(first, last + 1) for i in ran.get(str(n), ())}
    elif in_function:
        tests = set(funcs.get(key, ()))
    else:
        tests = {t for ts in funcs.values() for t in ts}
        names = _names_defined_at(source, line)
        if names:
            named = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, names))) + r")\b")
            tests |= {t for t in mapping["tests"] if named.search(_test_text(t))}
        if not tests:
            return None
    if in_function:
        tests |= set(mapping.get("untraced", ()))
    return sorted(tests, key=lambda t: (mapping["tests"].get(t, 0.0), t))


def _without_annotations(tree) -> str | None:
    """The module's AST with every annotation blanked, or None when its annotations are evaluated
    (no `from __future__ import annotations`: `str & None` would then fail at import)."""
    import ast

    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
               for n in tree.body):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
        elif isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, ast.AnnAssign):
            node.annotation = ast.Constant(None)
    return ast.dump(tree)


def annotation_only(original: str, mutated: str) -> bool:
    """True when a mutant changes only type annotations of a module whose annotations are never
    evaluated: `str | None` -> `str & None` there changes nothing at run time, so no test can kill it."""
    import ast

    try:
        a, b = ast.parse(original), ast.parse(mutated)
    except SyntaxError:
        return False
    if ast.dump(a) == ast.dump(b):
        return False
    plain = _without_annotations(a)
    return plain is not None and plain == _without_annotations(b)


def pre_mutation(context) -> None:
    """mutmut's hook (mutmut_config.py): skip a mutant that changes only an unevaluated annotation
    (mutmut records it `skipped`), and narrow the mutant's test command to the tests that run its
    statement; with no RATCHET_MUTMAP set the target's whole runner runs, as before."""
    import json
    import shlex

    from mutmut import Context, mutate

    source = Path(context.filename).read_text()
    mutated, _ = mutate(Context(source=source, mutation_id=context.mutation_id, filename=context.filename,
                                dict_synonyms=context.dict_synonyms))
    if annotation_only(source, mutated):
        context.skip = True
        return
    path = os.environ.get("RATCHET_MUTMAP")
    if not path:
        return
    if path not in _MAP_CACHE:
        _MAP_CACHE[path] = json.loads(Path(path).read_text())
    mapping = _MAP_CACHE[path]
    tests = select_tests(mapping, context.filename, context.current_line_index + 1, source)
    if tests is None:
        return                                 # the target's whole runner
    if not tests:
        context.config.test_command = "true"   # no test executes this line: it survives as is
        return
    pytest = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "pytest", *mapping["pytest"], *tests])
    # pytest exits 2 when a mutant breaks collection (an import error): mutmut reads only 1 as killed
    context.config.test_command = f"sh -c {shlex.quote(pytest + ' || exit 1')}"


def map_main(argv: list[str]) -> int:
    import shlex

    ap = argparse.ArgumentParser(prog="ratchet.mutation map",
                                 description="which tests call each function of the mutated files")
    ap.add_argument("--paths", required=True, help="mutmut's --paths-to-mutate (comma-separated)")
    ap.add_argument("--runner", required=True, help="the target's pytest command (mutmut's --runner)")
    ap.add_argument("--out", required=True, help="the map to write (JSON)")
    a = ap.parse_args(argv)
    runner = shlex.split(a.runner)
    if "pytest" not in runner:
        print("ratchet.mutation map: the runner must be a pytest command", file=sys.stderr)
        return 2
    root = Path.cwd()
    try:
        m = build_map([p for p in a.paths.split(",") if p], runner[runner.index("pytest") + 1:], Path(a.out), root)
    except RuntimeError as e:
        print(f"ratchet.mutation map: {e}", file=sys.stderr)
        return 1
    funcs = sum(len(v) for v in m["files"].values())
    lines = sum(len(v) for v in m["lines"].values())
    print(f"mutation map: {len(m['tests'])} tests, {funcs} functions called, {lines} lines run -> {a.out}", file=sys.stderr)
    return 0


def merge_caches(paths: list[Path]) -> dict:
    """One result from several caches (copies that mutated different files at once). A file in
    more than one comes from the cache that tested most of its mutants; survivors then name their
    cache's folder, where `ratchet.mutation show` prints them (ids repeat across caches)."""
    if len(paths) == 1:
        return read_cache(paths[0])
    parts = [(p, read_cache(p)) for p in paths]
    files, survivors = {}, []
    for f in sorted({f for _, r in parts for f in r["files"]}):
        p, r = max(((p, r) for p, r in parts if f in r["files"]),
                   key=lambda pr: pr[1]["files"][f]["mutants"] - pr[1]["files"][f]["untested"])
        files[f] = r["files"][f]
        survivors += [{**m, "dir": str(p.parent)} for m in r["survivors"] if m["file"] == f]
    return _result(files, survivors)


def _best_caches(paths: list[Path]) -> dict[str, tuple[int, Path]]:
    """Per mutated file, (mutants tested, the cache that tested most of them)."""
    best: dict[str, tuple[int, Path]] = {}
    for p in paths:
        for f, c in read_cache(p)["files"].items():
            tested = c["mutants"] - c["untested"]
            if f not in best or tested > best[f][0]:
                best[f] = (tested, p)
    return best


def seed_cache(paths: list[Path], out: Path) -> dict:
    """A cache for a new run that keeps earlier verdicts: every file's mutants from the cache that
    tested most of them (one version of a file, as in `merge_caches`). mutmut matches them by file,
    line text and index, so a killed mutant is not run again while a changed line gets new
    mutants; a survivor is run again whenever the tests changed (mutmut hashes the tests folder)."""
    best = _best_caches(paths)
    out.unlink(missing_ok=True)
    con = sqlite3.connect(out)
    try:
        src = sqlite3.connect(f"file:{paths[0]}?mode=ro", uri=True)
        for (sql,) in src.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"):
            con.execute(sql)
        src.close()
        # mutmut drops a cache whose schema version it does not find; the baseline time it keeps
        # only while the tests' hash matches
        con.execute("ATTACH ? AS old", (str(paths[0]),))
        con.execute("INSERT INTO MiscData SELECT * FROM old.MiscData")
        con.commit()
        con.execute("DETACH old")
        kept = 0
        for f, (_, p) in sorted(best.items()):
            con.execute("ATTACH ? AS old", (str(p),))
            fid_old, h = con.execute("SELECT id, hash FROM old.SourceFile WHERE filename = ?", (f,)).fetchone()
            fid = con.execute("INSERT INTO SourceFile (filename, hash) VALUES (?, ?)", (f, h)).lastrowid
            for lid_old, text, num in con.execute("SELECT id, line, line_number FROM old.Line WHERE sourcefile = ?",
                                                  (fid_old,)).fetchall():
                lid = con.execute("INSERT INTO Line (sourcefile, line, line_number) VALUES (?, ?, ?)",
                                  (fid, text, num)).lastrowid
                kept += con.execute('INSERT INTO Mutant (line, "index", tested_against_hash, status) '
                                    'SELECT ?, "index", tested_against_hash, status FROM old.Mutant WHERE line = ?',
                                    (lid, lid_old)).rowcount
            con.commit()
            con.execute("DETACH old")
    finally:
        con.close()
    return {"files": len(best), "mutants": kept}


# --- verdicts kept in the repository: a run that takes longer than one machine's life ------------
#
# A full run over governance and ingest is hours of pytest on two cores, and the machine may be
# gone before it ends, its cache with it. `save` writes every tested mutant's
# verdict to a JSON file that is committed (file, line number, line text, index, status, the
# tests' hash it was tested against); `resume` turns that file into a new cache. mutmut matches a
# verdict by file, line text and index, as its own cache does: a killed mutant of an unchanged
# line is not run again, a survivor is run again when its tests changed.

STATE_FILE = "docs/results/mutation-state.json"


def save_state(caches: list[Path], state: Path) -> dict:
    """Merge the verdicts of `caches` into `state`: a file found in the caches replaces its earlier
    entries (from the cache that tested most of its mutants); other files' entries are kept."""
    import json

    old = json.loads(state.read_text()) if state.exists() else {"files": {}}
    best = _best_caches(caches)
    files = dict(old.get("files", {}))
    for f, (_, p) in best.items():
        con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            rows = con.execute("""SELECT l.line_number, l.line, m."index", m.status, m.tested_against_hash
                                  FROM Mutant m JOIN Line l ON m.line = l.id JOIN SourceFile s ON l.sourcefile = s.id
                                  WHERE s.filename = ? AND m.status != 'untested'
                                  ORDER BY l.line_number, 3""", (f,)).fetchall()
        finally:
            con.close()
        files[f] = [list(r) for r in rows]
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(_state_json(files))
    return {"files": len(best), "verdicts": sum(len(files[f]) for f in best)}


def _state_json(files: dict) -> str:
    """The state file's text: JSON with one verdict a line (diffs show what changed)."""
    import json

    parts = [json.dumps(f) + ": [" + ",".join("\n" + json.dumps(e) for e in es) + ("\n]" if es else "]")
             for f, es in sorted(files.items())]
    return '{"format": 1, "files": {\n' + ",\n".join(parts) + "\n}}\n"


def resume_cache(state: Path, out: Path, paths: list[str], root: Path, judged: Path | None = None,
                 tests_dirs: list[str] | None = None) -> dict:
    """A new mutmut cache at `out` holding the verdicts of `state` for the files under `paths`
    (mutmut's --paths-to-mutate, relative to `root`, where the files are read). A verdict whose
    line is no longer in its file (or is there more than once, none at its old number) is dropped:
    that mutant is run again. mutmut's ORM binds to one file a process: one call a process.

    mutmut runs a survivor again whenever its tests changed. A survivor judged equivalent in
    `judged` (the judgment still describing the code) is marked tested against the tests of
    `tests_dirs[i]`, the i-th group of `paths`, as they are now: no test can kill it, and one
    such survivor of `ingest()` costs every ingest test (minutes)."""
    import json

    from mutmut import cache as mc
    from pony.orm import db_session

    data = json.loads(state.read_text()) if state.exists() else {"files": {}}
    groups = [[p.strip().rstrip("/") for p in group.split(",") if p.strip()] for group in paths]
    prefixes = [p for g in groups for p in g]
    hashes: dict[str, str] = {}   # a prefix -> the hash of its group's tests, as mutmut computes it
    if judged is not None and tests_dirs:
        if len(tests_dirs) != len(groups):
            raise ValueError(f"{len(tests_dirs)} --tests-dir for {len(groups)} --paths: give one each")
        for g, d in zip(groups, tests_dirs):
            h = mc.hash_of_tests([str(root / d)] if not os.path.isabs(d) else [d])
            hashes.update((p, h) for p in g)
    # (file, line text, index, 0-based line number) of each judgment that still describes the code
    equivalent = {(e["file"], e["line"], e["index"], num) for e, num, why in check_judgments(judged, root) if not why} \
        if judged is not None else set()
    out.unlink(missing_ok=True)
    mc.db.bind(provider="sqlite", filename=str(out.resolve()), create_db=True)
    mc.db.generate_mapping(create_tables=True)
    kept = dropped = held = 0
    with db_session:
        mc.MiscData(key="version", value=str(mc.current_db_version))
        for f, entries in sorted(data["files"].items()):
            if not any(f == p or f.startswith(p + "/") for p in prefixes) or not (root / f).exists():
                continue
            lines = [x.rstrip("\n") for x in (root / f).read_text().splitlines(keepends=True)]
            # every line, as mutmut's own first pass writes them: it then finds nothing to re-align
            src = mc.SourceFile(filename=f)
            objs = [mc.Line(sourcefile=src, line=text, line_number=i) for i, text in enumerate(lines)]
            at: dict[str, list[int]] = {}
            for i, text in enumerate(lines):
                at.setdefault(text, []).append(i)
            h = next((hashes[p] for p in prefixes if p in hashes and (f == p or f.startswith(p + "/"))), None)
            for num, text, index, status, tests_hash in entries:
                if not (0 <= num < len(lines) and lines[num] == text):
                    num = at[text][0] if len(at.get(text, ())) == 1 else None
                if num is None:
                    dropped += 1
                    continue
                if status == "bad_survived" and h and (f, text, index, num) in equivalent:
                    tests_hash = h
                    held += 1
                mc.Mutant(line=objs[num], index=index, status=status, tested_against_hash=tests_hash or "")
                kept += 1
    return {"verdicts": kept, "dropped": dropped, "equivalent": held}


def show_mutant(cache: Path, mutant_id: int, root: Path) -> str:
    """The diff of one mutant, read from `cache` without writing to it and applied to the unmutated
    file under `root`. `mutmut show` instead re-aligns the cache with the file it reads: during a
    run that file holds the mutant being tested, so the cache kept the mutated line and the run
    stopped ("Attribute Mutant.line is required")."""
    from mutmut import RelativeMutationID
    from mutmut.cache import _get_unified_diff  # what `mutmut show` calls (mutmut is pinned: 2.5.1)

    con = sqlite3.connect(f"file:{cache}?mode=ro", uri=True)
    try:
        row = con.execute("select s.filename, l.line, l.line_number, m.\"index\", m.status from Mutant m "
                          "join Line l on m.line = l.id join SourceFile s on l.sourcefile = s.id "
                          "where m.id = ?", (mutant_id,)).fetchone()
    finally:
        con.close()
    if row is None:
        raise ValueError(f"no mutant {mutant_id} in {cache}")
    filename, line, number, index, status = row
    source = (root / filename).read_text()
    lines = source.split("\n")
    if not (0 <= number < len(lines) and lines[number] == line):
        raise ValueError(f"{root / filename} has changed since the run: line {number + 1} is not {line.strip()!r} "
                         f"(give --root the copy the run mutated)")
    diff = _get_unified_diff(source, filename, RelativeMutationID(line, index, number), [], update_cache=False)
    return f"# mutant {mutant_id}: {status}\n{diff}"


# --- survivors judged equivalent: kept in the repository with the reason -------------------------
#
# A survivor that changes no behaviour a user can see (a buffer's size, a sentinel read only as
# "< 0", an unreachable branch) cannot be killed by a test. Each such judgment is written down
# with its reason, keyed as mutmut keys a mutant (file, line text, index on the line; and the line
# number where that text is on several lines of the file) and with the mutated line itself, so
# the results page separates the survivors that still need a test from those judged equivalent,
# and a judgment whose line changed is reported stale, not carried over.

JUDGED_FILE = "docs/results/mutation-equivalent.json"


def mutated_line(source: str, filename: str, line: str, index: int, number: int) -> str:
    """The text of line `number` (0-based) of `source` with mutmut's mutant (`line`, `index`)."""
    from mutmut import Context, RelativeMutationID, mutate

    mutated, n = mutate(Context(source=source, mutation_id=RelativeMutationID(line, index, number),
                                filename=filename, dict_synonyms=[]))
    if n != 1:
        raise ValueError(f"{filename}:{number + 1}: mutmut has no mutant {index} on {line.strip()!r}")
    return mutated.split("\n")[number].strip()


def load_judged(path: Path) -> list[dict]:
    import json

    return json.loads(path.read_text())["mutants"] if path.exists() else []


def judge(cache: Path, ids: list[int], root: Path, why: str, path: Path) -> list[dict]:
    """Record the survivors `ids` of `cache` as equivalent, for `why`; returns the new entries."""
    import json

    if not why.strip():
        raise ValueError("say why the mutants are equivalent (--why)")
    con = sqlite3.connect(f"file:{cache}?mode=ro", uri=True)
    try:
        rows = {r[0]: r[1:] for r in con.execute(
            'select m.id, s.filename, l.line, l.line_number, m."index", m.status from Mutant m join Line l on m.line = l.id '
            'join SourceFile s on l.sourcefile = s.id where m.id in (%s)' % ",".join("?" * len(ids)), ids)}
    finally:
        con.close()
    entries = load_judged(path)
    have = {(e["file"], e["line"], e["index"], e.get("at")) for e in entries}
    new = []
    for mid in ids:
        if mid not in rows:
            raise ValueError(f"no mutant {mid} in {cache}")
        filename, line, number, index, status = rows[mid]
        if status != "bad_survived":
            raise ValueError(f"mutant {mid} is {status}, not a survivor")
        source = (root / filename).read_text()
        if source.split("\n")[number:number + 1] != [line]:
            raise ValueError(f"{root / filename} has changed since the run (give --root the copy the run mutated)")
        # a line whose text is on several lines (`return 0`) is judged at its number only
        at = number + 1 if source.split("\n").count(line) > 1 else None
        e = {"file": filename, "line": line, "index": index, **({"at": at} if at else {}),
             "mutant": mutated_line(source, filename, line, index, number), "why": why.strip()}
        if (filename, line, index, at) not in have:
            have.add((filename, line, index, at))
            entries.append(e)
            new.append(e)
    entries.sort(key=lambda e: (e["file"], e["line"], e["index"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": 1, "mutants": [' + ",".join("\n" + json.dumps(e, ensure_ascii=False) for e in entries)
                    + "\n]}\n")
    return new


def check_judgments(path: Path, root: Path) -> list[tuple[dict, int | None, str | None]]:
    """Each judgment of `path` against the files under `root`: (judgment, 0-based line number it
    describes, None) while it still describes the code, else (judgment, None, what changed): the
    line is gone from its file, or mutmut's mutant at that index is no longer the recorded one."""
    out: list[tuple[dict, int | None, str | None]] = []
    texts: dict[str, str] = {}
    for e in load_judged(path):
        f = root / e["file"]
        if e["file"] not in texts:
            texts[e["file"]] = f.read_text() if f.exists() else ""
        lines = texts[e["file"]].split("\n") if texts[e["file"]] else []
        where = ([e["at"] - 1] if e.get("at") and lines[e["at"] - 1:e["at"]] == [e["line"]]
                 else [] if e.get("at") else [i for i, x in enumerate(lines) if x == e["line"]])
        if len(where) != 1:
            out.append((e, None, f"{e['file']}: the line {e['line'].strip()!r} is gone" + (f" from line {e['at']}" if e.get("at") else "")
                        if not where else f"{e['file']}: the line {e['line'].strip()!r} is now on several lines"))
            continue
        try:
            got = mutated_line("\n".join(lines), e["file"], e["line"], e["index"], where[0])
        except ValueError as err:
            out.append((e, None, str(err)))
            continue
        out.append((e, where[0], None) if got == e["mutant"] else
                   (e, None, f"{e['file']}: mutant {e['index']} of {e['line'].strip()!r} is now {got!r}, not {e['mutant']!r}"))
    return out


def stale_judgments(path: Path, root: Path) -> list[str]:
    """Judgments that no longer describe the code, each with what changed (`check_judgments`)."""
    return [why for _, _, why in check_judgments(path, root) if why]


def mark_unrun(res: dict, caches: list[Path]) -> dict:
    """Survivors whose line no test runs get `no_test` (a hole in what the tests run, not in what
    they check), read from the run's test map beside each cache (`.mutmap-<target>.json`, written
    by `map`) and the run's copy of the file; `no_test` counts them. Without a map, nothing is marked."""
    import json

    maps = [(c.parent, json.loads(mp.read_text())) for c in caches for mp in sorted(c.parent.glob(".mutmap-*.json"))]
    for m in res["survivors"]:
        for root, mapping in maps:
            f = root / m["file"]
            if not (m["file"] in mapping["files"] or m["file"] in mapping.get("lines", {})) or not f.exists():
                continue
            lines = f.read_text().split("\n")
            if m.get("text") is not None and 0 < m["line"] <= len(lines):
                lines[m["line"] - 1] = m["text"]   # a stopped run can leave its last mutant in the copy
            try:
                tests = select_tests(mapping, m["file"], m["line"], "\n".join(lines))
            except SyntaxError:
                break
            if tests == []:
                m["no_test"] = True
            break
    res["no_test"] = sum(1 for m in res["survivors"] if m.get("no_test"))
    return res


def mark_judged(res: dict, judged: list[dict]) -> dict:
    """Each survivor judged equivalent gets its reason; `equivalent` counts them, `open` the rest."""
    why = {(e["file"], e["line"], e["index"], e.get("at")): e["why"] for e in judged}
    for m in res["survivors"]:
        w = why.get((m["file"], m.get("text"), m["index"], None)) or why.get((m["file"], m.get("text"), m["index"], m["line"]))
        if w:
            m["equivalent"] = w
    res["equivalent"] = sum(1 for m in res["survivors"] if "equivalent" in m)
    res["open"] = res["survived"] - res["equivalent"]
    return res


def main(argv: list[str] | None = None) -> int:
    from ratchet import results

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["map"]:
        return map_main(argv[1:])
    if argv[:1] == ["seed"]:
        ap = argparse.ArgumentParser(prog="ratchet.mutation seed",
                                     description="start a mutmut cache from earlier runs' verdicts")
        ap.add_argument("--cache", required=True, action="append", help="an earlier run's .mutmut-cache (repeatable)")
        ap.add_argument("--out", required=True, help="the new run's .mutmut-cache")
        a = ap.parse_args(argv[1:])
        try:
            n = seed_cache([Path(c) for c in a.cache], Path(a.out))
        except (FileNotFoundError, sqlite3.Error) as e:
            print(f"ratchet.mutation seed: {e}", file=sys.stderr)
            return 2
        print(f"mutation: {n['mutants']} earlier verdicts kept ({n['files']} files) -> {a.out}", file=sys.stderr)
        return 0

    if argv[:1] == ["show"]:
        ap = argparse.ArgumentParser(prog="ratchet.mutation show",
                                     description="print a mutant's diff; safe while a run uses the cache")
        ap.add_argument("--cache", required=True, help="the run's .mutmut-cache")
        ap.add_argument("--root", default=".", help="the unmutated copy the run's files come from (default: here)")
        ap.add_argument("id", type=int, help="the mutant's id (as the run lists it)")
        a = ap.parse_args(argv[1:])
        try:
            print(show_mutant(Path(a.cache), a.id, Path(a.root)))
        except (FileNotFoundError, sqlite3.Error, ValueError) as e:
            print(f"ratchet.mutation show: {e}", file=sys.stderr)
            return 2
        return 0

    if argv[:1] == ["judge"]:
        ap = argparse.ArgumentParser(prog="ratchet.mutation judge", description=(
            "record surviving mutants as equivalent (no behaviour a user can see changes), with the reason"))
        ap.add_argument("--cache", required=True, help="the run's .mutmut-cache")
        ap.add_argument("--root", default=".", help="the unmutated copy the run's files come from (default: here)")
        ap.add_argument("--why", required=True, help="why no test can tell the mutant from the code")
        ap.add_argument("--file", default=JUDGED_FILE, help=f"the judgments file (default {JUDGED_FILE})")
        ap.add_argument("ids", type=int, nargs="+", help="survivors' ids (as the run lists them)")
        a = ap.parse_args(argv[1:])
        try:
            new = judge(Path(a.cache), a.ids, Path(a.root), a.why, Path(a.file))
        except (FileNotFoundError, sqlite3.Error, ValueError) as e:
            print(f"ratchet.mutation judge: {e}", file=sys.stderr)
            return 2
        for e in new:
            print(f"{e['file']}: {e['line'].strip()}  ->  {e['mutant']}", file=sys.stderr)
        print(f"mutation: {len(new)} judged equivalent -> {a.file}", file=sys.stderr)
        return 0

    if argv[:1] in (["save"], ["resume"]):
        ap = argparse.ArgumentParser(prog=f"ratchet.mutation {argv[0]}", description=(
            "merge a run's verdicts into the committed state file" if argv[0] == "save"
            else "start a mutmut cache from the committed state file"))
        ap.add_argument("--state", default=STATE_FILE, help=f"the verdicts file (default {STATE_FILE})")
        if argv[0] == "save":
            ap.add_argument("--cache", required=True, action="append", help="a run's .mutmut-cache (repeatable)")
        else:
            ap.add_argument("--out", required=True, help="the new .mutmut-cache")
            ap.add_argument("--paths", required=True, action="append", help="mutmut's --paths-to-mutate (repeatable)")
            ap.add_argument("--root", default=".", help="the copy the paths are relative to (default: here)")
            ap.add_argument("--judged", help="survivors judged equivalent (mutation-equivalent.json): not run again")
            ap.add_argument("--tests-dir", action="append", default=[],
                            help="mutmut's --tests-dir of each --paths, in order (with --judged)")
        a = ap.parse_args(argv[1:])
        try:
            if argv[0] == "save":
                n = save_state([Path(c) for c in a.cache], Path(a.state))
                print(f"mutation: {n['verdicts']} verdicts of {n['files']} files saved -> {a.state}", file=sys.stderr)
            else:
                n = resume_cache(Path(a.state), Path(a.out), a.paths, Path(a.root),
                                 Path(a.judged) if a.judged else None, a.tests_dir)
                print(f"mutation: {n['verdicts']} saved verdicts resumed ({n['dropped']} dropped: their lines changed; "
                      f"{n['equivalent']} survivors judged equivalent not run again) -> {a.out}", file=sys.stderr)
        except (FileNotFoundError, sqlite3.Error, ValueError) as e:
            print(f"ratchet.mutation {argv[0]}: {e}", file=sys.stderr)
            return 2
        return 0

    ap = argparse.ArgumentParser(description="record mutmut's results on the results page")
    ap.add_argument("--cache", required=True, action="append",
                    help="the run's .mutmut-cache; repeat it for a run split over several copies (each file is "
                         "taken from the cache that tested most of its mutants)")
    ap.add_argument("--label", required=True, help="what was mutated (recorded as the command's arguments)")
    ap.add_argument("--tests", default="", help="the test runner each target used (recorded)")
    ap.add_argument("--wall-s", type=float, default=0.0, help="how long the mutmut run took (recorded)")
    ap.add_argument("--results-dir", help="default docs/results")
    ap.add_argument("--root", default=".", help="the tree the mutated files are read from, for their exempt lines "
                                                "(default: here)")
    a = ap.parse_args(argv)
    try:
        res = merge_caches([Path(c) for c in a.cache])
    except (FileNotFoundError, sqlite3.Error) as e:
        print(f"ratchet.mutation: {e}", file=sys.stderr)
        return 2
    res["exempt"] = exempt_lines(res["files"], Path(a.root))
    mark_judged(res, load_judged(Path(a.root) / JUDGED_FILE))
    mark_unrun(res, [Path(c) for c in a.cache])
    now = datetime.now(timezone.utc)
    load = os.getloadavg()
    rec = results.make_record("mutation", [a.label] + ([a.tests] if a.tests else []), res, now, a.wall_s, load, load)
    out = Path(a.results_dir) if a.results_dir else results.RESULTS_DIR
    results.append_record(rec, out)
    results.write_page(out)
    print(f"mutation: {res['killed']} of {res['mutants']} killed, {res['survived']} survived "
          f"({res['equivalent']} of them judged equivalent) "
          f"({len(res['files'])} files) -> {out / 'mutation.jsonl'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
