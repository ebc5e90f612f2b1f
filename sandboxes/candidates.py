"""`propose_edits`: the IDE-style quick-fix list for one line of a Python file.

Candidates are single-token edits from the same symmetric operator tables that plant the suite's
bugs (operator swaps, +-1 constants, `not` drop/add, wrong-variable swap among names bound in the
enclosing function, adjacent-argument swap), so the true fix of every suite task is on the list
of its faulty line. Ordering is deterministic: operators/constants/negation by column, then
variable swaps; indices are stable for the same source.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    index: int
    line: int
    col: int
    end_col: int
    old: str
    new: str
    family: str        # comparison | arithmetic | boolean | constant | negation | variable | arguments
    kind: str
    description: str
    new_line: str      # the line as it reads after the edit (no trailing newline)

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        if text[self.col:self.end_col] != self.old:
            raise ValueError(f"candidate {self.index} does not match line {self.line}")
        lines[self.line - 1] = text[:self.col] + self.new + text[self.end_col:]
        return "".join(lines)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def propose_edits(source: str, line: int) -> list[Candidate]:
    """Indexed candidate edits for `line` (1-based) of `source`; [] when none or it won't parse."""
    from sandboxes import pyast
    from sandboxes.humaneval.operators import all_edits

    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return []
    out = []
    for i, e in enumerate(all_edits(source, lines={line}, tree=tree)):
        text = lines[line - 1]
        new_line = text[:e.col] + e.new + text[e.end_col:]
        out.append(Candidate(i, e.line, e.col, e.end_col, e.old, e.new, e.family, e.kind,
                             f"{e.description}: `{new_line.strip()}`", new_line))
    return out


def apply_candidate(source: str, line: int, index: int) -> str:
    """The source after candidate `index` of `propose_edits(source, line)` (IndexError if none)."""
    cands = propose_edits(source, line)
    if not 0 <= index < len(cands):
        raise IndexError(f"no candidate {index} on line {line} ({len(cands)} candidates)")
    return cands[index].apply(source)
