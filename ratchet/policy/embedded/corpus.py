"""The tokenizer corpus of the embedded base policy, and the rule that keeps it clean.

What goes in (documented in docs/training.md):
  - train-split repair tasks: the prompt a policy sees (system prompt, tool signatures, the issue)
    and the buggy source as `read_file` shows it (numbered lines), rendered through the chat
    template so the template's own strings are frequent;
  - optionally, train-split trajectories (e.g. one tenant's consented `training_set`).
What never goes in: a task or trajectory whose split is not "train" (validation, holdout, or
unassigned). `CorpusError` is raised instead of silently dropping it, so a wiring mistake
upstream fails loudly. Tasks are the product's own generated problems, not tenant data, which is
why the default corpus uses them: a tokenizer shared by every tenant's candidates must not be
trained on one tenant's logs.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping


class CorpusError(ValueError):
    """A non-train item was offered to the base policy's corpus."""


def _check_train(row: Mapping, what: str) -> None:
    split = row.get("split")
    if split != "train":
        raise CorpusError(f"{what} {row.get('task_id') or row.get('trajectory_id')!r} has split {split!r}; "
                          "only train-split items may enter the base policy's corpus")


def numbered(source: str) -> str:
    """A file as the read_file tool shows it."""
    return "\n".join(f"{n:4d}| {line}" for n, line in enumerate(source.splitlines(), 1))


def task_texts(tasks: Iterable[Mapping], tools: list[dict]) -> list[str]:
    """One rendered pseudo-episode per train-split task row (`tasks` table columns plus `split`)."""
    from ratchet.policy.embedded.chat import render
    from sandboxes.env import SYSTEM_PROMPT

    out = []
    for t in tasks:
        _check_train(t, "task")
        issue = t.get("issue_text") or f"{t.get('issue_title', '')}\n\n{t.get('issue_body', '')}".strip()
        user = f"Repository: {t.get('repo') or t['task_id']}\nIssue {t.get('issue_id') or t['task_id']}: {issue}"
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
        if t.get("solution"):
            msgs += [{"role": "assistant", "content": "Reading the code.", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "read_file",
                                                              "arguments": json.dumps({"path": "solution.py"})}}]},
                     {"role": "tool", "tool_call_id": "c0", "content": numbered(t["solution"])}]
        out.append(render(msgs, tools, add_generation_prompt=False, max_tool_chars=None))
    return out


def trajectory_texts(rows: Iterable[Mapping]) -> list[str]:
    """Rendered train-split trajectories (rows with `split`, `messages` and `tools`, JSON text or lists)."""
    from ratchet.policy.embedded.chat import render

    out = []
    for r in rows:
        _check_train(r, "trajectory")
        msgs = json.loads(r["messages"]) if isinstance(r["messages"], str) else r["messages"]
        tools = json.loads(r["tools"]) if isinstance(r.get("tools"), str) else r.get("tools")
        out.append(render(msgs, tools, add_generation_prompt=False))
    return out


def corpus_sha256(texts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()
