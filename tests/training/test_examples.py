"""The trajectory -> training example seam: the assistant-only mask, checked by hand."""
import json

import pytest

from ratchet.policy.embedded.chat import CLIP_MARK, IM_END, MAX_TOOL_CHARS, prepare, render_spans
from ratchet.training.examples import labels, prompt_ids, to_training_example

pytestmark = pytest.mark.training

LONG = "x" * (MAX_TOOL_CHARS + 50)


def _call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


MULTI = [
    {"role": "system", "content": "SYS"},
    {"role": "user", "content": "Issue: fix `f`"},
    {"role": "assistant", "content": "Localising.", "tool_calls": [_call("c0", "localize", {"top": 3})]},
    {"role": "tool", "tool_call_id": "c0", "content": "TOOLOUT-ONE"},
    {"role": "assistant", "content": None, "tool_calls": [_call("c1", "shell", {"cmd": "ls"})]},   # not offered
    {"role": "tool", "tool_call_id": "c1", "content": "error: unknown tool 'shell'"},
    {"role": "assistant", "content": "Candidates.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "propose_edits", "arguments": '{"line": 4, "path": "s.py"}'}}]},
    {"role": "tool", "tool_call_id": "c2", "content": LONG},
]


def test_assistant_only_mask_on_a_multi_turn_sample_by_hand(tokenizer, tools):
    ex = to_training_example(MULTI, tools, tokenizer)
    ids, mask = ex["input_ids"], ex["assistant_masks"]
    assert len(ids) == len(mask)
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]
    # The two valid turns, written out by hand (arguments in schema order: path before line).
    turn1 = 'Localising.\n<tool_call>{"name": "localize", "arguments": {"top": 3}}</tool_call>' + IM_END
    turn3 = ('Candidates.\n<tool_call>{"name": "propose_edits", "arguments": {"path": "s.py", "line": 4}}'
             "</tool_call>" + IM_END)
    assert [t for t, m in zip(ids, mask) if m] == enc(turn1) + enc(turn3)
    # Masked: the prompt, every tool output (the long one clipped), and the invalid `shell` turn.
    masked = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    for text in ("SYS", "Issue: fix `f`", "TOOLOUT-ONE", "error: unknown tool 'shell'", '"name": "shell"',
                 "x" * MAX_TOOL_CHARS + CLIP_MARK):
        assert text in masked
    assert LONG not in masked
    # The mask is exactly two contiguous runs, each ending on the stop token.
    runs = [i for i in range(len(mask)) if mask[i] and (i + 1 == len(mask) or not mask[i + 1])]
    assert len(runs) == 2 and all(ids[i] == tokenizer.eos_token_id for i in runs)
    assert labels(ex) == [t if m else -100 for t, m in zip(ids, mask)]


def test_same_as_apply_chat_template_on_real_trajectories(tokenizer, trajectories, tools):
    """Span-by-span tokenisation equals transformers' whole-text tokenisation + generation mask
    (the path TRL's assistant_only_loss takes) on every recorded trajectory."""
    for t in trajectories:
        ex = to_training_example(t["messages"], tools, tokenizer)
        ref = tokenizer.apply_chat_template(prepare(t["messages"], tools), tools=tools, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
        assert ex["input_ids"] == ref["input_ids"], t["trajectory_id"]
        assert ex["assistant_masks"] == ref["assistant_masks"], t["trajectory_id"]


def test_prompt_plus_generated_turn_is_the_training_sequence(tokenizer, trajectories, tools):
    """What a rollout builds (prompt ids, then the turn's ids) is a prefix of the training example."""
    msgs = trajectories[0]["messages"]
    k = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    text, spans = render_spans(msgs, tools)
    turn = tokenizer(text[spans[0][0]:spans[0][1]], add_special_tokens=False)["input_ids"]
    ex = to_training_example(msgs, tools, tokenizer)
    rollout = prompt_ids(msgs[:k], tools, tokenizer) + turn
    assert ex["input_ids"][:len(rollout)] == rollout
    assert ex["assistant_masks"][:len(rollout)] == [0] * (len(rollout) - len(turn)) + [1] * len(turn)


def test_sampled_token_ids_are_kept_unchanged(tokenizer, tools):
    msgs = [dict(m) for m in MULTI[:4]]
    sampled = [5, 6, 7, tokenizer.eos_token_id]            # a non-canonical split the policy sampled
    msgs[2]["token_ids"] = sampled
    ex = to_training_example(msgs, tools, tokenizer, use_token_ids=True)
    assert [t for t, m in zip(ex["input_ids"], ex["assistant_masks"]) if m] == sampled
    plain = to_training_example(msgs, tools, tokenizer)
    assert [t for t, m in zip(plain["input_ids"], plain["assistant_masks"]) if m] != sampled


def test_without_tool_schemas_every_turn_trains(tokenizer):
    """No offered schemas, nothing to check a call against: every assistant turn is in the loss."""
    turns = [m for m in prepare(MULTI, None) if m["role"] == "assistant"]
    assert all(m.get("train", True) for m in turns) and len(turns) == 3
    ex = to_training_example(MULTI, None, tokenizer)
    assert tokenizer.decode([t for t, m in zip(ex["input_ids"], ex["assistant_masks"]) if m]).count(IM_END) == 3


def test_calls_only_mode_drops_thoughts_from_text_and_loss(tokenizer, tools):
    ex = to_training_example(MULTI, tools, tokenizer, thoughts=False)
    trained = tokenizer.decode([t for t, m in zip(ex["input_ids"], ex["assistant_masks"]) if m])
    assert trained.startswith("<tool_call>") and "Localising." not in tokenizer.decode(ex["input_ids"])
    assert trained.count("<tool_call>") == 2
