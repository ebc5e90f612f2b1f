"""What every reference agent shares: a Session that records OpenAI chat messages around the env,
the AgentRun result, and the Editor that applies and undoes candidate edits. The tools'
observation texts are parsed with `sandboxes.observations` (beside their formatters).

Agents see only observations (strings) and act only through `Session.call`, i.e. the env's tools,
so their transcripts are exactly what a model-driven policy would produce.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from sandboxes.observations import parse_applied


@dataclass
class AgentRun:
    agent_id: str
    task_id: str
    messages: list[dict]              # OpenAI chat form: system, user, assistant tool_calls, tool results
    reward: object                    # sandboxes.verifiers.Reward (None only if the agent never finished)
    steps: list                       # sandboxes.env.Step records
    tools: list[dict]                 # the function schemas the agent was offered
    latency_s: float                  # measured wall time of the whole episode
    sandbox_s: float                  # time spent in tool calls (sandbox work) incl. final verification
    patch: str = ""
    explanation: str = ""
    attempts: int = 0                 # candidate edits tried (harness baselines / expert)
    fixed_at: int | None = None       # 1-based attempt whose test run passed everything
    notes: dict = field(default_factory=dict)

    @property
    def tests_passed(self) -> bool | None:
        if self.reward is None or self.reward.status == "infra_failure":
            return None
        return self.reward.components.get("tests") == 1.0

    @property
    def accepted(self) -> bool:
        return bool(self.reward is not None and self.reward.status == "scored" and self.tests_passed)


class Session:
    """Drives one env and writes the transcript. `call` returns the observation text."""

    def __init__(self, env, agent_id: str):
        self.env, self.agent_id = env, agent_id
        self.t0 = time.monotonic()
        self.messages = env.reset()
        self.attempts, self.fixed_at, self.notes = 0, None, {}

    @property
    def done(self) -> bool:
        return self.env.done

    @property
    def turns_left(self) -> int:
        return self.env.max_turns - self.env.turns

    def call(self, tool: str, arguments: dict | str | None = None, thought: str = "") -> str:
        if self.env.done:   # turn limit hit earlier: nothing more goes into the transcript
            return "error: the episode is over"
        n = len(self.env.steps)
        cid = f"call_{n:02d}"
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        self.messages.append({"role": "assistant", "content": thought or None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": tool, "arguments": raw}}]})
        obs = self.env.step(tool, arguments)
        self.messages.append({"role": "tool", "tool_call_id": cid, "name": tool, "content": obs})
        return obs

    def submit(self, explanation: str, thought: str = "") -> str:
        return self.call("submit", {"explanation": explanation}, thought or "Submitting the fix.")

    def finish(self) -> AgentRun:
        env = self.env
        if not env.done:   # the agent stopped without submitting: score what is there
            env.finish("")
        return AgentRun(self.agent_id, env.bundle.task_id, self.messages, env.reward, list(env.steps),
                        env.tool_schemas(), time.monotonic() - self.t0, env.sandbox_s, env.patch,
                        env.explanation or "", self.attempts, self.fixed_at, dict(self.notes))


def enclosing_function(source: str, line: int) -> str | None:
    import ast

    from sandboxes import pyast

    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno \
                and (best is None or node.lineno > best.lineno):
            best = node
    return best.name if best else None


def function_lines(source: str, name: str | None) -> list[int]:
    """Code lines of function `name` (all functions if None or absent), without the def line,
    the docstring or blank lines."""
    import ast

    from sandboxes import pyast

    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return []
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    chosen = [f for f in funcs if f.name == name] or funcs
    text = source.splitlines()
    lines: set[int] = set()
    for f in chosen:
        body = f.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]
        for stmt in body:
            lines.update(range(stmt.lineno, stmt.end_lineno + 1))
    return sorted(l for l in lines if text[l - 1].strip() and not text[l - 1].strip().startswith("#"))


def issue_function(issue_text: str, source: str) -> str | None:
    """The first backticked name in the issue that is defined in `source`."""
    for name in re.findall(r"`([A-Za-z_]\w*)`", issue_text):
        if re.search(rf"^\s*def {re.escape(name)}\b", source, re.MULTILINE):
            return name
    return None


def unique_window(current: str, original: str, line: int) -> tuple[str, str] | None:
    """(old, new) texts around `line` for an `edit` that turns `current` back into `original`:
    the smallest block of whole lines that occurs exactly once in `current`."""
    cur, org = current.splitlines(keepends=True), original.splitlines(keepends=True)
    if len(cur) != len(org):
        return None
    i = line - 1
    for r in range(len(cur)):
        lo, hi = max(0, i - r), min(len(cur), i + r + 1)
        old = "".join(cur[lo:hi])
        if current.count(old) == 1:
            return old, "".join(org[lo:hi])
    return None


class Editor:
    """Tracks the agent's view of one file so it can undo a candidate edit through `edit`."""

    def __init__(self, session: Session, path: str, source: str):
        self.s, self.path, self.original, self.current = session, path, source, source
        self.changed_line: int | None = None

    def apply(self, line: int, index: int, thought: str = "") -> bool:
        applied = parse_applied(self.s.call("apply_edit", {"path": self.path, "line": line, "index": index},
                                            thought))
        if applied is None:
            return False
        lines = self.current.splitlines(keepends=True)
        old = lines[line - 1]
        # The observation shows the edited line stripped; a candidate edits a token inside the
        # line, so the file keeps the old line's indent, trailing whitespace and line ending. The
        # view used to drop the trailing whitespace, and a later revert's window then missed the
        # real file (seen on humaneval-088-927008739f: attempts stacked).
        body = old.rstrip("\r\n")
        indent, ending = body[:len(body) - len(body.lstrip())], old[len(body):]
        trailing = body[len(body.rstrip()):] if body.strip() else ""
        lines[line - 1] = indent + applied.text + trailing + ending
        self.current, self.changed_line = "".join(lines), line
        return True

    def revert(self, thought: str = "That did not fix it; reverting the edit.") -> bool:
        if self.current == self.original or self.changed_line is None:
            return True
        win = unique_window(self.current, self.original, self.changed_line)
        if win is None:
            return False
        obs = self.s.call("edit", {"path": self.path, "old": win[0], "new": win[1]}, thought)
        if obs.startswith("error:"):
            return False
        self.current, self.changed_line = self.original, None
        return True
