"""The observation text of the tools that agents read back: each formatter (called by
`sandboxes.tools`) beside the parser an agent calls on its output, so a format and its parser
change together. `tests/sandboxes/test_tool_roundtrip.py` formats and parses back every pair.

Pure functions over plain values (no env, no sandbox). An observation that starts with
`error:` is the env's refusal of a call: every parser reads it as nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


def is_error(obs: str) -> bool:
    return obs.startswith("error:")


# --------------------------------------------------------------------------- list_files
def format_file_list(path: str, files: list[str]) -> str:
    return "\n".join(files) if files else f"(no files under {path})"


def parse_file_list(obs: str) -> list[str]:
    if is_error(obs) or (obs.startswith("(no files under ") and obs.endswith(")") and "\n" not in obs):
        return []
    return obs.splitlines()


# --------------------------------------------------------------------------- read_file
_NUMBERED = re.compile(r"^\s*\d+\| ?(.*)$")


def format_source(path: str, lines: list[str], start_line: int, end_line: int) -> str:
    """Lines start_line..end_line (1-based, inclusive) of a file's `lines`, numbered."""
    if not lines:
        return f"({path} is empty)"
    return "\n".join(f"{n:4d}| {lines[n - 1]}" for n in range(start_line, end_line + 1))


def parse_source(obs: str) -> str:
    """read_file's numbered output back to the file text (the lines shown, newline-terminated)."""
    if is_error(obs):
        return ""
    if obs.startswith("(") and obs.endswith(" is empty)") and "\n" not in obs:
        return ""
    return "\n".join(m.group(1) if m else "" for m in map(_NUMBERED.match, obs.splitlines())) + "\n"


# --------------------------------------------------------------------------- run_tests
_TAIL = "\n\n--- pytest output (tail) ---\n"
_CRASHED = "the test run crashed (caused by the code under test): "
_TIMED_OUT = " [timed out]"
_OUTCOME_LINE = re.compile(r"^(FAILED|ERROR|SKIPPED) ")    # the worker's non-passing outcomes


@dataclass(frozen=True)
class TestSummary:
    __test__ = False                     # not a pytest class
    counts: dict[str, int]               # outcome -> number of collected items
    timed_out: bool
    crashed: str | None                  # what the crash said (at most 300 characters)
    not_passed: dict[str, str]           # test id -> outcome, every item that did not pass
    output: str                          # the tail of pytest's console output ("" when not shown)


def _stable(output: str) -> str:
    """Drop run-to-run noise (object addresses, timings) so the same state gives the same text."""
    output = re.sub(r" at 0x[0-9a-f]+>", ">", output)
    output = re.sub(r" in \d+(\.\d+)?s\b", "", output)
    return re.sub(r"={3,}", "===", re.sub(r"_{3,}", "___", output))   # padding varies with timing


def _items(outcomes: dict) -> dict:
    """Outcomes per collected item: a requested function- or file-level id that stands for
    several parametrised items is counted once, through its items."""
    keys = sorted(outcomes)
    agg = {k for i, k in enumerate(keys) if i + 1 < len(keys) and keys[i + 1].startswith((k + "[", k + "::"))}
    return {k: o for k, o in outcomes.items() if k not in agg}


def format_test_summary(rep, limit: int) -> str:
    """A `TestReport`'s counts, crash, non-passing items and (when something failed and it fits
    in `limit` characters) the tail of pytest's output."""
    counts: dict[str, int] = {}
    items = _items(rep.outcomes)
    for o in items.values():
        counts[o] = counts.get(o, 0) + 1
    head = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no tests ran"
    lines = [head + (_TIMED_OUT if rep.timed_out else "")]
    if getattr(rep, "agent_fault", None):
        lines.append(_CRASHED + rep.agent_fault[:300])
    lines += [f"{o.upper()} {t}" for t, o in sorted(items.items()) if o != "passed"]
    text = "\n".join(lines)
    if any(o != "passed" for o in items.values()) and rep.output:
        room = limit - len(text) - 40
        if room > 200:
            text += _TAIL + _stable(rep.output)[-room:]
    return text


def parse_test_summary(obs: str) -> TestSummary | None:
    """run_tests' observation back to its parts (None for an error observation). A crash text
    runs up to the first `FAILED `/`ERROR `/`SKIPPED ` line: one of its own lines that starts so
    would be read as an item."""
    if is_error(obs):
        return None
    summary, _, output = obs.partition(_TAIL)
    head, *rest = summary.split("\n")
    timed_out = head.endswith(_TIMED_OUT)
    head = head.removesuffix(_TIMED_OUT)
    counts = {} if head == "no tests ran" else {
        o: int(n) for n, o in (part.split(" ", 1) for part in head.split(", "))}
    crashed = None
    if rest and rest[0].startswith(_CRASHED):     # its text may span lines (a stderr tail)
        n = next((i for i, line in enumerate(rest) if i and _OUTCOME_LINE.match(line)), len(rest))
        crashed, rest = "\n".join(rest[:n])[len(_CRASHED):], rest[n:]
    not_passed = {}
    for line in rest:
        outcome, _, tid = line.partition(" ")
        not_passed[tid] = outcome.lower()
    return TestSummary(counts, timed_out, crashed, not_passed, output)


def tests_all_passed(obs: str) -> bool:
    head = obs.splitlines()[0] if obs else ""
    return not is_error(obs) and "passed" in head and not re.search(r"\b(failed|error)\b", head)


def failing_tests(obs: str) -> list[str]:
    """Ids on `FAILED ` / `ERROR ` lines. Every line counts, the output tail's short test summary
    too (`FAILED id - message`): the expert's transcripts state this count, so it stays as it was
    (`parse_test_summary(obs).not_passed` is the exact list)."""
    if is_error(obs):
        return []
    return [l.split(" ", 1)[1] for l in obs.splitlines() if l.startswith(("FAILED ", "ERROR "))]


# --------------------------------------------------------------------------- localize
NO_FAILING = "no failing tests: nothing to localize"
NO_SUSPICIOUS = "failing tests covered no lines outside the test files"
# The path is the shortest prefix followed by `:<line>  score=`: code after `| ` may hold anything.
_LOC = re.compile(r"^\s*\d+\.\s+(.+?):(\d+)\s+score=([\d.]+|inf)")


def format_localize(formula: str, n_failing: int, rows: list[tuple[str, int, float, str]]) -> str:
    """Ranked (file, line, score, code) rows, best first."""
    if not rows:
        return NO_SUSPICIOUS
    out = [f"suspicious lines ({formula}; {n_failing} failing test(s)):"]
    out += [f"{i:2d}. {file}:{line}  score={score:.3f}  | {code}"
            for i, (file, line, score, code) in enumerate(rows, 1)]
    return "\n".join(out)


def parse_localize(obs: str) -> list[tuple[str, int, float]]:
    """(file, line, score rounded to 3 places) per ranked line, best first."""
    if is_error(obs):
        return []
    out = []
    for line in obs.splitlines():
        m = _LOC.match(line)
        if m:
            out.append((m.group(1), int(m.group(2)), float(m.group(3))))
    return out


# --------------------------------------------------------------------------- propose_edits
_CAND = re.compile(r"^\[(\d+)\]\s+(.*)$")


def format_candidates(path: str, line: int, cands: list[tuple[int, str]]) -> str:
    """(index, description) per candidate edit of `path`:`line`."""
    if not cands:
        return f"no candidate edits for {path}:{line}"
    return "\n".join([f"candidates for {path}:{line}:"] + [f"[{i}] {desc}" for i, desc in cands])


def parse_candidates(obs: str) -> list[tuple[int, str]]:
    if is_error(obs):
        return []
    return [(int(m.group(1)), m.group(2)) for m in map(_CAND.match, obs.splitlines()) if m]


# --------------------------------------------------------------------------- apply_edit
# The path is the shortest prefix followed by `:<line>: \``: the code line may hold anything.
_APPLIED = re.compile(r"applied \[(\d+)\] to (.*?):(\d+): `(.*)`")


@dataclass(frozen=True)
class Applied:
    index: int
    path: str
    line: int
    text: str            # the edited line as it now reads, stripped


def format_applied(index: int, path: str, line: int, new_line: str) -> str:
    return f"applied [{index}] to {path}:{line}: `{new_line.strip()}`"


def parse_applied(obs: str) -> Applied | None:
    """None for an error, or when anything follows the line (e.g. the env's turn-limit note)."""
    m = None if is_error(obs) else _APPLIED.fullmatch(obs)
    return Applied(int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)) if m else None
