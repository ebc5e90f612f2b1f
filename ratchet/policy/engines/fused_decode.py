"""A decode-step forward for small Qwen2/Llama-style models in fewer, larger ops.

The engine's decode steps feed one token per row (a few with jump-forward). On the embedded
policy (~1M parameters) a step is dominated by the framework, not the arithmetic: transformers
runs ~70 small ops per layer through ~15 module calls, each op a few microseconds of dispatch on
a [16, 128] tensor. This forward does the same math from the model's own weights with the
projections fused (q, k and v in one matmul; gate and up in one), RMSNorm as one
`torch.nn.functional.rms_norm`, the rotary embedding applied to the query and key heads together,
and the engine's attention (`engines.attention.gqa_decode_attention`, shared prefix included) called
directly. Measured by bench/decode.py (docs/results).

The same math, not the same floats: a fused matmul and a fused norm sum in another order, so
logits move in the last bits (tests/policy/test_fused_decode.py bounds the difference and checks
that the sampled tokens are the same). Prefill and training keep transformers' forward.

Used only where it pays and is exact in structure (`unsupported()` says why not): Qwen2 or Llama
layers with full attention, SiLU MLPs, plain `nn.Linear` projections (not LoRA or quantised
ones), float32 and at most MAX_PARAMS parameters (larger models are
bound by their matmuls, and the fused weights are copies). The copies are made per `generate`
call (`FusedDecoder(model)`: ~4 MB for the embedded model), so weights a trainer updates in
place are never stale.
"""
from __future__ import annotations

MAX_PARAMS = 50_000_000


def unsupported(model) -> str | None:
    """Why `model` cannot use the fused decode step; None when it can."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in ("qwen2", "llama"):
        return f"model_type {getattr(cfg, 'model_type', None)!r} (qwen2 and llama only)"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ["full_attention"])):
        return "sliding-window layers"
    if getattr(cfg, "mlp_bias", False):
        return "MLP biases"
    import torch

    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        return f"dtype {dtype} (transformers' RMSNorm computes in float32)"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return "no model.model.layers (a wrapped model)"
    for layer in layers:
        try:
            a, mlp = layer.self_attn, layer.mlp
            projections = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            _ = (layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.weight, a.head_dim,
                 a.scaling, a.layer_idx)
        except AttributeError as e:
            return f"a layer of another shape ({e})"
        if any(type(p) is not torch.nn.Linear for p in projections):
            # a LoRA or quantised layer computes more than its .weight: fusing the weights would drop it
            return "projections that are not plain torch.nn.Linear (LoRA, quantised)"
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        return f"{n:,} parameters (> {MAX_PARAMS:,}: matmul-bound, and the fused weights are copies)"
    return None


class FusedDecoder:
    """`FusedDecoder(model)(input_ids, attention_mask, position_ids, past_key_values,
    logits_to_keep, shared_kv)` -> (logits [b, keep, vocab], past_key_values): what
    `model(..., use_cache=True)` returns for a decode block, where `attention_mask` is the 2D
    padding mask over the cache's columns plus the block, and `past_key_values` the engine's
    buffered cache (engines.attention)."""

    def __init__(self, model):
        import torch

        self.model, m = model, model.model
        self.layers = []
        with torch.no_grad():
            for layer in m.layers:
                a, mlp = layer.self_attn, layer.mlp
                qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                bias = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
                qkv_b = torch.cat(bias) if all(b is not None for b in bias) else None
                if qkv_b is None and any(b is not None for b in bias):
                    qkv_b = torch.cat([b if b is not None else p.weight.new_zeros(p.weight.shape[0])
                                       for b, p in zip(bias, (a.q_proj, a.k_proj, a.v_proj))])
                gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
                self.layers.append((layer, a, qkv_w, qkv_b, gate_up))
        a = m.layers[0].self_attn
        self.head_dim = a.head_dim
        self.heads = a.q_proj.weight.shape[0] // a.head_dim
        self.kv_heads = a.k_proj.weight.shape[0] // a.head_dim
        self.eps = m.norm.variance_epsilon
        self.hidden = model.config.hidden_size

    def __call__(self, input_ids, attention_mask, position_ids, past_key_values, logits_to_keep: int = 1,
                 shared_kv=None):
        import torch
        import torch.nn.functional as F

        from ratchet.policy.engines.attention import gqa_decode_attention

        m = self.model.model
        b, q = input_ids.shape
        h, kvh, d, eps, shape = self.heads, self.kv_heads, self.head_dim, self.eps, (self.hidden,)
        with torch.inference_mode():
            x = m.embed_tokens(input_ids)
            cos, sin = m.rotary_emb(x, position_ids)                  # [b, q, d]
            cos, sin = cos[:, None], sin[:, None]
            past = past_key_values.get_seq_length()
            # transformers' causal mask: column j is visible to block query i when it is not padding
            # and j <= past + i
            pad = attention_mask.bool()[:, None, None, :past + q]
            if q > 1:
                cols = torch.arange(past + q, device=x.device)
                pad = pad & (cols[None, :] <= past + torch.arange(q, device=x.device)[:, None])[None, None]
            kw = {"shared_kv": shared_kv} if shared_kv is not None else {}
            half = d // 2
            for layer, a, qkv_w, qkv_b, gate_up in self.layers:
                y = F.rms_norm(x, shape, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
                qkv = F.linear(y, qkv_w, qkv_b).view(b, q, h + 2 * kvh, d).transpose(1, 2)
                qk, v = qkv[:, :h + kvh], qkv[:, h + kvh:]
                qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
                k, v = past_key_values.update(qk[:, h:], v, a.layer_idx)
                o, _ = gqa_decode_attention(a, qk[:, :h], k, v, pad, scaling=a.scaling, **kw)
                x = x + F.linear(o.reshape(b, q, h * d), a.o_proj.weight, a.o_proj.bias)
                y = F.rms_norm(x, shape, layer.post_attention_layernorm.weight,
                               layer.post_attention_layernorm.variance_epsilon)
                g, u = F.linear(y, gate_up).chunk(2, dim=-1)
                x = x + F.linear(F.silu(g) * u, layer.mlp.down_proj.weight)
            x = F.rms_norm(x[:, -logits_to_keep:], shape, m.norm.weight, eps)
            return self.model.lm_head(x), past_key_values
