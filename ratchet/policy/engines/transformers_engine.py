"""Local transformers engine (CPU by default): many conversations decoded as one batch.

    policy = TransformersPolicy.from_path("/path/to/checkpoint")            # never the hub
    policy = TransformersPolicy(model, tokenizer, constrained=True, chat="embedded")  # live weights

Every request of one `generate` call (x its `n` samples) becomes a row of one left-padded batch,
decoded by a hand-written loop over the KV cache: one forward per step for all rows at once.
The loop is ours rather than `model.generate` because each row needs its own sampler (a
torch.Generator seeded from (request.seed, sample index), so a row samples the same tokens alone
or in any batch), its own grammar state (requests may offer different tools), its own
max_tokens and stop strings, and the unmasked log-probability of each sampled token.

Four shortcuts, none of which changes a sampled id (tests/policy/test_engine_speedups.py compares
each with the plain path; measured on a trained checkpoint's real episodes: docs/experiments/2026-11-30-engine-shortcuts.md):
- **jump-forward**: a token the grammar forces (one allowed id) needs no logits to be chosen, so
  the run of forced tokens after a sampled one is fed in the next forward with it, instead of one
  forward per token. Its logprob comes from that forward's logits (0 under `masked_logprobs`); a
  sampling row still draws from its generator per forced token, so later choices see the same
  random stream. `jump_forward=False` is the token-by-token reference.
- **KV prefixes by content**: the KV of every finished row (its prompt and the sampled ids fed) is
  kept, keyed by (length, digest of the ids), and a new prompt starts from its longest kept
  prefix: an episode's previous turn, another seed's identical history, or the system turn all
  episodes of a suite share. Entries stay until evicted (LRU, `prefix_cache` of them). The KV of a
  position depends only on the ids up to it, so any kept prefix is exact for fixed weights (a
  trainer makes a new policy object per weight update, as ratchet.training.grpo_loop does).
- **shared-prefix attention**: the ids every row of a batch starts with (the system turn) are
  attended from one copy of their KV (engines.attention.shared_prefix_attention; the batch cache
  holds each row's own columns only). The same softmax over the same columns, summed in another
  order: equal to rounding (`share_prefix=False` is the reference).
- **greedy memo**: at temperature 0 a turn is a function of its prompt ids, the grammar (offered
  tools, bounds) and its length and stop limits; the completion is kept under a digest of them
  (`memo_size`), so the seeds of a deterministic episode, and repeated prompts in one call,
  decode once. Sampling never reads it.

`constrained=True`: each row's logits are masked by `ratchet.policy.grammar.TokenMatcher` (xgrammar;
only valid calls of the offered tools can be sampled). `chat="embedded"` renders with
`ratchet.policy.embedded.chat` and parses its `<tool_call>` turns; `chat="template"` uses the
tokenizer's own chat template and the Hermes/Qwen `<tool_call>` format.

Token continuity: with `request.prefix_ids` (the previous turn's prompt + sampled ids) the new
prompt is those ids + the tokens of the newly rendered messages, so what the model conditioned on
and what a trainer sees are the same ids, never a re-tokenisation of sampled text.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from ratchet.policy.base import (
    Completion,
    GenerationRequest,
    ToolCall,
    parse_tool_calls,
)


def load_local(path: str | Path, *, dtype: str = "float32", device: str = "cpu", chat: str = "template"):
    """(model, tokenizer) from a local folder only (local_files_only: no hub access)."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"no checkpoint folder at {p} (engines load local paths only, never the hub)")
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        PreTrainedTokenizerFast,
    )

    model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, dtype=getattr(torch, dtype))
    if chat == "embedded":
        from ratchet.policy.embedded.tokenizer import load_tokenizer
        tok = load_tokenizer(p)
    elif (p / "tokenizer.json").exists():
        # PreTrainedTokenizerFast keeps a locally trained tokenizer's own pre-tokeniser
        # (AutoTokenizer may rebuild it as another class with different ids).
        tok = PreTrainedTokenizerFast.from_pretrained(str(p), local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    return model.to(device).eval(), tok


@dataclass
class _Row:
    req: int
    sample: int
    prompt_ids: list[int]
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]
    gen: object
    processor: object = None
    cache: list | None = None          # per layer (keys, values) [heads, cached, dim] of prompt_ids[:cached]
    cached: int = 0
    share: int = 0                     # length of the system turn to keep as a shared prefix
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    allowed: list = field(default_factory=list)     # per token: allowed ids at a choice, None when forced
    finish: str | None = None
    text: str | None = None
    mask: object = None                # allowed next tokens (bool [vocab]) under the grammar
    fed: int = 0                       # sampled ids whose KV is in the batch cache
    memo: bytes | None = None          # greedy: key of the completion memo


ROOM_MAX = 512        # decode-step columns allocated ahead in the batch cache (beyond: it doubles)
SHARE_MIN = 64        # shared-prefix attention below this many shared ids is not worth its extra ops


def sample_seed(seed: int, sample: int) -> int:
    return (int(seed) * 1_000_033 + sample * 104_729) % (2**63 - 1)


class TransformersPolicy:
    def __init__(self, model, tokenizer, *, policy_id: str = "hf:model", constrained: bool = False,
                 chat: str = "template", max_batch: int = 64, threads: int | None = None,
                 grammar: dict | None = None, prefix_cache: int = 64, gqa_decode: bool = True,
                 action_mask: str | None = None, masked_logprobs: bool = False, view: dict | None = None,
                 memo_size: int = 4096, memo_path: str | Path | None = None, jump_forward: bool = True,
                 share_prefix: bool = True, fused_decode: bool = True, config: dict | None = None):
        if chat not in ("template", "embedded"):
            raise ValueError(f"chat must be 'template' or 'embedded', got {chat!r}")
        if chat == "template" and not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template: set one, or use chat='embedded'")
        self.model, self.tok = model, tokenizer
        self.policy_id, self.constrained, self.chat = policy_id, constrained, chat
        self.max_batch, self.threads = max_batch, threads
        self.grammar = dict(grammar or {})          # kwargs of grammar.token_matcher (bounds=...)
        if action_mask not in (None, "structured"):
            raise ValueError(f"action_mask must be None or 'structured', got {action_mask!r}")
        if action_mask and not constrained:
            raise ValueError("action_mask narrows the grammar: it needs constrained=True")
        # policy-side action mask (ratchet.policy.action_mask): the prompt lists the structured
        # tools, the grammar offers this turn's narrowed schemas
        self.action_mask = action_mask
        # how the embedded chat shows observations to this checkpoint (saved with it:
        # ratchet.policy.embedded.decoding); passed to chat.render and the action mask's narrow
        self.view = dict(view) if view else None
        # logprobs under the grammar-masked distribution (renormalised over the allowed tokens) and
        # the allowed ids of each choice token: what a trainer of the constrained policy needs
        self.masked_logprobs = masked_logprobs and constrained
        # KV caches kept between calls (0: off): each episode's last turn (up to `prefix_cache` of
        # them), and the system turn (system prompt + tools) every episode of a task suite shares
        self.prefix_cache = prefix_cache
        from ratchet.policy.engines.kv_prefix import PrefixStore

        self._prefixes = PrefixStore(prefix_cache)
        # greedy completions by (prompt ids, grammar, limits): a greedy turn is a function of them,
        # so the seeds of a deterministic episode (and repeated prompts) decode once; `memo_path`:
        # a SQLite file other processes with these weights share (engines.completion_memo)
        from ratchet.policy.engines.completion_memo import CompletionMemo

        self.memo_size = memo_size
        self._memo = CompletionMemo(memo_size, memo_path if memo_size else None)
        # feed a run of grammar-forced tokens in one forward (False: one forward per token, the
        # reference the tests compare against; the same ids either way)
        self.jump_forward = jump_forward
        # decode steps attend the ids all rows share (the system turn) from one copy of their KV
        # (engines.attention: shared-prefix attention); False: every row reads its own copy
        self.share_prefix = share_prefix
        # decode steps through engines.fused_decode (fewer, larger ops; small Qwen2/Llama models
        # only: `_fused_why` says why not); False: transformers' forward, the reference
        self.fused_decode = fused_decode
        self._fused_why: str | None = None
        self.stats = {"prefill_tokens": 0, "cached_tokens": 0, "decode_steps": 0, "forwards": 0, "memo_hits": 0,
                      "shared_prefix_tokens": 0, "fused_forwards": 0}
        # decode-step attention without KV copies (engines.attention); only over the SDPA path
        self.gqa_decode = gqa_decode and getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.eos_ids = self._eos_ids()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.spec = {"policy_id": policy_id, "engine": "transformers",
                     "config": {"constrained": constrained, "chat": chat, "max_batch": max_batch,
                                "prefix_cache": prefix_cache, "gqa_decode": gqa_decode,
                                "memo_size": memo_size, "jump_forward": jump_forward, "share_prefix": share_prefix,
                                "fused_decode": fused_decode,
                                **({"action_mask": action_mask} if action_mask else {}),
                                **({"view": self.view} if self.view else {}),
                                **({"grammar": {k: repr(v) for k, v in self.grammar.items()}} if grammar else {}),
                                **(config or {})}}

    @classmethod
    def from_path(cls, path, *, policy_id: str | None = None, dtype: str = "float32", device: str = "cpu",
                  chat: str = "template", **kw) -> TransformersPolicy:
        model, tok = load_local(path, dtype=dtype, device=device, chat=chat)
        return cls(model, tok, policy_id=policy_id or f"hf:{path}", chat=chat,
                   config={"path": str(path), "dtype": dtype, "device": device}, **kw)

    def _eos_ids(self) -> list[int]:
        ids = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
        if self.tok.eos_token_id is not None and self.tok.eos_token_id not in ids:
            ids.insert(0, self.tok.eos_token_id)
        if not ids:
            raise ValueError("neither the tokenizer nor the model names an eos token")
        return ids

    # ------------------------------------------------------------------ chat format
    def render(self, messages: list[dict], tools: list[dict], generation_prompt: bool = True) -> str:
        if self.chat == "embedded":
            from ratchet.policy.embedded.chat import render
            return render(messages, tools, add_generation_prompt=generation_prompt,
                          **({"view": self.view} if self.view else {}))
        return self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                            add_generation_prompt=generation_prompt)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.chat == "embedded":
            from ratchet.policy.embedded.chat import parse_turn
            m = parse_turn(text)
            return m["content"] or "", [ToolCall.from_raw(c["function"]["name"], c["function"]["arguments"])
                                        for c in m["tool_calls"]]
        return parse_tool_calls(text)

    def prompt_ids(self, r: GenerationRequest) -> list[int]:
        """The prompt as ids: `prefix_ids` extended by the new messages when the template allows
        (see the module doc), else the whole rendered conversation."""
        full = self.render(r.messages, r.tools)
        last = max((i for i, m in enumerate(r.messages) if m.get("role") == "assistant"), default=None)
        if r.prefix_ids and last is not None:
            head = self.render(r.messages[:last + 1], r.tools, generation_prompt=False)
            eos = self.tok.eos_token or ""
            at = head.rfind(eos) if eos else -1
            if at >= 0 and full.startswith(head[:at]):
                # after the sampled stop token, or at the template's closing one when the turn
                # was cut (length / stop string), so the model sees a closed turn either way
                cut = at + len(eos) if r.prefix_ids[-1] in self.eos_ids else at
                return list(r.prefix_ids) + self.tok.encode(full[cut:], add_special_tokens=False)
        return self.tok.encode(full, add_special_tokens=False)

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        t0 = time.monotonic()
        rows, todo = [], []
        for qi, r in enumerate(requests):
            offered = r.tools
            if self.action_mask:
                from ratchet.policy.action_mask import narrow, structured_tools
                offered = narrow(r.messages, r.tools, **({"view": self.view} if self.view else {}))
                r = replace(r, tools=structured_tools(r.tools))
            ids = self.prompt_ids(r)
            memo = self._memo_key(ids, offered, r) if r.temperature == 0 and self.memo_size else None
            done = self._memo.get(memo) if memo is not None else None
            cache, cached, share = None, 0, 0
            if self.prefix_cache and done is None:
                cache, cached = self._prefixes.lookup(ids)
                if not cached:
                    share = self._system_turn(ids)
            for j in range(r.n):
                g = torch.Generator().manual_seed(sample_seed(r.seed, j))
                row = _Row(qi, j, ids, r.temperature, r.top_p, r.max_tokens, r.stop, g,
                           self._processor(offered) if self.constrained and done is None else None,
                           cache, cached, share)
                row.memo = memo
                rows.append(row)
                if done is not None:
                    self._replay(row, done)   # greedy: the same prompt and grammar, the same turn
                else:
                    todo.append(row)
        # greedy rows with one prompt and grammar decode once in this call; the rest replay it
        first: dict = {}
        for row in todo:
            first.setdefault(row.memo or id(row), row)
        twins = [row for row in todo if first[row.memo or id(row)] is not row]
        todo = [row for row in todo if first[row.memo or id(row)] is row]
        order = sorted(todo, key=lambda x: len(x.prompt_ids) - x.cached)      # less padding per batch
        with self._attention():
            for k in range(0, len(order), self.max_batch):
                self._decode(order[k:k + self.max_batch])
        self._memo.put_many([(row.memo, (list(row.out), list(row.lps), list(row.forced), list(row.allowed),
                                         row.finish, row.text)) for row in todo if row.memo is not None])
        for row in twins:
            src = first[row.memo]
            self._replay(row, (src.out, src.lps, src.forced, src.allowed, src.finish, src.text))
        dt = time.monotonic() - t0
        out: list[list[Completion]] = [[] for _ in requests]
        for row in rows:
            text = row.text if row.text is not None else self._decode_text(row.out)
            content, calls = self.parse(text)
            if self.view:           # rank-relative actions: the environment gets its own numbers
                from ratchet.policy.rank_actions import env_calls
                calls = env_calls(calls, requests[row.req].messages, self.view)
            out[row.req].append(Completion(
                text=content, tool_calls=calls, finish_reason=row.finish or "length",
                prompt_tokens=len(row.prompt_ids), completion_tokens=len(row.out), latency_s=dt,
                token_ids=list(row.out), logprobs=list(row.lps), prompt_ids=list(row.prompt_ids),
                forced=list(row.forced) if self.constrained else None,
                allowed=list(row.allowed) if self.masked_logprobs else None))
        return out

    def _memo_key(self, ids: list[int], offered, r: GenerationRequest) -> bytes:
        """Greedy decoding is a function of the prompt ids, the grammar (the offered tools and
        bounds) and the length and stop limits: one digest of all of them."""
        import hashlib
        import json
        from array import array

        h = hashlib.blake2b(array("i", ids).tobytes(), digest_size=20)
        h.update(json.dumps([offered if self.constrained else None, repr(self.grammar.get("bounds")),
                             r.max_tokens, list(r.stop), self.masked_logprobs], sort_keys=True,
                            default=str).encode())
        return h.digest()

    def _replay(self, row: _Row, done: tuple) -> None:
        out, lps, forced, allowed, finish, text = done
        row.out, row.lps, row.forced, row.allowed = list(out), list(lps), list(forced), list(allowed)
        row.finish, row.text = finish, text
        self.stats["memo_hits"] += 1

    @contextmanager
    def _attention(self):
        """Decode steps use engines.attention (no KV copy per step) for the duration of a call
        only: the same model object may be a trainer's, which keeps its own attention."""
        if not self.gqa_decode:
            yield
            return
        from ratchet.policy.engines.attention import register

        cfg = self.model.config
        old, cfg._attn_implementation = cfg._attn_implementation, register()
        try:
            yield
        finally:
            cfg._attn_implementation = old

    def _processor(self, tools):
        from ratchet.policy.grammar import token_matcher
        return token_matcher(self.tok, tools, vocab_size=self.model.config.vocab_size, **self.grammar)

    def _decode_text(self, ids: list[int]) -> str:
        ids = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
        return self.tok.decode(ids, skip_special_tokens=False)

    def _decode(self, rows: list[_Row]) -> None:
        """Decode `rows` together. Each row's prompt (after its cached prefix) is prefilled alone
        (`_prefill`: no padding to the batch's longest history). Then each forward feeds every live
        row's pending tokens: the token it sampled plus the run of tokens the grammar forced after
        it (jump-forward: a forced token needs no logits to be chosen, so the run is fed in one
        forward instead of one forward per token). Row i's columns are [its prompt KV
        right-aligned][per forward: its pending tokens left-padded to the widest] with mask 0 on
        padding; positions continue per row. Logprobs of forced tokens come from the logits of the
        forward that feeds them (the same numbers a token-by-token loop computes); a row that
        finishes inside a forced run is fed once more for them when its logprobs are unmasked."""
        import torch

        dev = self.model.device
        last = torch.stack(self._prefill_all(rows))          # logits for each row's first token
        wc = max(r.cached for r in rows)
        # the ids every row starts with (the system turn) are attended from one copy (engines.attention)
        n_pre = self._shared_len(rows)
        shared = [(k[:, :n_pre].contiguous(), v[:, :n_pre].contiguous()) for k, v in rows[0].cache] if n_pre else None
        extra = {"shared_kv": shared} if shared else {}
        self.stats["shared_prefix_tokens"] += n_pre * len(rows)
        mask = torch.tensor([[0] * (wc - r.cached) + [1] * (r.cached - n_pre) for r in rows], device=dev,
                            dtype=torch.long)
        nxt_pos = [r.cached for r in rows]
        # room for the steps' blocks (a block is as wide as the longest row's; past the room the
        # buffers grow by doubling, as before)
        past, live = self._past(rows, wc - n_pre, skip=n_pre, room=min(ROOM_MAX, max(r.max_tokens for r in rows) + 1)), \
            list(rows)
        fused = self._fused()
        for r in rows:
            r.cache, r.fed = None, 0
        with torch.inference_mode():
            while True:
                stay, pend = [], []
                need = [i for i, r in enumerate(live) if not r.finish]
                picked = dict(zip(need, self._pick([live[i] for i in need], last[need]))) if need else {}
                for i, r in enumerate(live):
                    if r.finish:               # it was fed only for its forced tokens' logprobs
                        todo = []
                    else:
                        start = len(r.out)
                        tok, lp = picked[i]
                        self._append(r, tok, lp, r.processor is not None and int(r.mask.sum()) == 1)
                        while self.jump_forward and not r.finish and r.processor is not None and int(r.mask.sum()) == 1:
                            self._forced(r)
                        # to feed next: what this step added; for a finished row all but its last
                        # token (never fed), and only while forced tokens still lack logprobs
                        todo = r.out[start:] if not r.finish else r.out[start:-1]
                        if r.finish and None not in r.lps:
                            todo = []
                    if todo:
                        stay.append(i)
                        pend.append(todo)
                    elif self.prefix_cache:
                        self._save(r, past, i, mask[i], shared)
                if not stay:
                    break
                if len(stay) < len(live):      # finished rows leave the batch (and the KV cache)
                    idx = torch.tensor(stay, device=dev)
                    past.batch_select_indices(idx)
                    mask = mask[idx]
                    live, nxt_pos = [live[i] for i in stay], [nxt_pos[i] for i in stay]
                w = max(len(p) for p in pend)
                ids = torch.tensor([[self.pad_id] * (w - len(p)) + p for p in pend], device=dev)
                block = torch.tensor([[0] * (w - len(p)) + [1] * len(p) for p in pend], device=dev, dtype=torch.long)
                pos = torch.tensor([[0] * (w - len(p)) + list(range(q, q + len(p))) for p, q in zip(pend, nxt_pos)],
                                   device=dev)
                mask = torch.cat([mask, block], dim=1)
                keep = w if any(None in r.lps for r in live) else 1
                if fused is not None:
                    logits, past = fused(ids, mask, pos, past, keep, shared)
                    logits = logits.float()
                    self.stats["fused_forwards"] += 1
                else:
                    out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                     past_key_values=past, use_cache=True, logits_to_keep=keep, **extra)
                    past, logits = out.past_key_values, out.logits.float()
                self.stats["forwards"] += 1
                self.stats["decode_steps"] += 1
                for i, r in enumerate(live):
                    self._fill_logprobs(r, logits[i], len(pend[i]), w)
                    r.fed += len(pend[i])
                    nxt_pos[i] += len(pend[i])
                last = logits[:, -1]

    def _fused(self):
        """The fused decode forward (engines.fused_decode) for this call, when enabled and the
        model supports it (it needs the buffered cache of `gqa_decode`); else None."""
        if not (self.fused_decode and self.gqa_decode):
            return None
        from ratchet.policy.engines.fused_decode import FusedDecoder, unsupported

        if self._fused_why is None:
            self._fused_why = unsupported(self.model) or ""
        return FusedDecoder(self.model) if not self._fused_why else None

    def _prefill_all(self, rows: list[_Row]) -> list:
        """Logits for each row's first token, prefilling rows in groups of similar length
        (`_groups`); returns them in row order."""
        got = {}
        for g in self._groups(rows):
            for r, logit in zip(g, self._prefill(g)):
                got[id(r)] = logit
        return [got[id(r)] for r in rows]

    def _groups(self, rows: list[_Row]) -> list[list[_Row]]:
        """Rows in prefill groups. A padded group makes every row attend over the longest cached
        history and the widest new block (turn 1 beside turn 13 of another episode: measured, the
        padded prefill was 18% of evaluation time at 12 open episodes), while a forward per row
        pays the framework's per-call overhead (~5 ms on this model). So rows sorted by length are
        merged while the padded cost is no more than the separate costs. Cost of n new tokens on c
        cached: n x (c + n + K) (attention columns plus the per-token projections, K = 2 x hidden +
        1.5 x intermediate columns' worth), plus 64 x K per forward."""
        cfg = self.model.config
        k = 2 * cfg.hidden_size + 1.5 * getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)
        over = 64 * k

        def cost(g):
            wc, wn = max(r.cached for r in g), max(len(r.prompt_ids) - r.cached for r in g)
            return len(g) * wn * (wc + wn + k) + over

        groups: list[list[_Row]] = []
        for r in sorted(rows, key=lambda x: (x.cached, len(x.prompt_ids))):
            if groups and len(groups[-1]) < self.max_batch and \
                    cost(groups[-1] + [r]) <= sum(cost([x]) for x in groups[-1]) + cost([r]):
                groups[-1].append(r)
            else:
                groups.append([r])
        return groups

    def _prefill(self, g: list[_Row]) -> list:
        """Feed a group's prompts after their cached prefixes as one left-padded batch (one row:
        no padding, no mask); keep each row's prompt KV in `r.cache` and the system turn's KV when
        a row starts one. Returns the logits for each row's first token."""
        import torch
        from transformers import DynamicCache

        from ratchet.policy.engines.attention import buffered_cache

        make = buffered_cache if self.gqa_decode else (lambda data=None: DynamicCache(ddp_cache_data=data))
        dev = self.model.device
        new = [r.prompt_ids[r.cached:] for r in g]
        self.stats["prefill_tokens"] += sum(map(len, new))
        self.stats["cached_tokens"] += sum(r.cached for r in g)
        if len(g) == 1:
            r = g[0]
            past = make([(k[None], v[None]) for k, v in r.cache]) if r.cached else make()
            ids = torch.tensor(new, device=dev)
            pos = torch.arange(r.cached, len(r.prompt_ids), device=dev)[None]
            mask = None
        else:
            wc, wn = max(r.cached for r in g), max(map(len, new))
            past = self._past(g, wc, room=wn)
            ids = torch.tensor([[self.pad_id] * (wn - len(x)) + x for x in new], device=dev)
            mask = torch.tensor([[0] * (wc - r.cached) + [1] * r.cached + [0] * (wn - len(x)) + [1] * len(x)
                                 for r, x in zip(g, new)], device=dev)
            pos = torch.tensor([[0] * (wn - len(x)) + list(range(r.cached, r.cached + len(x)))
                                for r, x in zip(g, new)], device=dev)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=past,
                             use_cache=True, logits_to_keep=1)
        self.stats["forwards"] += 1
        for i, r in enumerate(g):
            keep = mask[i].bool() if mask is not None else slice(None)
            r.cache = [(layer.keys[i][:, keep], layer.values[i][:, keep]) for layer in out.past_key_values.layers]
            r.cached = len(r.prompt_ids)
            if r.share and self.prefix_cache:
                head = r.prompt_ids[:r.share]
                if not self._prefixes.has_shared(head):
                    self._prefixes.keep(head, [(k[:, :r.share].clone(), v[:, :r.share].clone()) for k, v in r.cache],
                                        shared=True)
            r.share = 0
            if r.processor is not None:
                r.mask = r.processor.allowed()
        return [out.logits[i, -1].float() for i in range(len(g))]

    def _fill_logprobs(self, r: _Row, logits, n: int, w: int) -> None:
        """Logprobs of forced tokens from this forward's logits: r.out[fed + k] is scored by the
        logits at the fed token before it (column w - n + k - 1); k = n is the token after the
        block, which a finished row's last forward leaves out (it is never fed)."""
        import torch

        if logits.shape[0] != w:
            return
        for k in range(1, n + 1):
            j = r.fed + k
            if j < len(r.out) and r.lps[j] is None:
                col = logits[w - n + k - 1]
                scaled = col / r.temperature if r.temperature > 0 else col
                r.lps[j] = float(torch.log_softmax(scaled, -1)[r.out[j]])

    def _system_turn(self, ids: list[int]) -> int:
        """Length of the prompt's first turn (up to its first stop token: the system prompt and
        the tool list in chat templates), when something follows it; else 0."""
        at = next((k for k, t in enumerate(ids) if t in self.eos_ids), None)
        return at + 1 if at is not None and at + 1 < len(ids) else 0

    def _shared_len(self, rows: list[_Row]) -> int:
        """How many leading prompt ids all rows share, when enough rows share enough of them for
        one copy of their KV to pay (engines.attention's shared-prefix path); else 0."""
        import os

        if not (self.share_prefix and self.gqa_decode) or len(rows) < 2:
            return 0
        n = len(os.path.commonprefix([r.prompt_ids for r in rows]))
        return n if n >= SHARE_MIN else 0

    def _past(self, rows: list[_Row], width: int, skip: int = 0, room: int = 0):
        """A cache holding each row's cached KV after its first `skip` positions right-aligned in
        `width` columns (empty when width is 0); with `gqa_decode`, one whose steps write in place
        (engines.attention) into `room` columns allocated after them (the steps to come: no
        reallocation while they fit)."""
        from transformers import DynamicCache

        from ratchet.policy.engines.attention import buffered_cache

        if width == 0:
            return buffered_cache() if self.gqa_decode else DynamicCache()
        room = room if self.gqa_decode else 0
        layers = []
        for li in range(len(next(r.cache for r in rows if r.cache))):
            k0, v0 = next(r.cache for r in rows if r.cache)[li]
            # the room is written before it is read: only the cached width (padding included,
            # which attention masks but must not be NaN) is zeroed
            ks = k0.new_empty((len(rows), k0.shape[0], width + room, k0.shape[2]))
            vs = v0.new_empty((len(rows), v0.shape[0], width + room, v0.shape[2]))
            ks[:, :, :width] = 0
            vs[:, :, :width] = 0
            for i, r in enumerate(rows):
                if r.cached > skip:
                    ks[i, :, width - (r.cached - skip):width] = r.cache[li][0][:, skip:]
                    vs[i, :, width - (r.cached - skip):width] = r.cache[li][1][:, skip:]
            layers.append((ks, vs))
        if self.gqa_decode:
            return buffered_cache(layers, filled=width)
        return DynamicCache(ddp_cache_data=layers)

    def _save(self, r: _Row, past, i: int, mask_row, shared=None) -> None:
        """Keep a finished row's KV (the prompt and the sampled ids fed so far; after the shared
        prefix's, when the batch had one), so the episode's next turn prefills only what follows."""
        import torch

        keep = mask_row.bool()
        if not past.layers:          # nothing fed after the shared prefix (no decode step yet)
            kv = [(k.clone(), v.clone()) for k, v in shared]
        elif shared:
            kv = [(torch.cat([k0, layer.keys[i][:, keep]], 1), torch.cat([v0, layer.values[i][:, keep]], 1))
                  for (k0, v0), layer in zip(shared, past.layers)]
        else:
            kv = [(layer.keys[i][:, keep].clone(), layer.values[i][:, keep].clone()) for layer in past.layers]
        self._prefixes.keep(r.prompt_ids + r.out[:r.fed], kv)

    def _pick(self, rows: list[_Row], logits) -> list[tuple[int, float]]:
        """Each row's next token and its logprob from its logits [rows, vocab], for all rows in a
        few batched ops (per row they were ~0.11 ms a row-step, 20% of a batch-16 decode step).
        A sampling row draws one uniform number from its own generator and takes the token where
        its cumulative distribution passes it (inverse CDF), so a row samples the same token alone
        or in any batch; greedy rows take the argmax; nucleus rows are cut per row."""
        import torch

        vocab = logits.shape[-1]
        temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows], dtype=logits.dtype)
        scaled = logits / temps[:, None]
        if any(r.processor is not None for r in rows):
            ones = torch.ones(vocab, dtype=torch.bool)
            allow = torch.stack([r.mask if r.processor is not None else ones for r in rows])
            pick = scaled.masked_fill(~allow, float("-inf"))
        else:
            pick = scaled
        logp = torch.log_softmax(pick if self.masked_logprobs else scaled, -1)
        toks = torch.argmax(pick, -1)
        draw = [i for i, r in enumerate(rows) if r.temperature > 0]
        if draw:
            probs = torch.softmax(pick[draw], -1)
            for k, i in enumerate(draw):
                if rows[i].top_p < 1.0:
                    srt, idx = torch.sort(probs[k], descending=True)
                    probs[k, idx[srt.cumsum(-1) - srt > rows[i].top_p]] = 0.0
            cdf = probs.cumsum(-1)
            u = torch.stack([torch.rand((), generator=rows[i].gen, dtype=cdf.dtype) for i in draw])
            got = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=vocab - 1)
            for k in (probs.gather(1, got[:, None])[:, 0] == 0).nonzero()[:, 0].tolist():
                got[k] = int(probs[k].nonzero()[-1, 0])     # u rounded up to the total: the last possible token
            toks[draw] = got
        return list(zip(toks.tolist(), logp.gather(1, toks[:, None])[:, 0].tolist()))

    def _forced(self, r: _Row) -> None:
        """Append the one token the grammar allows, without logits (jump-forward). Its logprob is
        0 under the masked distribution, else filled in when it is fed. A sampling row still
        draws from its generator, so later choices see the random stream a token-by-token loop
        gives them (the same tokens for a seed, with or without jump-forward)."""
        import torch

        tok = int(r.mask.nonzero()[0, 0])
        if r.temperature > 0:
            torch.rand((), generator=r.gen)
        self._append(r, tok, 0.0 if self.masked_logprobs else None, True)

    def _append(self, r: _Row, tok: int, lp, forced: bool) -> None:
        r.out.append(tok)
        r.lps.append(lp)
        if r.processor is not None:     # one allowed token: the grammar chose it (Completion.forced)
            r.forced.append(forced)
            if self.masked_logprobs:
                r.allowed.append(None if forced else r.mask.nonzero()[:, 0].tolist())
            r.processor.accept(tok)
        if tok in self.eos_ids:
            r.finish = "stop"
        elif r.stop:
            text = self._decode_text(r.out)
            hit = min((text.find(s) for s in r.stop if s in text), default=-1)
            if hit >= 0:
                r.finish, r.text = "stop", text[:hit]
        if not r.finish and len(r.out) >= r.max_tokens:
            r.finish = "length"
        if not r.finish and r.processor is not None:
            r.mask = r.processor.allowed()
