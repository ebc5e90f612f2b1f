"""`ast.parse` under one lock, for code that parses while episodes step in threads.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, so two threads
building ASTs at once can fail with "SystemError: AST constructor recursion depth mismatch"
(python/cpython#106905 and its follow-ups). Seen once in 7,200 episodes of `ratchet demo --full`:
an `apply_edit` call became an infra failure. Parsing a repair task's file takes
well under a millisecond, so the lock costs nothing measurable.
"""
from __future__ import annotations

import ast
import threading

_LOCK = threading.RLock()


def parse(source, *args, **kwargs) -> ast.AST:
    with _LOCK:
        return ast.parse(source, *args, **kwargs)
