"""The repair tools: OpenAI function schemas (`TOOL_SCHEMAS`) and their implementations.

Each implementation takes the `RepairEnv` (sandboxes.env) and the validated arguments and returns
the observation text (the texts agents parse back are formatted in `sandboxes.observations`,
beside their parsers). They raise `ToolError` for the agent's mistakes (the env turns it into an
"error: ..." observation) and never touch the host outside the episode's worktree: file access
goes through the runtime's symlink-safe helpers, commands run inside the sandbox.
"""
from __future__ import annotations

from sandboxes import observations


class ToolError(Exception):
    """The agent's call cannot be served; the message is shown to the agent after 'error: '."""


def _fn(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required, "additionalProperties": False}}}


_PATH = {"type": "string", "description": "Path relative to the repository root, e.g. solution.py"}
_LINE = {"type": "integer", "minimum": 1, "description": "1-based line number"}
TOOL_SCHEMAS: list[dict] = [
    _fn("view_issue", "Read the issue report from the issue tracker.",
        {"issue_id": {"type": "string", "description": "Issue id; defaults to the task's issue"}}, []),
    _fn("list_files", "List the files under a folder of the repository.",
        {"path": {**_PATH, "description": "Folder relative to the repository root (default '.')"}}, []),
    _fn("read_file", "Read a file with line numbers, optionally only a line range.",
        {"path": _PATH, "start_line": _LINE, "end_line": _LINE}, ["path"]),
    _fn("search", "Search the repository for text (grep); fixed string unless regex is true.",
        {"pattern": {"type": "string"}, "path": {**_PATH, "description": "Folder or file to search (default '.')"},
         "regex": {"type": "boolean"}}, ["pattern"]),
    _fn("edit", "Replace one exact occurrence of old text with new text in a file.",
        {"path": _PATH, "old": {"type": "string", "description": "Exact text to replace; must occur once"},
         "new": {"type": "string", "description": "Replacement text"}}, ["path", "old", "new"]),
    _fn("write_file", "Create a file, or replace its whole content.",
        {"path": _PATH, "content": {"type": "string", "description": "The complete new file content"}},
        ["path", "content"]),
    _fn("apply_patch", "Apply a unified diff (git format, paths relative to the repository root) "
        "to the working tree.",
        {"patch": {"type": "string", "description": "The unified diff, e.g. from `git diff`"}}, ["patch"]),
    _fn("run_tests", "Run the test suite, or only the given pytest node ids.",
        {"tests": {"type": "array", "items": {"type": "string"},
                   "description": "pytest node ids, e.g. test_solution.py::test_check_00; all when omitted"}}, []),
    _fn("localize", "Run the tests with coverage and rank the most suspicious lines of the code "
        "under test (spectrum-based fault localisation; test files and helpers are never ranked).",
        {"top": {"type": "integer", "minimum": 1, "maximum": 50, "description": "How many lines (default 10)"},
         "formula": {"type": "string", "enum": ["ochiai", "tarantula", "dstar"]},
         "tests": {"type": "array", "items": {"type": "string"},
                   "description": "pytest node ids or files to run (include some passing tests for "
                                  "contrast); the whole suite when omitted"}}, []),
    _fn("propose_edits", "List indexed candidate single-token fixes for one line of a Python file.",
        {"path": _PATH, "line": _LINE}, ["path", "line"]),
    _fn("apply_edit", "Apply candidate fix number `index` from propose_edits for that file and line.",
        {"path": _PATH, "line": _LINE, "index": {"type": "integer", "minimum": 0}}, ["path", "line", "index"]),
    _fn("submit", "Finish: submit the current changes with a root-cause explanation (function, line, "
        "what was wrong). The verifiers then score the episode.",
        {"explanation": {"type": "string"}}, ["explanation"]),
    # The tools real coding agents are built on, so their logs train and their policies act here:
    # mini-swe-agent's one tool, and the file editor of SWE-agent and OpenHands (same commands).
    _fn("bash", "Run a bash command in the repository root (the sandbox's limits apply; no network). "
        "Returns its output and exit code.",
        {"command": {"type": "string", "description": "The command line, e.g. `python -m pytest -x -q`"}},
        ["command"]),
    _fn("str_replace_editor", "View, create and edit files: `view` a file (with line numbers, optional "
        "view_range) or folder, `create` a file with file_text, `str_replace` one exact occurrence of old_str "
        "with new_str, `insert` new_str after line insert_line (0: at the top), `undo_edit` the last edit of "
        "a file.",
        {"command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
         "path": {**_PATH, "description": "Path relative to the repository root (a leading /repo/, /testbed/ "
                                          "or /workspace/ means the root)"},
         "file_text": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"},
         "insert_line": {"type": "integer", "minimum": 0},
         "view_range": {"type": "array", "items": {"type": "integer"},
                        "description": "[start, end] 1-based lines; end -1: to the end of the file"}},
        ["command", "path"]),
]
SCHEMAS_BY_NAME = {s["function"]["name"]: s for s in TOOL_SCHEMAS}
TOOL_NAMES = tuple(SCHEMAS_BY_NAME)
_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}


def check_arguments(name: str, args: dict) -> dict:
    """Validate against the tool's JSON schema (the subset used above); ToolError on mismatch."""
    params = SCHEMAS_BY_NAME[name]["function"]["parameters"]
    props = params["properties"]
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise ToolError(f"{name} got unknown argument(s) {unknown}; expected {sorted(props)}")
    missing = [k for k in params["required"] if k not in args]
    if missing:
        raise ToolError(f"{name} is missing required argument(s) {missing}")
    out = {}
    for k, v in args.items():
        spec = props[k]
        if v is None and k not in params["required"]:
            continue
        want = _TYPES[spec["type"]]
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise ToolError(f"argument {k!r} of {name} must be {spec['type']}, got {type(v).__name__}")
        item = (spec.get("items") or {}).get("type", "string")
        if spec["type"] == "array" and not all(isinstance(x, _TYPES[item]) and not isinstance(x, bool) for x in v):
            raise ToolError(f"argument {k!r} of {name} must be a list of {item}s")
        if "minimum" in spec and v < spec["minimum"] or "maximum" in spec and v > spec["maximum"]:
            raise ToolError(f"argument {k!r} of {name} is out of range: {v}")
        if "enum" in spec and v not in spec["enum"]:
            raise ToolError(f"argument {k!r} of {name} must be one of {spec['enum']}")
        out[k] = v
    return out


# --------------------------------------------------------------------------- implementations
def view_issue(env, issue_id: str | None = None) -> str:
    from sandboxes.issue_tracker import IssueNotFound, fetch_issue

    iid = issue_id or env.bundle.issue_id or env.bundle.task_id
    try:
        issue = fetch_issue(env.tracker.url, env.tracker_ns, iid)
    except IssueNotFound:
        raise ToolError(f"issue {iid!r} not found in the tracker") from None
    return (f"Issue {issue['id']} ({issue['repo']}) [{issue['state']}; labels: {', '.join(issue['labels'])}; "
            f"reported by {issue['reporter']}]\n\n{issue['title']}\n\n{issue['body']}")


def list_files(env, path: str = ".") -> str:
    return observations.format_file_list(path, env.episode.list_files(path or "."))


def read_file(env, path: str, start_line: int = 1, end_line: int | None = None) -> str:
    lines = env.episode.read_file(path).splitlines()
    end = min(end_line or len(lines), len(lines))
    if lines and (start_line > len(lines) or end < start_line):
        raise ToolError(f"line range {start_line}-{end_line} is outside {path} (1-{len(lines)})")
    return observations.format_source(path, lines, start_line, end)


def search(env, pattern: str, path: str = ".", regex: bool = False) -> str:
    if not pattern:
        raise ToolError("pattern must not be empty")
    from sandboxes.safefs import resolve
    resolve(env.episode.workdir, path or ".")  # PathEscape before anything runs
    argv = ["grep", "-rnI", "--exclude-dir=.git", "-E" if regex else "-F", "-e", pattern, "--", path or "."]
    r = env.episode.run(argv, timeout=10, deterministic=True)          # grep changes nothing
    if r.infra_error:
        raise env.infra(r.infra_error)
    if r.returncode == 1:
        return f"no matches for {pattern!r}"
    if r.returncode != 0:
        raise ToolError(f"search failed: {(r.stderr or r.stdout).strip()[:300]}")
    return "\n".join(l.removeprefix("./") for l in r.stdout.splitlines())


def edit(env, path: str, old: str, new: str) -> str:
    if not old:
        raise ToolError("old must be non-empty text that occurs exactly once in the file")
    text = env.episode.read_file(path)
    n = text.count(old)
    if n == 0:
        raise ToolError(f"old text not found in {path} (it must match exactly, including indentation)")
    if n > 1:
        raise ToolError(f"old text occurs {n} times in {path}; include more surrounding lines so it is unique")
    at = text.index(old)
    env.episode.write_file(path, text[:at] + new + text[at + len(old):])
    first = text.count("\n", 0, at) + 1
    last = first + old.rstrip("\n").count("\n")
    return f"edited {path}: replaced line(s) {first}-{last} with {new.rstrip(chr(10)).count(chr(10)) + 1} line(s)"


def write_file(env, path: str, content: str) -> str:
    existed = True
    try:
        env.episode.read_bytes(path)
    except OSError:            # missing (or its folder is): write_file below says if it escapes
        existed = False
    rel = env.episode.write_file(path, content)
    n = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
    return f"{'replaced' if existed else 'created'} {rel} ({n} line(s))"


def apply_patch(env, patch: str) -> str:
    from sandboxes.verifiers.diffs import DiffError, touched_paths
    if not patch.strip():
        raise ToolError("patch is empty")
    try:
        paths = touched_paths(patch)
    except DiffError as e:
        raise ToolError(f"not a unified diff: {e}") from None
    if not paths:
        raise ToolError("not a unified diff: no ---/+++ file headers")
    from sandboxes.safefs import resolve
    for p in paths:
        resolve(env.episode.workdir, p)              # PathEscape before git sees it
    r = env.episode.run(["git", "apply", "--whitespace=nowarn", "--recount", "-"], stdin=patch,
                        deterministic=True)
    if r.infra_error:
        raise env.infra(r.infra_error)
    if r.returncode != 0:
        raise ToolError(f"patch does not apply: {(r.stderr or r.stdout).strip()[:600]}")
    return f"applied patch to {len(paths)} file(s): {', '.join(paths[:20])}"


def run_tests(env, tests: list[str] | None = None) -> str:
    rep = env.episode.run_tests(tests or None)
    if rep.infra_error:
        raise env.infra(rep.infra_error)
    env.last_outcomes = dict(rep.outcomes)
    return observations.format_test_summary(rep, env.max_output_chars)


_TEST_TOKENS = {"test", "tests", "testing", "testcase", "testcases", "testdata", "fixtures",
                "conftest"}


def is_test_file(path: str, test_files=()) -> bool:
    """A file of the test side: named like a test or conftest, in a test folder, or a file the
    task's test ids name. Localisation never ranks them (their lines are not the bug)."""
    import re
    parts = path.split("/")
    name = parts[-1]
    if path in test_files or name == "conftest.py" or name.startswith("test_") or \
            name.endswith(("_test.py", "_tests.py")):
        return True
    return any(tok in _TEST_TOKENS for d in parts[:-1] for tok in re.split(r"[_\-.]", d.lower()))


def localize(env, top: int = 10, formula: str = "ochiai", tests: list[str] | None = None) -> str:
    from fnmatch import fnmatchcase

    from sandboxes.localize import localize as sbfl

    rep = env.episode.run_tests(tests or None, coverage=True)
    if rep.infra_error:
        raise env.infra(rep.infra_error)
    if rep.timed_out or rep.agent_fault:
        why = "timed out (a test may loop)" if rep.timed_out else f"crashed: {rep.agent_fault[:200]}"
        raise ToolError(f"the coverage run {why}; localize on fewer tests with "
                        "tests=[...] (e.g. one test file)")
    if not any(o in ("failed", "error") for o in rep.outcomes.values()):
        return observations.NO_FAILING
    b = env.bundle
    named = {t.split("::", 1)[0] for t in (*b.fail_to_pass, *b.pass_to_pass, *rep.outcomes)}
    cov = {t: {f: ls for f, ls in files.items()
               if not is_test_file(f, named) and not any(fnmatchcase(f, g) for g in b.forbidden_paths)}
           for t, files in (rep.coverage or {}).items()}
    ranked = [s for s in sbfl(cov, rep.outcomes, formula=formula) if s.score > 0][:top]
    src: dict[str, list[str]] = {}
    rows = []
    for s in ranked:
        if s.file not in src:
            try:
                src[s.file] = env.episode.read_file(s.file).splitlines()
            except OSError:
                src[s.file] = []
        code = src[s.file][s.line - 1].strip() if s.line <= len(src[s.file]) else ""
        rows.append((s.file, s.line, s.score, code))
    return observations.format_localize(formula, sum(o != "passed" for o in rep.outcomes.values()), rows)


def _candidates(env, path: str, line: int):
    from sandboxes.candidates import propose_edits as propose

    source = env.episode.read_file(path)
    n = len(source.splitlines())
    if line > n:
        raise ToolError(f"{path} has {n} lines; line {line} does not exist")
    return source, propose(source, line)


def propose_edits(env, path: str, line: int) -> str:
    _, cands = _candidates(env, path, line)
    return observations.format_candidates(path, line, [(c.index, c.description) for c in cands])


def apply_edit(env, path: str, line: int, index: int) -> str:
    source, cands = _candidates(env, path, line)
    if index >= len(cands):
        raise ToolError(f"no candidate {index} for {path}:{line} ({len(cands)} candidates; call propose_edits)")
    c = cands[index]
    env.episode.write_file(path, c.apply(source))
    return observations.format_applied(index, path, line, c.new_line)


def submit(env, explanation: str) -> str:
    r = env.finish(explanation)
    comps = " ".join(f"{k}={v:.2f}" for k, v in r.components.items())
    value = "n/a" if r.value is None else f"{r.value:.3f}"
    return f"submitted: reward={value} status={r.status} {comps}".rstrip()


# --------------------------------------------------------------------------- agent tools
BASH_TIMEOUT_S = 60            # one command; the episode's own wall limit still bounds it


def bash(env, command: str) -> str:
    """mini-swe-agent's tool: the command in the worktree, inside the sandbox (no network, the
    episode's limits). Output and exit code come back; a timeout is the agent's (its command ran)."""
    if not command.strip():
        raise ToolError("command must not be empty")
    r = env.episode.run(["bash", "-c", command], timeout=BASH_TIMEOUT_S)
    if r.infra_error:
        raise env.infra(r.infra_error)
    out = ((r.stdout or "") + (r.stderr or "")).rstrip()
    tail = "timed out (killed)" if r.timed_out else f"exit code {r.returncode}"
    return f"{out}\n[{tail}]" if out else f"[{tail}]"


_REPO_ROOTS = ("/repo/", "/testbed/", "/workspace/")


def _repo_path(path: str) -> str:
    """SWE-agent, SWE-bench and OpenHands name files by absolute paths under the folder they mount
    the repository at; here those roots are the repository root."""
    for root in _REPO_ROOTS:
        if path.startswith(root) or path == root.rstrip("/"):
            return path[len(root):] or "."
    return path


def _numbered(lines: list[str], start: int) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, start))


def _snippet(text: str, first: int, last: int, context: int = 4) -> str:
    lines = text.splitlines()
    lo, hi = max(1, first - context), min(len(lines), last + context)
    return _numbered(lines[lo - 1:hi], lo)


def str_replace_editor(env, command: str, path: str, file_text: str | None = None, old_str: str | None = None,
                       new_str: str | None = None, insert_line: int | None = None,
                       view_range: list[int] | None = None) -> str:
    """SWE-agent's and OpenHands' file editor over the worktree (symlink-safe file access); each
    edit keeps the file's previous text so `undo_edit` can put it back."""
    path = _repo_path(path)
    history = env.__dict__.setdefault("editor_history", {})
    if command == "view":
        try:
            text = env.episode.read_file(path)
        except IsADirectoryError:
            return observations.format_file_list(path, env.episode.list_files(path))
        lines = text.splitlines()
        start, end = 1, len(lines)
        if view_range:
            if len(view_range) != 2:
                raise ToolError("view_range must be [start, end]")
            start, end = view_range[0], (len(lines) if view_range[1] == -1 else view_range[1])
            if not 1 <= start <= max(1, len(lines)) or end < start:
                raise ToolError(f"view_range {view_range} is outside {path} (1-{len(lines)})")
        return f"{path}:\n" + _numbered(lines[start - 1:end], start)
    if command == "create":
        if file_text is None:
            raise ToolError("create needs file_text")
        try:
            env.episode.read_bytes(path)
        except OSError:
            pass
        else:
            raise ToolError(f"{path} already exists; use str_replace to change it")
        env.episode.write_file(path, file_text)
        history.setdefault(path, []).append(None)
        return f"created {path}"
    if command == "undo_edit":
        if not history.get(path):
            raise ToolError(f"no edit of {path} to undo")
        previous = history[path].pop()
        if previous is None:
            env.episode.write_file(path, "")
            return f"undid the creation of {path} (now empty)"
        env.episode.write_file(path, previous)
        return f"undid the last edit of {path}"
    text = env.episode.read_file(path)
    if command == "str_replace":
        if not old_str:
            raise ToolError("str_replace needs old_str: exact text that occurs once in the file")
        n = text.count(old_str)
        if n != 1:
            raise ToolError(f"old_str occurs {n} times in {path}; it must occur exactly once" if n else
                            f"old_str not found in {path} (it must match exactly, including indentation)")
        at = text.index(old_str)
        new = text[:at] + (new_str or "") + text[at + len(old_str):]
        first = text.count("\n", 0, at) + 1
        last = first + (new_str or "").count("\n")
    elif command == "insert":
        if insert_line is None or new_str is None:
            raise ToolError("insert needs insert_line and new_str")
        lines = text.splitlines(keepends=True)
        if insert_line > len(lines):
            raise ToolError(f"insert_line {insert_line} is past the end of {path} ({len(lines)} lines)")
        block = new_str if new_str.endswith("\n") else new_str + "\n"
        if lines and insert_line == len(lines) and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        new = "".join(lines[:insert_line]) + block + "".join(lines[insert_line:])
        first, last = insert_line + 1, insert_line + block.count("\n")
    else:
        raise ToolError(f"unknown command {command!r}")
    env.episode.write_file(path, new)
    history.setdefault(path, []).append(text)
    return f"edited {path}:\n" + _snippet(new, first, last)


# The schemas are the one list of tool names: each names the function below that serves it.
IMPLEMENTATIONS = {name: globals()[name] for name in TOOL_NAMES}
