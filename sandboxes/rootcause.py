"""A task's root cause: recorded in its metadata, or derived from its reference patch.

The judge's root-cause half needs to know where the bug is and what fixes it (`file`,
`function`, `line`, the faulty `line_text`, and for the cause the changed span: `col`,
`end_col`, the wrong text `mutated` and its correction `original`). The HumanEval suite records
all of it. Imported tasks (SWE-bench style, Harbor) record at most a file and a function, so a
perfect explanation could never earn that half. `root_cause(bundle)` fills in what the metadata
lacks from the reference patch (`fix_diff` or SWE-bench's gold patch) applied to the file as
pinned:

* the file and first changed line of the patch's first Python hunk, and the function around it;
* when that change is one line replaced by one line, the span of tokens that differ (so
  `n ^= n - 1` -> `n &= n - 1` gives mutated `^=`, original `&=`; an insertion gives an empty
  mutated span), which is what the rubric judge checks a claimed fix against.

`source` says where the fields came from: "metadata", "reference patch" (some derived), or
"none" (no root cause recorded and no reference patch: the judge says so in its rationale).
"""
from __future__ import annotations

import io
import json
import tokenize
from functools import lru_cache

_FIELDS = ("file", "function", "line", "col", "end_col", "original", "mutated", "line_text")


def task_source(bundle, path: str) -> str | None:
    """The file as pinned: inline, or read from the task's repository at its commit."""
    if path in (bundle.files or {}):
        return bundle.files[path]
    if bundle.repo_path and bundle.commit:
        return _git_show(bundle.repo_path, bundle.commit, path)
    return None


@lru_cache(maxsize=256)
def _git_show(repo: str, commit: str, path: str) -> str | None:
    import subprocess
    r = subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True)
    return r.stdout.decode("utf-8", "replace") if r.returncode == 0 else None


def first_change(diff: str) -> dict | None:
    """{"file", "line", "old": [lines], "new": [lines]} of the first run of changed lines in the
    first Python file the diff touches (line: in the old file; for a pure insertion, the line it
    follows). Parsed with unidiff (`sandboxes.verifiers.diffs.parse`); a malformed diff: None."""
    from sandboxes.verifiers.diffs import DiffError, _strip, parse

    try:
        files = parse(diff)
    except DiffError:
        return None
    for pf in files:
        path = _strip(pf.target_file) or _strip(pf.source_file)
        if not path or not path.endswith(".py"):
            continue
        for hunk in pf:
            cur, before = None, hunk.source_start - 1
            for ln in hunk:
                if ln.is_removed or ln.is_added:
                    if cur is None:
                        line = ln.source_line_no if ln.is_removed else max(before, 1)
                        cur = {"file": path, "line": line, "old": [], "new": []}
                    cur["old" if ln.is_removed else "new"].append(ln.value.rstrip("\n"))
                elif cur is not None:
                    return cur
                elif ln.source_line_no is not None:
                    before = ln.source_line_no
            if cur is not None:
                return cur
    return None


def _tokens(line: str) -> list[tuple[str, int, int]]:
    """(text, start col, end col) of one line's tokens (whitespace and comments left out)."""
    out = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(line).readline):
            if t.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT,
                          tokenize.DEDENT, tokenize.ENDMARKER) or t.start[0] != 1:
                continue
            out.append((t.string, t.start[1], t.end[1]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def token_span(old: str, new: str) -> tuple[int, int, str, str] | None:
    """(col, end_col, mutated, original): the tokens of `old` that differ from `new`, with what
    replaces them (both may be empty for a pure insertion or deletion); None when equal."""
    a, b = _tokens(old), _tokens(new)
    if not a and not b or [t[0] for t in a] == [t[0] for t in b]:
        return None
    p = 0
    while p < min(len(a), len(b)) and a[p][0] == b[p][0]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[-1 - s][0] == b[-1 - s][0]:
        s += 1
    a_mid, b_mid = a[p:len(a) - s], b[p:len(b) - s]
    if a_mid:
        col, end = a_mid[0][1], a_mid[-1][2]
    else:                              # nothing removed: the insertion point
        col = end = a[p - 1][2] if p else (a[p][1] if a else 0)
    if b_mid:
        n0, n1 = b_mid[0][1], b_mid[-1][2]
        original = new[n0:n1]
        if not a_mid:                  # keep the spacing the insertion needs
            original = new[b[p - 1][2] if p else 0:n1] if p else new[:n1]
    else:
        original = ""
    return col, end, old[col:end], original


def derive(bundle) -> dict:
    """Root-cause fields derived from the task's reference patch ({} when there is none)."""
    from sandboxes.agents.base import enclosing_function
    from sandboxes.verifiers.hygiene import reference_diff
    fix = reference_diff(bundle)
    ch = first_change(fix) if fix else None
    if not ch:
        return {}
    src = task_source(bundle, ch["file"])
    out = {"file": ch["file"], "line": ch["line"]}
    lines = src.splitlines() if src else []
    if src:
        fn = enclosing_function(src, ch["line"])
        if fn:
            out["function"] = fn
    if ch["old"] and 1 <= ch["line"] <= len(lines):
        out["line_text"] = lines[ch["line"] - 1].strip()
    if len(ch["old"]) == 1 and len(ch["new"]) == 1 and lines and lines[ch["line"] - 1] == ch["old"][0]:
        span = token_span(ch["old"][0], ch["new"][0])
        if span:
            col, end, mutated, original = span
            out.update(col=col, end_col=end, mutated=mutated, original=original)
    return out


def root_cause(bundle) -> dict:
    """The task's root cause: its metadata's, completed from the reference patch where fields are
    missing (only when both name the same file). `source` says which."""
    meta = (bundle.metadata or {}).get("root_cause") or {}
    key = (bundle.task_id, bundle.repo_path, bundle.commit, json.dumps(meta, sort_keys=True, default=str),
           json.dumps({k: (bundle.metadata or {}).get(k) for k in ("fix_diff", "gold_patch")}, sort_keys=True))
    return dict(_cached(key, bundle))


_CACHE: dict = {}


def _cached(key, bundle) -> dict:
    if key in _CACHE:
        return _CACHE[key]
    meta = dict((bundle.metadata or {}).get("root_cause") or {})
    if all(meta.get(k) is not None for k in _FIELDS):
        out = {**meta, "source": "metadata"}
    else:
        try:
            derived = derive(bundle)
        except (OSError, ValueError):
            derived = {}
        if derived and (not meta.get("file") or meta["file"] == derived.get("file")):
            out = {**derived, **{k: v for k, v in meta.items() if v is not None}, "source": "reference patch"}
        else:
            out = {**meta, "source": "metadata" if meta else "none"}
    if len(_CACHE) > 4096:
        _CACHE.clear()
    _CACHE[key] = out
    return out
