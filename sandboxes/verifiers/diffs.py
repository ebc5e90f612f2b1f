"""Unified diffs (parsed with unidiff): touched paths, and applying a diff to in-memory files."""
from __future__ import annotations


class DiffError(ValueError):
    """The diff is malformed or does not apply to the files it names."""


def _strip(path: str | None) -> str | None:
    if path is None or path == "/dev/null":
        return None
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse(diff: str):
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError
    try:
        return PatchSet(diff)
    except UnidiffParseError as exc:
        raise DiffError(str(exc)) from exc


def touched_paths(diff: str) -> list[str]:
    """Every path the diff reads or writes (both sides of a rename), in order."""
    out: list[str] = []
    for pf in parse(diff):
        for p in (_strip(pf.source_file), _strip(pf.target_file)):
            if p and p not in out:
                out.append(p)
    return out


def apply_diff(files: dict[str, str], diff: str) -> dict[str, str]:
    """Return a copy of `files` with the diff applied; DiffError if a hunk does not match."""
    out = dict(files)
    for pf in parse(diff):
        src, dst = _strip(pf.source_file), _strip(pf.target_file)
        old = out.get(src, "") if src else ""
        if src and src not in out:
            raise DiffError(f"diff modifies {src}, which does not exist")
        lines = old.splitlines(keepends=True)
        new: list[str] = []
        pos = 0
        for hunk in pf:
            start = max(hunk.source_start - 1, 0)
            if start < pos:
                raise DiffError(f"overlapping hunks in {src}")
            new += lines[pos:start]
            pos = start
            for ln in hunk:
                if ln.is_added:
                    new.append(ln.value)
                    continue
                if pos >= len(lines) or lines[pos].rstrip("\r\n") != ln.value.rstrip("\r\n"):
                    raise DiffError(f"hunk does not apply to {src} at line {pos + 1}")
                if ln.is_context:
                    new.append(lines[pos])
                pos += 1
        new += lines[pos:]
        if src and src != dst:
            out.pop(src, None)
        if dst:
            out[dst] = "".join(new)
    return out


def make_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """Unified diff (a/ b/ prefixes) from one file mapping to another."""
    import difflib
    parts = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        parts.append("".join(difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            f"a/{path}" if a is not None else "/dev/null",
            f"b/{path}" if b is not None else "/dev/null")))
    return "".join(parts)
