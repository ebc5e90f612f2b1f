"""Trajectory -> training example: the seam every trainer uses (TRL here; VeRL or an external
trainer can call it unchanged). Plain function, no trainer imports.

    ex = to_training_example(messages, tools, tokenizer)
    ex["input_ids"]        # the whole conversation in the embedded chat format
    ex["assistant_masks"]  # 1 = a token the policy produced (loss on it), 0 = prompt / tool output
    labels(ex)             # input_ids with -100 where the mask is 0 (what a causal-LM loss takes)
    training_windows(messages, tools, tokenizer, max_length=2048)   # longer ones: windows of whole turns

`messages` are OpenAI chat messages as stored in `trajectories.messages` (assistant `tool_calls`,
`tool` results). The text comes from the chat template (`ratchet.policy.embedded.chat`), and the
template's `{% generation %}` spans decide the mask: each assistant turn's body, up to and including
its `<|im_end|>` stop token. Turns whose call the offered schemas do not allow (an unknown tool,
broken JSON: what the noisy agent logs) stay in the context but are masked out, so the loss only
teaches calls the grammar can emit.

Tokenised span by span (context, then each assistant body), which is how a rollout builds the
sequence (prompt ids + generated ids): the ids of a span never depend on its neighbours. With
`use_token_ids=True`, an assistant message that carries the `token_ids` the policy sampled keeps
them unchanged (no re-tokenising drift in RL). The test suite checks that this equals
`tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)` on real trajectories.
"""
from __future__ import annotations

import json
from typing import Any


def _messages(value: Any) -> list[dict]:
    return json.loads(value) if isinstance(value, str) else list(value or [])


def to_training_example(messages, tools, tokenizer, *, max_length: int | None = None,
                        use_token_ids: bool = False, **prepare_kw) -> dict:
    """{"input_ids": [...], "assistant_masks": [...]} for one trajectory (see module doc).
    `messages`/`tools` may be the stored JSON text. `max_length` keeps the start (the prompt)."""
    from ratchet.policy.embedded.chat import prepare, render_spans

    messages, tools = _messages(messages), _messages(tools) or None
    prepared = prepare(messages, tools, **prepare_kw)
    text, spans = render_spans(prepared, tools, prepared=True)
    trainable = [m for m in prepared if m["role"] == "assistant" and m.get("train", True)]
    if len(trainable) != len(spans):
        raise ValueError(f"the template marked {len(spans)} assistant spans for {len(trainable)} trainable turns")

    def enc(s: str) -> list[int]:
        return tokenizer(s, add_special_tokens=False)["input_ids"] if s else []

    ids: list[int] = []
    mask: list[int] = []
    pos = 0
    for (a, b), msg in zip(spans, trainable):
        ctx = enc(text[pos:a])
        body = list(msg["token_ids"]) if use_token_ids and msg.get("token_ids") else enc(text[a:b])
        ids += ctx + body
        mask += [0] * len(ctx) + [1] * len(body)
        pos = b
    tail = enc(text[pos:])
    ids += tail
    mask += [0] * len(tail)
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return {"input_ids": ids, "assistant_masks": mask}


def training_windows(messages, tools, tokenizer, *, max_length: int, **kw) -> list[dict]:
    """A trajectory as examples of at most `max_length` tokens, cut only between turns. One example
    when it fits. Otherwise windows: each holds the prompt (every message before the first
    assistant turn) and a run of whole turns (an assistant message and the tool results that
    answer it), as many as fit, the next window starting at the turn after; earlier turns are not
    in a window's context. A turn that does not fit with the prompt alone is left out (never cut
    inside a call: a half call would teach a call the grammar cannot finish)."""
    messages = _messages(messages)
    full = to_training_example(messages, tools, tokenizer, **kw)
    if len(full["input_ids"]) <= max_length:
        return [full]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    prompt, turns = messages[:first], []
    for m in messages[first:]:
        if m.get("role") == "assistant" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    out, i = [], 0
    while i < len(turns):
        best, j = None, i
        while j < len(turns):
            ex = to_training_example(prompt + [m for t in turns[i:j + 1] for m in t], tools, tokenizer, **kw)
            if len(ex["input_ids"]) > max_length:
                break
            best, j = ex, j + 1
        if best is None:           # this turn alone is too long: left out
            i += 1
            continue
        out.append(best)
        i = j
    return out


def labels(example: dict) -> list[int]:
    return [t if m else -100 for t, m in zip(example["input_ids"], example["assistant_masks"])]


def prompt_ids(messages, tools, tokenizer) -> list[int]:
    """The ids a policy is prompted with for its next turn (ends with `<|im_start|>assistant\\n`)."""
    from ratchet.policy.embedded.chat import render

    return tokenizer(render(_messages(messages), _messages(tools) or None), add_special_tokens=False)["input_ids"]
