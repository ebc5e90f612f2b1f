"""What a patch's code reaches for, read from its syntax tree rather than its text.

The text gate (`sandboxes.verifiers.tamper.scan`) matches names as written, so a name built at
run time slips past it: `getattr(sys, 'mod' + 'ules')['_py' + 'test.rep' + 'orts']`,
`getattr(frame, 'f_' + 'locals')`, `''.join(map(chr, [...]))`. This module resolves what the code
refers to instead:

* import aliases (`import sys as s; s.modules` is `sys.modules`; `from os import _exit as q`);
* strings computed from constants, folded: concatenation, `%` and `.format`, f-strings,
  `sep.join(...)` over constants, `chr`/`ord` codes, slices (`[::-1]`), `.replace`, case changes,
  `bytes.fromhex`, `.decode`, base64 and rot13, and names bound to such strings;
* dynamic lookups as the attribute they reach: `getattr` / `setattr` / `delattr` / `hasattr`,
  `vars(m)[k]`, `m.__dict__[k]`, `globals()[k]`, `operator.attrgetter`;
* comparison methods that ignore their operand (`__eq__` returning a constant True, in a class,
  a lambda, or the dict of a 3-argument `type()`): an object that equals anything.

Each reference is classified with the text gate's categories; `introduced(before, after)` reports
those a patch adds to a file (a fix on a line that already used one adds nothing). A finding is a
hard gate (`sandboxes.verifiers.hygiene`). What no static reading settles (a name read from a
file, then looked up) is the reason the built-in tasks' verdict is computed out of process
(`sandboxes.verdict`).
"""
from __future__ import annotations

import ast
import base64
import codecs
import re
from collections import Counter
from dataclasses import dataclass

_MAX_STR = 10_000                 # longest folded string / sequence (a gate, not an interpreter)

# qualified names (after alias resolution) -> category; a prefix ending in "." covers a module
QUALIFIED = {
    "pytest.": "pytest_internals", "_pytest.": "pytest_internals", "pluggy.": "pytest_internals",
    "pytest": "pytest_internals", "_pytest": "pytest_internals", "pluggy": "pytest_internals",
    "sys.modules": "module_table", "sys.meta_path": "module_table", "sys.path_hooks": "module_table",
    "importlib": "module_table", "importlib.": "module_table", "builtins.__import__": "module_table",
    "sys._getframe": "frame_walk", "sys._current_frames": "frame_walk",
    "inspect.stack": "frame_walk", "inspect.currentframe": "frame_walk", "inspect.trace": "frame_walk",
    "inspect.getouterframes": "frame_walk", "inspect.getinnerframes": "frame_walk",
    "inspect.getframeinfo": "frame_walk", "traceback.walk_stack": "frame_walk",
    "traceback.extract_stack": "frame_walk", "traceback.format_stack": "frame_walk",
    "traceback.print_stack": "frame_walk", "traceback.walk_tb": "frame_walk",
    "traceback.StackSummary": "frame_walk",
    "sys.settrace": "tracing", "sys.setprofile": "tracing", "sys.addaudithook": "tracing",
    "sys.monitoring": "tracing", "threading.settrace": "tracing", "threading.setprofile": "tracing",
    "gc.get_objects": "heap_walk", "gc.get_referrers": "heap_walk", "gc.get_referents": "heap_walk",
    "os._exit": "hard_exit", "os.abort": "hard_exit", "os.kill": "hard_exit", "os.killpg": "hard_exit",
    "signal.pthread_kill": "hard_exit", "posix.": "raw_fds", "posix": "raw_fds",
    "os.write": "raw_fds", "os.dup": "raw_fds", "os.dup2": "raw_fds", "os.fdopen": "raw_fds",
    "os.closerange": "raw_fds", "os.pwrite": "raw_fds", "os.writev": "raw_fds",
    "ctypes": "native_code", "ctypes.": "native_code", "_ctypes": "native_code",
    "_ctypes.": "native_code", "cffi": "native_code", "cffi.": "native_code",
    "builtins": "builtins", "builtins.": "builtins",
    "atexit": "exit_hooks", "atexit.": "exit_hooks", "sys.excepthook": "exit_hooks",
}
# attribute names that only mean one thing, whatever object they are read from
ATTRIBUTES = {
    **{a: "frame_walk" for a in ("f_back", "f_locals", "f_globals", "f_builtins", "f_code",
                                 "tb_frame", "gi_frame", "cr_frame", "ag_frame")},
    **{a: "introspection" for a in ("__subclasses__", "__globals__", "__code__", "__closure__",
                                    "__mro__", "__bases__", "__base__")},
    "__builtins__": "builtins",
}
BUILTIN_CALLS = {"eval": "dynamic_code", "exec": "dynamic_code", "compile": "dynamic_code",
                 "__import__": "module_table", "breakpoint": "tracing"}
_DYNAMIC = {"getattr", "setattr", "delattr", "hasattr"}
_COMPARE = {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__"}
_PYTEST_WORD = re.compile(r"(?<![A-Za-z0-9])_?(pytest|pluggy)(?![A-Za-z0-9])")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Reference:
    pattern: str       # the category (the text gate's names, plus "rigged_comparison")
    what: str          # the resolved name, e.g. "sys.modules", "'f_locals'"
    line: int


def classify(name: str) -> str | None:
    """The category of a qualified name (`sys.modules`, `_pytest.reports.BaseReport`), if any."""
    if name in QUALIFIED:
        return QUALIFIED[name]
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        cat = QUALIFIED.get(".".join(parts[:i]) + ".")
        if cat:
            return cat
    return ATTRIBUTES.get(parts[-1]) or BUILTIN_CALLS.get(name)


def _string_refs(value: str) -> list[tuple[str, str]]:
    """Categories a string names: a dotted identifier as a name, any text for pytest's names,
    and the kernel's descriptor folders."""
    out = []
    s = value.strip()
    if _DOTTED.fullmatch(s):
        cat = classify(s)
        if not cat:       # a bare attribute or builtin name ('modules' alone stays unclassified)
            cat = ATTRIBUTES.get(s) or (BUILTIN_CALLS.get(s) if s in ("__import__",) else None)
        if cat:
            out.append((cat, repr(s)))
    elif _PYTEST_WORD.search(s):
        out.append(("pytest_internals", repr(s[:60])))
    if "/proc/" in s or "/dev/fd" in s:
        out.append(("raw_fds", repr(s[:60])))
    return out


class _Folder:
    """Evaluates constant string expressions (and the names bound to them) without running code."""

    def __init__(self):
        self.env: dict[str, object] = {}

    def fold(self, node):                           # noqa: C901 - one small evaluator
        try:
            v = self._fold(node)
        except (ValueError, TypeError, IndexError, KeyError, OverflowError, UnicodeError,
                AttributeError, ZeroDivisionError, RecursionError, base64.binascii.Error):
            return None
        if isinstance(v, (str, bytes, list, tuple)) and len(v) > _MAX_STR:
            return None
        return v

    def _fold(self, n):
        f = self.fold
        if isinstance(n, ast.Constant):
            return n.value if isinstance(n.value, (str, bytes, int)) and not isinstance(n.value, bool) else None
        if isinstance(n, ast.Name):
            return self.env.get(n.id)
        if isinstance(n, (ast.List, ast.Tuple, ast.Set)):
            vals = [f(e) for e in n.elts]
            return None if any(v is None for v in vals) else (list(vals) if not isinstance(n, ast.Tuple) else tuple(vals))
        if isinstance(n, ast.BinOp):
            a, b = f(n.left), f(n.right)
            if a is None or b is None:
                return None
            if isinstance(n.op, ast.Add) and type(a) is type(b):
                return a + b
            if isinstance(n.op, ast.Mult) and (isinstance(a, int) or isinstance(b, int)):
                if isinstance(a, int) and isinstance(b, int):
                    return a * b if abs(a * b) < 1 << 62 else None
                seq, k = (a, b) if isinstance(b, int) else (b, a)
                return seq * k if k * len(seq) <= _MAX_STR else None
            if isinstance(n.op, ast.Mod) and isinstance(a, str):
                return a % b
            if isinstance(n.op, (ast.Sub, ast.BitXor, ast.BitOr, ast.BitAnd)) and isinstance(a, int) and isinstance(b, int):
                return {ast.Sub: a - b, ast.BitXor: a ^ b, ast.BitOr: a | b, ast.BitAnd: a & b}[type(n.op)]
            return None
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd, ast.Invert)):
            v = f(n.operand)
            return None if not isinstance(v, int) else -v if isinstance(n.op, ast.USub) else ~v if isinstance(n.op, ast.Invert) else v
        if isinstance(n, ast.JoinedStr):
            out = []
            for part in n.values:
                v = part.value if isinstance(part, ast.Constant) else f(part.value) if isinstance(part, ast.FormattedValue) else None
                if v is None:
                    return None
                out.append(str(v))
            return "".join(out)
        if isinstance(n, ast.Subscript):
            seq = f(n.value)
            if seq is None:
                return None
            if isinstance(n.slice, ast.Slice):
                lo, hi, st = (f(x) if x is not None else None for x in (n.slice.lower, n.slice.upper, n.slice.step))
                return seq[slice(lo, hi, st)]
            i = f(n.slice)
            return seq[i] if isinstance(i, int) else None
        if isinstance(n, (ast.GeneratorExp, ast.ListComp)) and len(n.generators) == 1:
            g = n.generators[0]
            it = f(g.iter)
            if it is None or g.ifs or not isinstance(g.target, ast.Name) or len(it) > _MAX_STR:
                return None
            saved, out = self.env.get(g.target.id), []
            for item in it:
                self.env[g.target.id] = item
                v = f(n.elt)
                if v is None:
                    out = None
                    break
                out.append(v)
            self.env[g.target.id] = saved
            return out
        if isinstance(n, ast.Call):
            return self._call(n)
        return None

    def _call(self, n: ast.Call):
        f = self.fold
        args = [f(a) for a in n.args]
        fn = n.func
        if isinstance(fn, ast.Name):
            if fn.id == "chr" and len(args) == 1 and isinstance(args[0], int):
                return chr(args[0])
            if fn.id == "ord" and len(args) == 1 and isinstance(args[0], str):
                return ord(args[0])
            if fn.id in ("str", "bytes", "bytearray", "list", "tuple", "reversed", "sorted") and len(args) == 1 and args[0] is not None:
                v = args[0]
                if fn.id == "str":
                    return v if isinstance(v, str) else v.decode("latin-1") if isinstance(v, bytes) else str(v)
                if fn.id in ("bytes", "bytearray"):
                    return bytes(v)
                return list(reversed(v)) if fn.id == "reversed" else sorted(v) if fn.id == "sorted" else list(v) if fn.id == "list" else tuple(v)
            if fn.id == "map" and len(n.args) == 2 and isinstance(n.args[0], ast.Name) and n.args[0].id in ("chr", "str") and args[1] is not None:
                return [chr(x) if n.args[0].id == "chr" else str(x) for x in args[1]]
            if fn.id == "range" and args and all(isinstance(a, int) for a in args):
                r = range(*args)
                return list(r) if len(r) <= _MAX_STR else None
            return None
        if not isinstance(fn, ast.Attribute):
            return None
        owner = fn.value
        if isinstance(owner, ast.Name) and owner.id in ("bytes", "bytearray") and fn.attr == "fromhex" and len(args) == 1:
            return bytes.fromhex(args[0])
        if isinstance(owner, ast.Attribute) or isinstance(owner, ast.Name):
            base = owner.attr if isinstance(owner, ast.Attribute) else owner.id
            if base == "base64" and fn.attr.endswith("decode") and args and args[0] is not None:
                return getattr(base64, fn.attr)(args[0])
            if base == "codecs" and fn.attr in ("decode", "encode") and len(args) == 2 and args[1] in ("rot13", "rot_13"):
                return codecs.decode(args[0], "rot13")
        recv = f(owner)
        if recv is None:
            return None
        if fn.attr == "join" and isinstance(recv, (str, bytes)) and len(args) == 1 and args[0] is not None:
            return recv.join(args[0])
        if fn.attr in ("replace", "lower", "upper", "strip", "lstrip", "rstrip", "title", "capitalize",
                       "swapcase", "casefold", "decode", "encode", "removeprefix", "removesuffix",
                       "format", "zfill") and all(a is not None for a in args):
            kwargs = {k.arg: f(k.value) for k in n.keywords if k.arg}
            return getattr(recv, fn.attr)(*args, **kwargs)
        return None


def _resolve(node, aliases: dict[str, str]) -> str | None:
    """`a.b.c` with `a` resolved through the file's imports (None when the base is not a name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _constant_truthy(body) -> bool:
    """A comparison method body that ignores its operand: returns a constant that is not False."""
    if isinstance(body, ast.Constant):
        return body.value not in (False, None, 0, NotImplemented) and body.value is not Ellipsis
    if isinstance(body, ast.UnaryOp) and isinstance(body.op, ast.Not) and isinstance(body.operand, ast.Constant):
        return not body.operand.value
    return False


def _rigged(value) -> bool:
    """A lambda or function whose result is a constant truthy value, whatever it is given."""
    if isinstance(value, ast.Lambda):
        return _constant_truthy(value.body)
    if isinstance(value, (ast.FunctionDef, ast.AsyncFunctionDef)):
        stmts = [s for s in value.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        return len(stmts) == 1 and isinstance(stmts[0], ast.Return) and stmts[0].value is not None \
            and _constant_truthy(stmts[0].value)
    return False


class _Refs(ast.NodeVisitor):
    def __init__(self):
        self.aliases: dict[str, str] = {}
        self.folder = _Folder()
        self.refs: list[Reference] = []

    def add(self, cat, what, node):
        if cat:
            self.refs.append(Reference(cat, what, getattr(node, "lineno", 0)))

    # bindings ----------------------------------------------------------------
    def visit_Import(self, node):
        for a in node.names:
            if a.asname:                       # import a.b as x: x is a.b
                self.aliases[a.asname] = a.name
            else:                              # import a.b: binds a
                top = a.name.split(".")[0]
                self.aliases[top] = top
            self.add(classify(a.name), a.name, node)

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        self.add(classify(mod), mod, node)
        for a in node.names:
            q = f"{mod}.{a.name}" if mod else a.name
            self.aliases[a.asname or a.name] = q
            self.add(classify(q), q, node)

    def visit_Assign(self, node):
        self.generic_visit(node)
        v = self.folder.fold(node.value)
        for t in node.targets:
            if isinstance(t, ast.Name):
                if v is None:
                    self.folder.env.pop(t.id, None)
                else:
                    self.folder.env[t.id] = v
                if t.id in _COMPARE and _rigged(node.value):
                    self.add("rigged_comparison", t.id, node)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        if isinstance(node.target, ast.Name):
            v = self.folder.fold(ast.BinOp(ast.Name(node.target.id, ast.Load()), node.op, node.value))
            if v is None:
                self.folder.env.pop(node.target.id, None)
            else:
                self.folder.env[node.target.id] = v

    def visit_FunctionDef(self, node):
        if node.name in _COMPARE and _rigged(node):
            self.add("rigged_comparison", node.name, node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    # references ----------------------------------------------------------------
    def visit_Name(self, node):
        q = self.aliases.get(node.id)
        if q:
            self.add(classify(q), q, node)
        elif node.id in ("__builtins__",):
            self.add("builtins", node.id, node)

    def visit_Attribute(self, node):
        q = _resolve(node, self.aliases)
        cat = classify(q) if q else None
        self.add(cat or ATTRIBUTES.get(node.attr), q or node.attr, node)
        # the base is visited for its own name only (a.b.c counts once, as its longest resolution)
        base = node.value
        while isinstance(base, ast.Attribute):
            base = base.value
        if not isinstance(base, ast.Name):
            self.visit(node.value)

    def visit_Constant(self, node):
        if isinstance(node.value, str):
            for cat, what in _string_refs(node.value):
                self.add(cat, what, node)

    def _base(self, node) -> str | None:
        """The module or object a dynamic lookup starts from: a name, or `__import__(<name>)` /
        `importlib.import_module(<name>)` with a foldable name."""
        if isinstance(node, (ast.Name, ast.Attribute)):
            return _resolve(node, self.aliases)
        if isinstance(node, ast.Call) and node.args:
            fn = _resolve(node.func, self.aliases) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
            if fn in ("__import__", "importlib.import_module"):
                mod = self.folder.fold(node.args[0])
                return mod if isinstance(mod, str) else None
        return None

    def visit_Call(self, node):
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else None
        folded = self.folder.fold(node)           # a call that computes a string from constants
        if isinstance(folded, bytes):
            folded = folded.decode("latin-1")
        if isinstance(folded, str):
            for cat, what in _string_refs(folded):
                self.add(cat, what, node)
        if name in BUILTIN_CALLS and name not in self.aliases:
            self.add(BUILTIN_CALLS[name], name, node)
        if name in _DYNAMIC and len(node.args) >= 2:
            key = self.folder.fold(node.args[1])
            if isinstance(key, str):
                base = self._base(node.args[0])
                self.add(classify(f"{base}.{key}") if base else None, f"{base}.{key}", node)
                self.add(ATTRIBUTES.get(key), repr(key), node)
                if name == "setattr" and key in _COMPARE and len(node.args) == 3 and _rigged(node.args[2]):
                    self.add("rigged_comparison", key, node)
        if name == "type" and len(node.args) == 3 and isinstance(node.args[2], ast.Dict):
            for k, v in zip(node.args[2].keys, node.args[2].values):
                if k is not None and self.folder.fold(k) in _COMPARE and _rigged(v):
                    self.add("rigged_comparison", str(self.folder.fold(k)), node)
        if isinstance(fn, ast.Attribute) and fn.attr == "attrgetter" and node.args:
            key = self.folder.fold(node.args[0])
            if isinstance(key, str):
                self.add(ATTRIBUTES.get(key.split(".")[-1]), repr(key), node)
        # a folded string that is not a plain literal: what it spells counts like a literal
        for a in [*node.args, *(k.value for k in node.keywords)]:
            if not isinstance(a, ast.Constant):
                v = self.folder.fold(a)
                if isinstance(v, bytes):
                    v = v.decode("latin-1")
                if isinstance(v, str):
                    for cat, what in _string_refs(v):
                        self.add(cat, what, node)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        # vars(m)[k], m.__dict__[k], globals()[k]: a lookup by a (folded) name
        v = node.value
        key = self.folder.fold(node.slice)
        if isinstance(key, str):
            base = None
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "vars" and v.args:
                base = self._base(v.args[0])
            elif isinstance(v, ast.Attribute) and v.attr == "__dict__":
                base = _resolve(v.value, self.aliases)
            if base:
                self.add(classify(f"{base}.{key}"), f"{base}.{key}", node)
            self.add(ATTRIBUTES.get(key) or (BUILTIN_CALLS.get(key) if key == "__import__" else None), repr(key), node)
            if not isinstance(node.slice, ast.Constant):
                for cat, what in _string_refs(key):
                    self.add(cat, what, node)
        self.generic_visit(node)

    def visit_BinOp(self, node):
        v = self.folder.fold(node)
        if isinstance(v, str):
            for cat, what in _string_refs(v):
                self.add(cat, what, node)
        else:
            self.generic_visit(node)

    visit_JoinedStr = visit_BinOp


def references(source: str) -> list[Reference]:
    """Every sensitive reference in one file's code (empty when it does not parse)."""
    from sandboxes import pyast
    try:
        tree = pyast.parse(source)
    except (SyntaxError, ValueError):
        return []
    v = _Refs()
    try:
        v.visit(tree)
    except RecursionError:
        return [Reference("dynamic_code", "code nested too deep to read", 0)]
    return v.refs


def introduced(before: str | None, after: str | None, allow=()) -> list[Reference]:
    """The references `after` has beyond those of `before` (per category and name)."""
    if not after:
        return []
    old = Counter((r.pattern, r.what) for r in references(before or ""))
    new = [r for r in references(after) if r.pattern not in allow]
    out, seen = [], Counter()
    for r in reversed(new):                      # the last occurrences are the added ones
        seen[(r.pattern, r.what)] += 1
        if seen[(r.pattern, r.what)] > old[(r.pattern, r.what)]:
            out.append(r)
    return sorted(set(out), key=lambda r: (r.line, r.pattern, r.what))
