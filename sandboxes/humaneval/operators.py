"""Single-token mutation operators over Python source.

One table drives both directions: the suite builder applies an edit to a canonical solution to
plant a bug, and `sandboxes.candidates` offers the same edits as quick-fixes. Every swap table is
symmetric (if `a -> b` is offered, so is `b -> a`), so the inverse of any planted bug is always
among the candidates of the mutated line.

Positions are 1-based lines and 0-based *character* columns (AST offsets are UTF-8 bytes and are
converted, since HumanEval docstrings contain non-ASCII text).
"""
from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

from sandboxes import pyast

COMPARE = {"<": ("<=", ">"), "<=": ("<", ">="), ">": (">=", "<"), ">=": (">", "<="),
           "==": ("!=",), "!=": ("==",), "in": ("not in",), "not in": ("in",),
           "is": ("is not",), "is not": ("is",)}
ARITH = {"+": ("-",), "-": ("+",), "*": ("/", "//"), "/": ("*", "//"),
         "//": ("/", "*", "%"), "%": ("//",)}
AUGMENTED = {"+=": ("-=",), "-=": ("+=",), "*=": ("//=",), "//=": ("*=",)}
BOOLEAN = {"and": ("or",), "or": ("and",)}
BOOL_CONST = {"True": ("False",), "False": ("True",)}

# Operator families (also the suite's slice key); order fixes candidate ordering at equal columns.
FAMILIES = ("comparison", "arithmetic", "boolean", "constant", "negation", "variable", "arguments")
NOT = "not "


@dataclass(frozen=True)
class Edit:
    """Replace `old` at line[col:end_col] with `new` (always within one line)."""
    line: int
    col: int
    end_col: int
    old: str
    new: str
    family: str
    kind: str  # finer operator name, e.g. "comparison_swap", "constant_plus_one", "negation_drop"

    @property
    def description(self) -> str:
        if self.kind == "negation_add":
            return f"insert `not` at column {self.col}"
        if self.kind == "negation_drop":
            return f"remove `not` at column {self.col}"
        if self.kind == "argument_swap":
            return f"swap arguments `{self.old}` -> `{self.new}`"
        return f"replace `{self.old}` with `{self.new}` at column {self.col} ({self.family})"

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        if text[self.col:self.end_col] != self.old:
            raise ValueError(f"edit does not match source at {self.line}:{self.col}: "
                             f"{text[self.col:self.end_col]!r} != {self.old!r}")
        lines[self.line - 1] = text[:self.col] + self.new + text[self.end_col:]
        return "".join(lines)

    def inverse(self) -> "Edit":
        return Edit(self.line, self.col, self.col + len(self.new), self.new, self.old,
                    self.family, _INVERSE_KIND.get(self.kind, self.kind))

    def to_dict(self) -> dict:
        return {"line": self.line, "col": self.col, "end_col": self.end_col, "old": self.old,
                "new": self.new, "family": self.family, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict) -> "Edit":
        return cls(**{k: d[k] for k in ("line", "col", "end_col", "old", "new", "family", "kind")})


_INVERSE_KIND = {"negation_add": "negation_drop", "negation_drop": "negation_add",
                 "constant_plus_one": "constant_minus_one",
                 "constant_minus_one": "constant_plus_one"}


class _Source:
    """Source text with byte->char column conversion and a token index."""

    def __init__(self, source: str, tree: ast.AST | None = None):
        self.text = source
        self.lines = source.splitlines(keepends=True)
        self.tree = tree if tree is not None else pyast.parse(source)
        toks = tokenize.generate_tokens(io.StringIO(source).readline)
        skip = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT,
                tokenize.DEDENT, tokenize.ENDMARKER}
        self.tokens = [t for t in toks if t.type not in skip]
        self.parents: dict[ast.AST, tuple[ast.AST, str]] = {}
        for node in ast.walk(self.tree):
            for fname, value in ast.iter_fields(node):
                for child in value if isinstance(value, list) else [value]:
                    if isinstance(child, ast.AST):
                        self.parents[child] = (node, fname)

    def col(self, lineno: int, byte_col: int) -> int:
        return len(self.lines[lineno - 1].encode()[:byte_col].decode(errors="replace"))

    def start(self, node: ast.AST) -> tuple[int, int]:
        return node.lineno, self.col(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> tuple[int, int]:
        return node.end_lineno, self.col(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str | None:
        (l1, c1), (l2, c2) = self.start(node), self.end(node)
        return self.lines[l1 - 1][c1:c2] if l1 == l2 else None

    def token_after(self, pos: tuple[int, int]) -> int | None:
        """Index of the first token at/after `pos` that is not a closing parenthesis."""
        for i, t in enumerate(self.tokens):
            if t.start >= pos and t.string != ")":
                return i
        return None

    def in_fstring(self, node: ast.AST) -> bool:
        while node in self.parents:
            node, _ = self.parents[node]
            if isinstance(node, ast.JoinedStr):
                return True
        return False


def _swaps(src: _Source, node_after: ast.AST, table: dict, family: str, kind: str) -> list[Edit]:
    """Edits for the operator token that follows `node_after` (merging `not in` / `is not`)."""
    i = src.token_after(src.end(node_after))
    if i is None:
        return []
    tok = src.tokens[i]
    end, text = tok.end, tok.string
    nxt = src.tokens[i + 1] if i + 1 < len(src.tokens) else None
    if nxt is not None and (text, nxt.string) in (("not", "in"), ("is", "not")):
        end, text = nxt.end, f"{text} {nxt.string}"
    if text not in table or tok.start[0] != end[0]:
        return []
    line, col = tok.start
    old = src.lines[line - 1][col:end[1]]
    return [Edit(line, col, end[1], old, new, family, kind) for new in table[text]]


def _scope_names(func: ast.AST) -> dict[str, int]:
    """Parameters and names bound inside `func` -> first line that binds them.

    Only bindings count (never loads), so a wrong-variable mutation leaves this set unchanged and
    its inverse stays a candidate.
    """
    names: dict[str, int] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.arg):
            name = node.arg
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            name = node.id
        else:
            continue
        names[name] = min(names.get(name, node.lineno), node.lineno)
    return names


_BOOL_CONTEXT = {(ast.If, "test"), (ast.While, "test"), (ast.IfExp, "test"), (ast.Assert, "test"),
                 (ast.comprehension, "ifs"), (ast.BoolOp, "values"), (ast.Return, "value")}


def _in_bool_context(src: _Source, node: ast.AST) -> bool:
    parent = src.parents.get(node)
    return parent is not None and any(isinstance(parent[0], t) and parent[1] == f
                                      for t, f in _BOOL_CONTEXT)


def _enclosing_function(src: _Source, node: ast.AST) -> ast.AST | None:
    while node in src.parents:
        node, _ = src.parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def edits_for_node(src: _Source, node: ast.AST, scope_cache: dict) -> list[Edit]:
    """Every single-token edit anchored at `node` (empty for nodes no operator applies to)."""
    out: list[Edit] = []
    if isinstance(node, ast.Compare):
        lefts = [node.left, *node.comparators[:-1]]
        for left in lefts:
            out += _swaps(src, left, COMPARE, "comparison", "comparison_swap")
    elif isinstance(node, ast.BinOp):
        out += _swaps(src, node.left, ARITH, "arithmetic", "arithmetic_swap")
    elif isinstance(node, ast.AugAssign):
        out += _swaps(src, node.target, AUGMENTED, "arithmetic", "arithmetic_swap")
    elif isinstance(node, ast.BoolOp):
        for value in node.values[:-1]:
            out += _swaps(src, value, BOOLEAN, "boolean", "boolean_swap")
    elif isinstance(node, ast.Constant) and node.lineno == node.end_lineno:
        (line, col), (_, end) = src.start(node), src.end(node)
        text = src.lines[line - 1][col:end]
        if isinstance(node.value, bool) and text in BOOL_CONST:
            out += [Edit(line, col, end, text, new, "constant", "bool_swap") for new in BOOL_CONST[text]]
        elif type(node.value) is int and text.isdigit() and (text == "0" or text[0] != "0"):
            if node.value >= 1:
                out.append(Edit(line, col, end, text, str(node.value - 1), "constant", "constant_minus_one"))
            out.append(Edit(line, col, end, text, str(node.value + 1), "constant", "constant_plus_one"))
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        func = _enclosing_function(src, node)
        if func is not None:
            scope = scope_cache.setdefault(id(func), _scope_names(func))
            if node.id in scope:
                line, col = src.start(node)
                # only names already bound at this line: a realistic slip, and fewer candidates
                out += [Edit(line, col, col + len(node.id), node.id, other, "variable", "variable_swap")
                        for other in sorted(scope) if other != node.id and scope[other] <= line]
    elif isinstance(node, ast.Call):
        args = node.args
        for a, b in zip(args, args[1:]):
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
                continue
            if not (a.lineno == a.end_lineno == b.lineno == b.end_lineno):
                continue
            (line, c1), (_, c2) = src.start(a), src.end(b)
            ta, tb = src.segment(a), src.segment(b)
            if ta == tb:
                continue
            between = src.lines[line - 1][src.end(a)[1]:src.start(b)[1]]
            out.append(Edit(line, c1, c2, ta + between + tb, tb + between + ta, "arguments", "argument_swap"))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and node.lineno == node.end_lineno:
        line, col = src.start(node)
        text = src.lines[line - 1]
        if text.startswith(NOT, col):
            out.append(Edit(line, col, col + len(NOT), NOT, "", "negation", "negation_drop"))
    if (_in_bool_context(src, node) and not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))):
        line, col = src.start(node)
        out.append(Edit(line, col, col, "", NOT, "negation", "negation_add"))
    return out


def all_edits(source: str, *, lines: set[int] | None = None, within: ast.AST | None = None,
              tree: ast.AST | None = None) -> list[Edit]:
    """All edits in `source` (optionally only those starting on `lines` / inside node `within`).

    Returned in deterministic order (line, operators before variable swaps, column, family, new
    token), de-duplicated by the
    resulting line text, and only edits whose result still parses.
    """
    src = _Source(source, tree)
    scope_cache: dict = {}
    root = within if within is not None else src.tree
    found: list[Edit] = []
    for node in ast.walk(root):
        if getattr(node, "lineno", None) is None:
            continue
        if lines is not None and not any(node.lineno <= n <= node.end_lineno for n in lines):
            continue
        if src.in_fstring(node):
            continue
        found += [e for e in edits_for_node(src, node, scope_cache) if lines is None or e.line in lines]
    # variable swaps last on each line: they are the most numerous and the least often right
    found.sort(key=lambda e: (e.line, e.family == "variable", e.col, e.end_col,
                              FAMILIES.index(e.family), e.new))
    seen, out = set(), []
    for e in found:
        text = src.lines[e.line - 1]
        result = text[:e.col] + e.new + text[e.end_col:]
        if (e.line, result) in seen or result == text:
            continue
        seen.add((e.line, result))
        if _parses(e.apply(source)):
            out.append(e)
    return out


def _parses(source: str) -> bool:
    try:
        pyast.parse(source)
    except SyntaxError:
        return False
    return True
