"""AST blast radius: which functions and statements a patch changes, vs the minimal fix.

Comparing ASTs (not text lines) ignores formatting and comments, so a reformatted-but-equal line
is no change while a one-token semantic edit is one changed statement.
"""
from __future__ import annotations

import ast
import copy
import difflib
from dataclasses import dataclass

from sandboxes import pyast


@dataclass(frozen=True)
class BlastRadius:
    files: frozenset[str] = frozenset()
    functions: frozenset[str] = frozenset()   # "path::qualname" ("path::<module>" for top level)
    statements: int = 0                       # changed simple statements (inserted/removed/edited)
    unparsable: frozenset[str] = frozenset()  # python files whose new text does not parse


_NESTED = ("body", "orelse", "finalbody", "handlers", "cases")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _statements(tree: ast.Module) -> list[tuple[str, str]]:
    """(owner qualname, statement dump without its nested bodies), in source order."""
    out: list[tuple[str, str]] = []

    def visit(body, owner):
        for stmt in body:
            shallow = copy.copy(stmt)
            for f in _NESTED:
                if hasattr(shallow, f):
                    setattr(shallow, f, [])
            out.append((owner, ast.dump(shallow)))
            inner = owner
            if isinstance(stmt, _SCOPES):
                inner = stmt.name if owner == "<module>" else f"{owner}.{stmt.name}"
            for f in ("body", "orelse", "finalbody"):
                visit(getattr(stmt, f, None) or [], inner)
            for h in getattr(stmt, "handlers", None) or []:
                visit(h.body, owner)
            for c in getattr(stmt, "cases", None) or []:
                visit(c.body, owner)

    visit(tree.body, "<module>")
    return out


def blast_radius(before: dict[str, str], after: dict[str, str]) -> BlastRadius:
    files, funcs, unparsable, n = set(), set(), set(), 0
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        files.add(path)
        if not path.endswith(".py"):
            continue
        try:
            sa = _statements(pyast.parse(a or ""))
            sb = _statements(pyast.parse(b or ""))
        except SyntaxError:
            unparsable.add(path)
            continue
        if len(sa) == len(sb):
            # same shape: compare position by position (alignment could pair repeated
            # statements such as two `return False` differently and double-count)
            diff = [(x, y) for x, y in zip(sa, sb) if x != y]
            n += len(diff)
            funcs.update(f"{path}::{o}" for pair in diff for o, _ in pair)
            continue
        sm = difflib.SequenceMatcher(None, [s[1] for s in sa], [s[1] for s in sb], autojunk=False)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                continue
            n += max(i2 - i1, j2 - j1)
            funcs.update(f"{path}::{o}" for o, _ in sa[i1:i2] + sb[j1:j2])
    return BlastRadius(frozenset(files), frozenset(funcs), n, frozenset(unparsable))


def blast_score(candidate: BlastRadius, reference: BlastRadius | None) -> float:
    """1.0 when the patch is no larger than the minimal fix; shrinks with every extra statement,
    and halves for each function or file the minimal fix did not need to touch."""
    if candidate.unparsable:
        return 0.0
    if candidate.statements == 0 and not candidate.files:
        return 1.0
    ref_n = max(reference.statements if reference else 1, 1)
    score = min(1.0, ref_n / max(candidate.statements, 1))
    if reference is not None:
        score *= 0.5 ** len(candidate.functions - reference.functions)
        score *= 0.5 ** len(candidate.files - reference.files)
    return score
