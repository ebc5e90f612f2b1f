"""Turn a HumanEval `check(candidate)` function into a pytest file with one test per assertion.

One test per assert gives real FAIL_TO_PASS / PASS_TO_PASS node ids. Non-assert statements of
`check` (imports, helper assignments) are setup: each test repeats every setup statement that
precedes it, so every test runs alone. A statement that *contains* asserts (a `for` loop over
random inputs) becomes one test. `assert True` filler is dropped. Tests that use `random` are
seeded per test so the outcome is the same on every run.
"""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field

TEST_FILE = "test_solution.py"
SOLUTION_FILE = "solution.py"


@dataclass
class GeneratedTests:
    source: str
    names: list[str]                                    # test function names, in file order
    node_ids: list[str]
    asserts: dict[str, str] = field(default_factory=dict)   # name -> assert text (for issues)
    examples: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (call, expected)


def _statement_text(lines: list[str], stmt: ast.stmt) -> str:
    return textwrap.dedent("".join(lines[stmt.lineno - 1:stmt.end_lineno])).rstrip() + "\n"


def _example(stmt: ast.stmt, test_src: str) -> tuple[str, str] | None:
    """(call, expected) for `assert candidate(...) == expected`, the shape a bug report quotes."""
    t = stmt.test if isinstance(stmt, ast.Assert) else None
    if (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)
            and isinstance(t.left, ast.Call) and isinstance(t.left.func, ast.Name)
            and t.left.func.id == "candidate"):
        call = ast.get_source_segment(test_src, t.left)
        expected = ast.get_source_segment(test_src, t.comparators[0])
        if call and expected and "\n" not in call and len(call) <= 300:
            return call, expected
    return None


def generate_tests(test_src: str, entry_point: str) -> GeneratedTests:
    tree = ast.parse(test_src)
    lines = test_src.splitlines(keepends=True)
    check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check")
    module_stmts = [n for n in tree.body if n is not check]
    seeded = "random" in test_src
    units: list[tuple[list[ast.stmt], ast.stmt]] = []
    setup: list[ast.stmt] = []
    for stmt in check.body:
        has_assert = any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
        if not has_assert:
            setup.append(stmt)
        elif not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant)):
            units.append((list(setup), stmt))
    width = max(2, len(str(len(units) - 1)))
    header = [
        f'"""Tests for `{entry_point}`: one test per assertion of the original check."""\n',
        "# The original check ran in the solution's namespace (helpers from the prompt included).\n",
        f"from {SOLUTION_FILE[:-3]} import *  # noqa: F401,F403\n",
        f"from {SOLUTION_FILE[:-3]} import {entry_point}\n",
    ]
    if seeded:
        header.append("import random as _random\n")
    body = ["".join(header)]
    if module_stmts:
        body.append("".join(_statement_text(lines, s) for s in module_stmts))
    out = GeneratedTests("", [], [])
    for i, (pre, stmt) in enumerate(units):
        name = f"test_check_{i:0{width}d}"
        parts = [f"candidate = {entry_point}\n"]
        if seeded:
            parts.append(f"_random.seed({i})\n")
        parts += [_statement_text(lines, s) for s in pre]
        parts.append(_statement_text(lines, stmt))
        body.append(f"def {name}():\n" + textwrap.indent("".join(parts), "    "))
        out.names.append(name)
        out.node_ids.append(f"{TEST_FILE}::{name}")
        text = _statement_text(lines, stmt).strip()
        out.asserts[name] = re.sub(r"\bcandidate\b", entry_point, text)
        ex = None if pre else _example(stmt, test_src)
        if ex:
            out.examples[name] = (re.sub(r"\bcandidate\b", entry_point, ex[0]), ex[1])
    out.source = "\n\n".join(body)
    return out
