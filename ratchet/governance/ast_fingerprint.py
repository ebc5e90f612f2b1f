"""AST fingerprints of code that ignore names and literals.

Two functions *collide* when either
  * `skeleton`: their normalised trees are equal after masking identifiers, literals (kept by
    type only) and operators (kept by kind: binary / compare / bool / unary / aug-assign).
    Renamed variables, changed constants and swapped operators keep the skeleton; or
  * `subtree`: the Jaccard similarity of their sets of local shapes is >= SUBTREE_JACCARD. A
    local shape is (parent label, the masked subtree of depth 2 below it), one per non-leaf node.
    This catches mutants that change structure (an inserted `not`, `x` -> `x + 1`): a changed
    node only touches the shapes around it. Whole-subtree hashes were tried first and fail here:
    a change changes every ancestor's hash, so a negated `if` in a small function left
    0.0-0.45 overlap with its original.
Measured on the synthetic problems in tests/governance (12 HumanEval-style functions x 40
seeded single-token mutants): mutants >= 0.65, distinct problems <= 0.40; threshold 0.55.

Code that does not parse (patch fragments, other languages) falls back to token shingles
(identifiers/literals masked), kind "tokens"; nothing here raises on bad input.
"""
from __future__ import annotations

import ast
import hashlib
import re
import textwrap
from dataclasses import dataclass, field

# Skeleton equality only counts for functions of at least this many nodes: one-liners such as
# `return len(s)` or `return a + b` are shared by unrelated problems.
MIN_SKELETON_NODES = 10
SUBTREE_JACCARD = 0.55
TOKEN_SHINGLE = 4


@dataclass(frozen=True)
class Fingerprint:
    name: str  # function name (informational; not part of any hash), or "<module>" / "<tokens>"
    kind: str  # "function" | "module" | "tokens"
    skeleton: str  # sha1 of the masked tree (or of the masked token stream)
    subtrees: frozenset = field(default_factory=frozenset)  # hashes of local shapes (see above)
    size: int = 0  # node count after masking


def _h(s: str) -> str:
    return hashlib.sha1(s.encode()).hexdigest()[:16]


def _label(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return f"Const:{type(node.value).__name__}"
    return type(node).__name__  # Name/arg/Attribute/alias: the identifier itself is dropped


def _kids(node: ast.AST) -> list[ast.AST]:
    # operators and load/store contexts are masked: the parent's kind (BinOp, Compare...) stays
    return [c for c in ast.iter_child_nodes(node) if not isinstance(c, _MASKED)]


_MASKED = (ast.operator, ast.cmpop, ast.boolop, ast.unaryop, ast.expr_context)


def _shape(node: ast.AST, depth: int) -> str:
    kids = _kids(node)
    if depth == 0 or not kids:
        return _label(node)
    return _label(node) + "(" + ",".join(_shape(c, depth - 1) for c in kids) + ")"


def _fingerprint_node(node: ast.AST, name: str, kind: str) -> Fingerprint:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # the function's name and decorators are identifiers/wrapping, not structure
        node = ast.Module(body=[node.args, *node.body], type_ignores=[])
    skeleton = _shape(node, 10**6)
    shapes = set()
    size = 0
    for parent in ast.walk(node):
        if isinstance(parent, _MASKED):
            continue
        size += 1
        for child in _kids(parent):  # leaves included: "Assign>Const:int" is a shape too
            shapes.add(_h(_label(parent) + ">" + _shape(child, 2)))
    return Fingerprint(name=name, kind=kind, skeleton=_h(skeleton), subtrees=frozenset(shapes), size=size)


_TOKEN = re.compile(r"""[A-Za-z_]\w*|\d[\w.]*|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"|==|!=|<=|>=|\S""")
_KEYWORDS = frozenset(
    "and as assert async await break class continue def del elif else except finally for from "
    "global if import in is lambda nonlocal not or pass raise return try while with yield "
    "None True False".split()
)


def _token_fingerprint(code: str) -> Fingerprint:
    toks = []
    for t in _TOKEN.findall(code):
        if t in _KEYWORDS:
            toks.append(t)
        elif t[0].isalpha() or t[0] == "_":
            toks.append("ID")
        elif t[0].isdigit():
            toks.append("NUM")
        elif t[0] in "'\"":
            toks.append("STR")
        else:
            toks.append(t)
    k = TOKEN_SHINGLE
    grams = {"t:" + " ".join(toks[i : i + k]) for i in range(max(len(toks) - k + 1, 1))} if toks else set()
    return Fingerprint("<tokens>", "tokens", _h("tokens:" + " ".join(toks)), frozenset(_h(g) for g in grams), len(toks))


def _parse(code: str) -> ast.Module | None:
    for candidate in (code, textwrap.dedent(code)):
        try:
            return ast.parse(candidate)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
    return None


def fingerprint_code(code: str | None) -> list[Fingerprint]:
    """One Fingerprint per (async) function or method in `code`; module-level code with no
    function becomes one "module" fingerprint; unparseable code one "tokens" fingerprint."""
    if not code or not code.strip():
        return []
    try:
        tree = _parse(code)
        if tree is None:
            return [_token_fingerprint(code)]
        fps = [
            _fingerprint_node(n, n.name, "function")
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        return fps or [_fingerprint_node(tree, "<module>", "module")]
    except RecursionError:  # pathological nesting
        return [_token_fingerprint(code)]


def patch_post_image(patch: str | None) -> dict[str, str]:
    """{file path: new-side text of its hunks} from a unified diff (added + context lines).
    Text that is not a diff is returned as {"<text>": patch}."""
    if not patch:
        return {}
    files: dict[str, list[str]] = {}
    cur = None
    saw_hunk = False
    for line in patch.splitlines():
        if line.startswith("+++ "):
            path = line[4:].strip().split("\t")[0]
            cur = path[2:] if path.startswith(("a/", "b/")) else path
            files.setdefault(cur, [])
        elif line.startswith(("--- ", "diff --git", "index ")):
            continue
        elif line.startswith("@@"):
            saw_hunk = True
            if cur is None:
                cur = "<unknown>"
                files.setdefault(cur, [])
        elif cur is not None and saw_hunk and line[:1] in ("+", " ", ""):
            files[cur].append(line[1:])
    if not files:
        return {"<text>": patch}
    return {p: "\n".join(lines) for p, lines in files.items()}


def fingerprint_patch(patch: str | None) -> list[Fingerprint]:
    """Fingerprints of the functions a patch leaves behind (the post-image of every hunk).
    Python hunks that are partial functions fall back to token fingerprints."""
    out: list[Fingerprint] = []
    for path, text in patch_post_image(patch).items():
        if path.endswith(".py") or path in ("<text>", "<unknown>"):
            out.extend(fingerprint_code(text))
        elif text.strip():
            out.append(_token_fingerprint(text))
    return out


def subtree_jaccard(a: Fingerprint, b: Fingerprint) -> float:
    if not a.subtrees or not b.subtrees:
        return 0.0
    return len(a.subtrees & b.subtrees) / len(a.subtrees | b.subtrees)


def collide(a: Fingerprint, b: Fingerprint) -> tuple[str, float] | None:
    """('skeleton', 1.0) or ('subtree', jaccard) when the two fingerprints collide, else None.
    Fingerprints of different kinds (parsed vs token fallback) never collide."""
    if (a.kind == "tokens") != (b.kind == "tokens"):
        return None
    if a.skeleton == b.skeleton and min(a.size, b.size) >= MIN_SKELETON_NODES:
        return ("skeleton", 1.0)
    j = subtree_jaccard(a, b)
    return ("subtree", j) if j >= SUBTREE_JACCARD else None
