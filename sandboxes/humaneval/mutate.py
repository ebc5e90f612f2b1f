"""Seeded mutants of one canonical solution: edits inside the entry-point function body only."""
from __future__ import annotations

import ast
import random

from sandboxes.humaneval.operators import FAMILIES, Edit, all_edits


def entry_function(tree: ast.Module, entry_point: str) -> ast.FunctionDef:
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry_point]
    if not funcs:
        raise ValueError(f"no top-level function {entry_point!r}")
    return funcs[-1]


def body_lines(func: ast.FunctionDef) -> range:
    """Lines of the function body after its docstring (the prompt is never mutated)."""
    body = func.body
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    if not body:
        return range(0)
    return range(body[0].lineno, func.end_lineno + 1)


def code_lines(source: str, func: ast.FunctionDef) -> int:
    src_lines = source.splitlines()
    return sum(1 for n in body_lines(func) if src_lines[n - 1].strip()
               and not src_lines[n - 1].strip().startswith("#"))


def mutants(canonical: str, entry_point: str, *, seed: int, key: str) -> list[Edit]:
    """All single-token mutants of the entry function, in a seeded family round-robin order.

    Round-robin over families keeps a per-problem cap from filling up with the most numerous
    family (wrong-variable swaps).
    """
    tree = ast.parse(canonical)
    func = entry_function(tree, entry_point)
    lines = set(body_lines(func))
    edits = all_edits(canonical, lines=lines, within=func, tree=tree) if lines else []
    rng = random.Random(f"{seed}:{key}")
    by_family = {f: [e for e in edits if e.family == f] for f in FAMILIES}
    order = [f for f in FAMILIES if by_family[f]]
    rng.shuffle(order)
    for f in order:
        rng.shuffle(by_family[f])
    out: list[Edit] = []
    while any(by_family[f] for f in order):
        for f in order:
            if by_family[f]:
                out.append(by_family[f].pop())
    return out
