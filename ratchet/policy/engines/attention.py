"""Decode-step attention for batched CPU generation without copying the KV cache.

transformers' SDPA path repeats a grouped-query model's keys and values to every query head
(`repeat_kv`, a full copy of the cache per layer per step) whenever there is a padding mask, which
a left-padded batch always has. Measured on the embedded model at batch 16 (3 turns x 128
tokens): repeat_kv's reshape was 17% of generation, more than the projections. For one query
token (or the few tokens of a jump-forward run, up to SMALL_Q) the attention is two small matmuls
over the grouped layout, with no copy; longer queries (prefill) go to transformers' SDPA
unchanged.

    name = register()                     # "ratchet_gqa", for config._attn_implementation

Shared-prefix (cascade) attention: when the rows of a batch start with the same ids (the system
prompt and tool list every episode of a suite shares: 240 tokens in bench/rollout.py), the
engine keeps one copy of that prefix's KV and passes it as `shared_kv=[(keys, values) per layer]`
(each [kv_heads, P, dim]) to the model call; the batch cache then holds only each row's suffix.
Scores against the prefix are one matmul for all rows' queries (the prefix is read once per step,
not once per row), scores against the suffix are per row, and the two parts are merged by their
softmax statistics. Each row's own columns are still read per row (bench/rollout.py measures what
that leaves).
"""
from __future__ import annotations

NAME = "ratchet_gqa"
SMALL_Q = 16        # queries up to this long (a decode step, a jump-forward run) skip repeat_kv too
_DONE = False


def gqa_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                         scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    shared = kwargs.pop("shared_kv", None)
    if shared is not None:
        k0, v0 = shared[module.layer_idx]
        return shared_prefix_attention(query, key, value, attention_mask, k0, v0, scaling)
    b, h, q, d = query.shape
    kvh = key.shape[1]
    if q > SMALL_Q or kvh == h or dropout or (q > 1 and attention_mask is None):   # no mask: causal is implied
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    g = h // kvh
    scale = scaling if scaling is not None else d ** -0.5
    # [b, kvh, g*q, d] x [b, kvh, d, L]: each query head against its group's keys, no copy
    scores = torch.matmul(query.reshape(b, kvh, g * q, d), key.transpose(-1, -2)) * scale
    if attention_mask is not None:
        scores = _masked(scores, attention_mask, q, g)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value)                 # [b, kvh, g*q, d]
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


def _masked(scores, attention_mask, q: int, g: int):
    """Scores [b, kvh, g*q, L] under `attention_mask` [b, 1, q, >=L]: bool (attend) or additive."""
    import torch

    m = attention_mask[..., :scores.shape[-1]]
    m = m if q == 1 else m.repeat(1, 1, g, 1)    # rows of scores are (head in group, query)
    return scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m


def shared_prefix_attention(query, key, value, attention_mask, prefix_k, prefix_v, scaling=None):
    """Attention of `query` [b, h, q, d] over a prefix every row shares (`prefix_k/v` [kvh, P, d],
    visible to every query) followed by each row's own `key/value` [b, kvh, L, d] under
    `attention_mask` ([b, 1, q, L] bool or additive; None: causal over the last q columns).
    Returns [b, q, h, d], as the attention interface expects."""
    import torch

    b, h, q, d = query.shape
    kvh = prefix_k.shape[0]
    g, n_row = h // kvh, key.shape[2]
    scale = scaling if scaling is not None else d ** -0.5
    qg = query.reshape(b, kvh, g * q, d)
    # prefix: every row's queries of a KV head in one [b*g*q, d] x [d, P] matmul
    sp = torch.matmul(qg.transpose(0, 1).reshape(kvh, b * g * q, d), prefix_k.transpose(-1, -2)) * scale
    mp = sp.amax(-1, keepdim=True)                               # [kvh, b*g*q, 1]
    ep = torch.exp(sp - mp)
    zp = ep.sum(-1, keepdim=True)
    op = torch.matmul(ep, prefix_v)                              # [kvh, b*g*q, d]
    back = (lambda t: t.reshape(kvh, b, g * q, t.shape[-1]).transpose(0, 1))   # -> [b, kvh, g*q, .]
    mp, zp, op = back(mp), back(zp), back(op)
    if n_row == 0:
        return (op / zp).reshape(b, h, q, d).transpose(1, 2).contiguous(), None
    ss = torch.matmul(qg, key.transpose(-1, -2)) * scale        # [b, kvh, g*q, L]
    if attention_mask is None:
        if q > 1:                                                # causal among the last q columns
            m = torch.ones(q, n_row, dtype=torch.bool, device=query.device).tril(n_row - q)
            ss = ss.masked_fill(~m.repeat(g, 1), float("-inf"))
    else:
        ss = _masked(ss, attention_mask, q, g)
    mx = torch.maximum(mp, ss.amax(-1, keepdim=True))           # finite: the prefix is never masked
    es = torch.exp(ss - mx)
    a = torch.exp(mp - mx)                                      # rescales the prefix part
    out = (op * a + torch.matmul(es, value)) / (zp * a + es.sum(-1, keepdim=True))
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


def register() -> str:
    global _DONE
    if not _DONE:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(NAME, gqa_decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
        _DONE = True
    return NAME


def buffered_cache(data=None, filled: int | None = None):
    """A transformers DynamicCache whose layers keep spare columns: a decode step writes its key
    and value in place instead of `torch.cat`-ing a new copy of the whole cache (the largest cost
    of a batch-16 decode step after the repeat above). `data`: per layer (keys, values) to start
    from, copied into buffers of twice their width; with `filled=n`, per layer (key buffer, value
    buffer) whose first n columns hold the cache, adopted as they are (the engine allocates them
    with room for the steps to come, so neither the copy nor a later doubling happens)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class BufferedLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self._kb = self._vb = None
                self._n = 0
            n = key_states.shape[-2]
            if self._kb is None or self._n + n > self._kb.shape[-2]:
                b, h, _, d = key_states.shape
                cap = max(64, 2 * (self._n + n))
                kb, vb = key_states.new_empty((b, h, cap, d)), value_states.new_empty((b, h, cap, d))
                if self._n:
                    kb[:, :, :self._n], vb[:, :, :self._n] = self._kb[:, :, :self._n], self._vb[:, :, :self._n]
                self._kb, self._vb = kb, vb
            self._kb[:, :, self._n:self._n + n] = key_states
            self._vb[:, :, self._n:self._n + n] = value_states
            self._n += n
            self.keys, self.values = self._kb[:, :, :self._n], self._vb[:, :, :self._n]
            return self.keys, self.values

        def adopt(self, kb, vb, n: int):
            self.lazy_initialization(kb, vb)
            self._kb, self._vb, self._n = kb, vb, n
            self.keys, self.values = kb[:, :, :n], vb[:, :, :n]

        def batch_select_indices(self, indices):
            if self.is_initialized and self._n:
                self._kb, self._vb = self._kb[indices], self._vb[indices]
                self.keys, self.values = self._kb[:, :, :self._n], self._vb[:, :, :self._n]

    cache = DynamicCache()
    cache.layer_class_to_replicate = BufferedLayer
    for k, v in data or ():
        cache.layers.append(BufferedLayer())
        if filled is None:
            cache.layers[-1].update(k, v)
        else:
            cache.layers[-1].adopt(k, v, filled)
    return cache
