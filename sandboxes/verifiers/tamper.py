"""Static gate against test tampering from inside the code under test.

Pristine verification (`sandboxes.verify`) decides which files the tests come from, but pytest
runs the code under test in its own process, so that code could still rewrite pytest's verdicts
in memory (patch `_pytest` hooks, walk `gc` or stack frames to the reporter, write a forged
result to an inherited pipe, `os._exit` before a failure is recorded). No isolation can stop
that inside one process; this gate refuses the patches that reach for those handles. It scans
the lines a diff adds to files that are not tests (`scan`: the text) and the syntax trees of the
touched files (`scan_files`, `sandboxes.verifiers.tamper_ast`: aliases resolved, strings folded,
dynamic lookups and rigged comparisons seen, so `getattr(sys, 'mod' + 'ules')` is `sys.modules`),
and is a hard gate like a leaked secret. The built-in tasks are also judged out of the agent's
process (`sandboxes.verdict`), where none of these handles reaches a verdict.

Only what a patch introduces counts: a fix on a line that already used one of these names
is not flagged. It is a heuristic with a measured false-positive rate: 0 of the 1,210 recorded
HumanEval fixes and 0 of the QuixBugs reference fixes trip it. A real fix that needs one of these (a
library that implements a pytest plugin, say) should run with a task-specific allowlist
(`bundle.metadata["tamper_allow"]`, a list of pattern names).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PATTERNS: dict[str, re.Pattern] = {
    "pytest_internals": re.compile(r"\b_?pytest\b|\bpluggy\b|\bPYTEST_"),
    "module_table": re.compile(r"\bsys\s*\.\s*modules\b|\b__import__\s*\(|\bimportlib\b"),
    "dynamic_code": re.compile(r"(?<![.\w])(eval|exec|compile)\s*\("),
    "frame_walk": re.compile(r"\bsys\s*\.\s*_getframe\b|\binspect\s*\.\s*(stack|currentframe|"
                             r"getouterframes|getframeinfo)\b|\bf_back\b|\bf_globals\b|\bf_locals\b"),
    "tracing": re.compile(r"\b(settrace|setprofile|addaudithook)\b"),
    "heap_walk": re.compile(r"\bgc\s*\.\s*get_(objects|referrers|referents)\b"),
    "hard_exit": re.compile(r"\bos\s*\.\s*(_exit|abort|kill|killpg)\b"),
    "raw_fds": re.compile(r"\bos\s*\.\s*(write|dup2?|fdopen|closerange|pwrite)\s*\(|/proc/|/dev/fd"
                          r"|\b(open|FileIO)\s*\(\s*(\d|fd\b|_?fd)|\bimport\s+os\s+as\b|\bposix\b"
                          r"|\bfrom\s+os\s+import\b.*\b(write|_exit|dup2?|kill|fdopen)\b|getattr\s*\(\s*os\b"
                          r"|\._exit\b"),
    "native_code": re.compile(r"\bctypes\b|\bcffi\b"),
    "builtins": re.compile(r"\b__builtins__\b|\bbuiltins\s*\.\s*\w+\s*=|\bimport\s+builtins\b"),
    "exit_hooks": re.compile(r"\batexit\b|\bsys\s*\.\s*excepthook\b"),
    "introspection": re.compile(r"__(subclasses|globals|code|closure|mro|bases?)__"),
}


@dataclass(frozen=True)
class TamperFinding:
    file: str
    line: int
    pattern: str
    text: str


def scan(diff: str, skip=lambda path: False, allow=()) -> list[TamperFinding]:
    """Findings on the added lines of files for which `skip(path)` is False.

    Only handles the patch introduces count: per file and pattern, matches on added lines beyond
    those on the lines it removes (a one-token fix on a line that already called `eval` adds
    nothing new; one HumanEval solution does exactly that)."""
    added: dict[tuple[str, str], list[TamperFinding]] = {}
    removed: dict[tuple[str, str], int] = {}
    path, line = None, 0
    for raw in diff.splitlines():
        if raw.startswith("+++ "):
            p = raw[4:].strip()
            path = None if p == "/dev/null" else p[2:] if p.startswith("b/") else p
            continue
        if raw.startswith("--- "):
            continue
        if raw.startswith("@@"):
            m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", raw)
            line = int(m.group(1)) if m else 0
            continue
        sign = raw[:1]
        if sign in "+-" and path and not skip(path):
            code = raw[1:].split("#", 1)[0]
            for name, rx in PATTERNS.items():
                if name in allow:
                    continue
                hits = len(rx.findall(code))
                if not hits:
                    continue
                if sign == "-":
                    removed[(path, name)] = removed.get((path, name), 0) + hits
                else:
                    added.setdefault((path, name), []).extend(
                        [TamperFinding(path, line, name, raw[1:].strip()[:200])] * hits)
        if sign == "+" or sign == " " or sign == "":
            line += 1
    out = []
    for key, found in added.items():
        extra = len(found) - removed.get(key, 0)
        if extra > 0:
            out.extend(dict.fromkeys(found[-extra:]))
    return sorted(set(out), key=lambda f: (f.file, f.line, f.pattern))


def scan_files(before: dict[str, str], after: dict[str, str], paths, skip=lambda path: False,
               allow=()) -> list[TamperFinding]:
    """What the patch's code reaches for, resolved from syntax trees (`tamper_ast`): aliases,
    strings folded from constants, dynamic lookups, comparison methods that ignore their operand.
    Only the Python files among `paths` (the patch's), only what they add."""
    from sandboxes.verifiers.tamper_ast import introduced
    out = []
    for path in sorted(paths):
        if not path.endswith(".py") or skip(path) or path not in after:
            continue
        for r in introduced(before.get(path), after[path], allow=allow):
            out.append(TamperFinding(path, r.line, r.pattern, f"reaches {r.what}"))
    return out


def merge_findings(*groups) -> tuple[TamperFinding, ...]:
    """One finding per file, line and category (the text and the tree often see the same one)."""
    seen, out = set(), []
    for f in sorted((f for g in groups for f in g), key=lambda f: (f.file, f.line, f.pattern)):
        if (f.file, f.line, f.pattern) not in seen:
            seen.add((f.file, f.line, f.pattern))
            out.append(f)
    return tuple(out)
