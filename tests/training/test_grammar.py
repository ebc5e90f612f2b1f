"""Constrained decoding: an untrained (random) model emits only valid calls of the offered tools."""
import json

import pytest

from ratchet.policy.embedded.chat import IM_END, parse_turn, prepare, render, render_spans
from ratchet.policy.grammar import Bounds, arguments_valid, tool_call_logits_processor

pytestmark = pytest.mark.training

SMALL = Bounds(thought_chars=24, max_string=24, max_items=2)


def _valid(text: str, offered: set[str]) -> bool:
    """The environment's own checks: one call, a known tool, arguments that parse and pass
    sandboxes.tools.check_arguments; and the turn ends with the stop token."""
    from sandboxes.tools import ToolError, check_arguments

    turn = parse_turn(text)
    if IM_END not in text or len(turn["tool_calls"]) != 1:
        return False
    fn = turn["tool_calls"][0]["function"]
    if fn["name"] not in offered:
        return False
    try:
        check_arguments(fn["name"], json.loads(fn["arguments"]))
    except (ToolError, json.JSONDecodeError):
        return False
    return True


def _sample(model, tokenizer, prompt: str, n: int, processor=None, max_new_tokens: int = 200, temperature=1.0):
    import torch

    torch.manual_seed(0)
    ids = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**ids, do_sample=True, temperature=temperature, top_k=0, max_new_tokens=max_new_tokens,
                         num_return_sequences=n, logits_processor=[processor] if processor else None)
    return [tokenizer.decode(row[ids["input_ids"].shape[1]:]) for row in out]


@pytest.mark.parametrize("subset", ["all", "structured"])
def test_random_model_emits_only_valid_calls(tiny_model, tokenizer, trajectories, tools, subset):
    offered = tools if subset == "all" else [
        t for t in tools if t["function"]["name"] in ("localize", "propose_edits", "apply_edit", "run_tests", "submit")]
    names = {t["function"]["name"] for t in offered}
    prompt = render(trajectories[0]["messages"][:2], offered)
    texts = []
    for temperature in (1.0, 3.0):      # near-uniform and flatter than uniform-ish: the grammar alone decides
        proc = tool_call_logits_processor(tokenizer, offered, bounds=SMALL)
        texts += _sample(tiny_model, tokenizer, prompt, 16, proc, temperature=temperature)
    bad = [t for t in texts if not _valid(t, names)]
    assert not bad, bad[:3]
    called = {parse_turn(t)["tool_calls"][0]["function"]["name"] for t in texts}
    assert len(called) >= 3          # random, not stuck on one tool


def test_without_the_grammar_the_same_model_emits_invalid_calls(tiny_model, tokenizer, trajectories, tools):
    prompt = render(trajectories[0]["messages"][:2], tools)
    texts = _sample(tiny_model, tokenizer, prompt, 8, None, max_new_tokens=60)
    assert not any(_valid(t, {s["function"]["name"] for s in tools}) for t in texts)


def test_expert_turns_lie_inside_the_grammar(tokenizer, trajectories, tools):
    """Every valid assistant turn of the training data, token by token, is accepted and completes
    the grammar (default bounds): SFT teaches only what constrained decoding can emit."""
    import xgrammar as xgr

    from ratchet.policy.grammar import compiled_tool_call_grammar

    compiled = compiled_tool_call_grammar(tokenizer, tools)
    checked = 0
    for t in trajectories[:6]:
        text, spans = render_spans(t["messages"], tools)
        trainable = [m for m in prepare(t["messages"], tools) if m["role"] == "assistant" and m.get("train", True)]
        assert len(spans) == len(trainable)
        for a, b in spans:
            body = text[a:b]
            m = xgr.GrammarMatcher(compiled)
            ids = tokenizer(body, add_special_tokens=False)["input_ids"]
            assert ids[-1] == tokenizer.eos_token_id
            assert all(m.accept_token(i) for i in ids), body
            assert m.is_terminated(), body
            checked += 1
    assert checked > 20


def test_arguments_valid_agrees_with_the_environment(tools):
    from sandboxes.tools import SCHEMAS_BY_NAME, ToolError, check_arguments

    cases = [("apply_edit", {"path": "a.py", "line": 3, "index": 0}), ("apply_edit", {"path": "a.py", "line": 0, "index": 0}),
             ("localize", {"formula": "nope"}), ("localize", {"top": 5, "extra": 1}), ("submit", {}),
             ("run_tests", {"tests": ["a", 1]}), ("propose_edits", {"path": "a.py", "line": True})]
    for name, args in cases:
        try:
            check_arguments(name, args)
            env_ok = True
        except ToolError:
            env_ok = False
        assert arguments_valid(SCHEMAS_BY_NAME[name]["function"]["parameters"], args) == env_ok, (name, args)


def test_no_thought_grammar_starts_with_the_call(tiny_model, tokenizer, trajectories, tools):
    prompt = render(trajectories[0]["messages"][:2], tools)
    proc = tool_call_logits_processor(tokenizer, tools, bounds=Bounds(thought_chars=0, max_string=24, max_items=2))
    texts = _sample(tiny_model, tokenizer, prompt, 8, proc)
    assert all(t.startswith("<tool_call>") and _valid(t, {s["function"]["name"] for s in tools}) for t in texts)
