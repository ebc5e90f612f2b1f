"""The fused decode step (engines.fused_decode) samples the tokens transformers' forward samples:
greedy and sampled, under the grammar (jump-forward blocks of several tokens) and without, with
the shared system turn and over a second turn that reuses the first one's KV; Qwen2 and Llama.
Models it does not fit fall back to transformers' forward and say why."""
from dataclasses import replace

import pytest

from ratchet.policy import GenerationRequest
from ratchet.policy.engines.fused_decode import unsupported
from ratchet.policy.engines.transformers_engine import TransformersPolicy
from tests.policy.test_engine_speedups import GRAMMAR, TOOLS, _reqs

pytestmark = pytest.mark.training


def _close(a, b):
    for x, y in zip(a, b):
        for c, d in zip(x, y):
            assert c.token_ids == d.token_ids and c.forced == d.forced and c.finish_reason == d.finish_reason
            assert c.logprobs == pytest.approx(d.logprobs, abs=1e-5)


def _pair(model_tok, **kw):
    fused = TransformersPolicy(*model_tok, memo_size=0, **kw)
    ref = TransformersPolicy(*model_tok, memo_size=0, fused_decode=False, **kw)
    return fused, ref


def _next_turn(reqs, outs, temperature):
    nxt = []
    for r, [c, *_] in zip(reqs, outs):
        conv = r.messages + [{"role": "assistant", "content": c.text, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls]}, {"role": "tool", "tool_call_id": "c", "name": "run_tests", "content": "1 failed"}]
        nxt.append(GenerationRequest(conv, TOOLS, seed=r.seed + 9, max_tokens=80, temperature=temperature,
                                     prefix_ids=c.prompt_ids + c.token_ids))
    return nxt


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("constrained", [True, False])
def test_fused_decode_samples_what_transformers_samples(tiny, temperature, constrained):
    fused, ref = _pair(tiny, constrained=constrained, grammar=GRAMMAR if constrained else None)
    long_sys = {"role": "system", "content": "You repair code with the tools you are given. " * 8}
    reqs = [replace(r, messages=[long_sys] + r.messages[1:]) for r in _reqs(temperature, n=2, k=3)]
    a, b = fused.generate(reqs), ref.generate(reqs)
    _close(a, b)
    assert fused.stats["fused_forwards"] > 0 and ref.stats["fused_forwards"] == 0
    assert fused.stats["shared_prefix_tokens"] > 0                     # the shared-prefix attention path
    if constrained:                                                     # blocks of forced tokens were fed
        assert fused.stats["forwards"] < sum(c.completion_tokens for x in a for c in x)
    nxt = _next_turn(reqs, a, temperature)
    _close(fused.generate(nxt), ref.generate(nxt))


def test_fused_decode_on_a_llama_model(tiny):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = tiny
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, attention_bias=True)
    llama = (LlamaForCausalLM(cfg).eval(), tok)
    assert unsupported(llama[0]) is None
    fused, ref = _pair(llama, constrained=True, grammar=GRAMMAR)
    reqs = _reqs(1.0, n=2, k=3)
    _close(fused.generate(reqs), ref.generate(reqs))
    assert fused.stats["fused_forwards"] > 0


def test_models_it_does_not_fit_use_transformers_forward_and_say_why(tiny, monkeypatch):
    import copy

    import torch

    from ratchet.policy.engines import fused_decode

    model, tok = tiny
    sliding = copy.deepcopy(model)
    sliding.config.layer_types = ["sliding_attention"] * len(sliding.config.layer_types)
    assert "sliding" in unsupported(sliding)
    assert "dtype" in unsupported(copy.deepcopy(model).to(torch.bfloat16))
    class Adapted(torch.nn.Linear):                 # a LoRA layer adds to what .weight computes
        pass
    adapted = copy.deepcopy(model)
    q = adapted.model.layers[0].self_attn.q_proj
    adapted.model.layers[0].self_attn.q_proj = Adapted(q.in_features, q.out_features, bias=True)
    assert "plain" in unsupported(adapted)
    odd = copy.deepcopy(model)
    del odd.model.layers[0].mlp.gate_proj
    assert "another shape" in unsupported(odd)
    monkeypatch.setattr(fused_decode, "MAX_PARAMS", 1000)
    assert "parameters" in unsupported(model)
    p = TransformersPolicy(model, tok, memo_size=0)
    [[c]] = p.generate([_reqs(1.0, n=1, k=1)[0]])
    assert c.token_ids and p.stats["fused_forwards"] == 0 and "parameters" in p._fused_why


def test_buffered_cache_adopts_a_buffer_and_grows_past_its_room():
    """The engine hands decode a buffer with room for the steps to come; a step past the room
    grows it (the keys and values are always the columns written, in order)."""
    import torch

    from ratchet.policy.engines.attention import buffered_cache

    k0, v0 = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    kb, vb = torch.zeros(2, 2, 7, 4), torch.zeros(2, 2, 7, 4)
    kb[:, :, :5], vb[:, :, :5] = k0, v0
    cache = buffered_cache([(kb, vb)], filled=5)
    assert cache.get_seq_length() == 5
    steps = [(torch.randn(2, 2, n, 4), torch.randn(2, 2, n, 4)) for n in (1, 1, 3, 1)]   # 7 fits, 10 grows
    for k, v in steps:
        keys, values = cache.layers[0].update(k, v)
    torch.testing.assert_close(keys, torch.cat([k0] + [k for k, _ in steps], 2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v0] + [v for _, v in steps], 2), rtol=0, atol=0)
    assert cache.layers[0]._kb.shape[2] >= 11 and cache.get_seq_length() == 11
    cache.layers[0].batch_select_indices(torch.tensor([1]))
    torch.testing.assert_close(cache.layers[0].keys, keys[1:], rtol=0, atol=0)
