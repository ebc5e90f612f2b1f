"""The transformers engine's three shortcuts change no sampled token: jump-forward over
grammar-forced runs (one forward for a run instead of one per token), the greedy completion memo
(a greedy turn is a function of its prompt ids and grammar: seeds of a deterministic episode decode
once), and KV prefixes looked up by content (kept after use, so a second episode with the same
history reuses them). The reference is the plain path: transformers' own attention, one forward per
token, no memo, no prefix cache."""
from dataclasses import replace

import pytest

from ratchet.policy import GenerationRequest
from ratchet.policy.engines.transformers_engine import TransformersPolicy
from ratchet.policy.grammar import Bounds
from sandboxes.tools import TOOL_SCHEMAS

pytestmark = pytest.mark.training

SYS = {"role": "system", "content": "You repair code."}
GRAMMAR = {"bounds": Bounds(thought_chars=0, max_string=16, max_items=2)}   # calls only, as the embedded policy
TOOLS = [t for t in TOOL_SCHEMAS if (t.get("function") or t)["name"] in ("run_tests", "localize", "apply_edit")]


def _reqs(temperature, n=2, k=3):
    return [GenerationRequest([SYS, {"role": "user", "content": "fix add " + "x" * (3 * i)}], TOOLS, seed=40 + i,
                              max_tokens=80, temperature=temperature, n=n) for i in range(k)]


def _plain(tiny, **kw):
    return TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, gqa_decode=False, jump_forward=False, memo_size=0,
                              prefix_cache=0, **kw)


def _same(a, b):
    for x, y in zip(a, b):
        for c, d in zip(x, y):
            assert c.token_ids == d.token_ids and c.forced == d.forced and c.allowed == d.allowed
            assert c.finish_reason == d.finish_reason
            assert c.logprobs == pytest.approx(d.logprobs, abs=1e-4)


@pytest.mark.parametrize("temperature,masked", [(0.0, False), (1.0, False), (1.0, True)])
def test_jump_forward_feeds_forced_runs_and_changes_nothing(tiny, temperature, masked):
    fast = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_size=0, masked_logprobs=masked)
    plain = _plain(tiny, masked_logprobs=masked)
    reqs = _reqs(temperature)
    a, b = fast.generate(reqs), plain.generate(reqs)
    _same(a, b)
    forced = sum(sum(c.forced) for x in a for c in x)
    assert forced > 0 and all(c.finish_reason == "stop" for x in a for c in x)
    # every forced token after the first of a run rides along in one forward
    assert fast.stats["forwards"] < plain.stats["forwards"]
    if masked:                 # a forced token has logprob 0 under the masked distribution
        assert all(lp == 0.0 for x in a for c in x for lp, f in zip(c.logprobs, c.forced) if f)


def test_greedy_memo_decodes_a_repeated_turn_once(tiny):
    fast = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR)
    plain = _plain(tiny)
    reqs = _reqs(0.0, n=1, k=3)
    twice = reqs + reqs                                   # two seeds of the same turn, one call
    a, b = fast.generate(twice), plain.generate(twice)
    _same(a, b)
    assert fast.stats["memo_hits"] == 3
    before = fast.stats["forwards"]
    again = fast.generate(reqs)                           # a later call: no forward at all
    _same(again, b[:3])
    assert fast.stats["forwards"] == before and fast.stats["memo_hits"] == 6
    # another grammar or length limit is another key; sampling never reads the memo
    fast.generate([GenerationRequest(reqs[0].messages, TOOLS[:1], seed=1, max_tokens=80)])
    fast.generate([GenerationRequest(reqs[0].messages, TOOLS, seed=1, max_tokens=79)])
    fast.generate([GenerationRequest(reqs[0].messages, TOOLS, seed=1, max_tokens=80, temperature=1.0)])
    assert fast.stats["memo_hits"] == 6


def test_kv_prefix_is_found_by_content_and_kept_after_use(tiny):
    """Two episodes with one history (seeds of a deterministic task) reach turn 2 in different
    calls: both read the KV the first turn left, and sample what a cold engine samples."""
    warm, cold = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_size=0), _plain(tiny)
    conv = [SYS, {"role": "user", "content": "fix add please"}]
    [[c1]] = warm.generate([GenerationRequest(conv, TOOLS, seed=3, max_tokens=80, temperature=1.0)])
    nxt = conv + [{"role": "assistant", "content": c1.text,
                   "tool_calls": [{"id": "c", "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                                  for t in c1.tool_calls]},
                  {"role": "tool", "tool_call_id": "c", "name": "run_tests", "content": "1 failed"}]
    seconds = []
    for seed in (5, 6):                                   # one call each: the entry survives its first use
        cached = warm.stats["cached_tokens"]
        req = GenerationRequest(nxt, TOOLS, seed=seed, max_tokens=80, temperature=1.0,
                                prefix_ids=c1.prompt_ids + c1.token_ids)
        [[c2]] = warm.generate([req])
        assert warm.stats["cached_tokens"] - cached == len(c1.prompt_ids) + len(c1.token_ids) - 1
        [[ref]] = cold.generate([req])
        assert c2.token_ids == ref.token_ids and c2.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
        seconds.append(c2.token_ids)
    assert seconds[0] != seconds[1]                       # the seeds did sample differently


def test_greedy_memo_file_is_shared_by_engines_with_these_weights(tiny, tmp_path):
    """Each seed of an evaluation runs in its own process: a second engine on the same weights
    reads the first one's greedy turns from the file (no forward), with identical results."""
    from ratchet.policy.engines.completion_memo import memo_file, weights_digest

    model = tiny[0]
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    path = memo_file(tmp_path / "home", folder)
    assert path.parent == tmp_path / "home" / "cache" / "completions"
    reqs = _reqs(0.0, n=1, k=3)
    first = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_path=path)
    a = first.generate(reqs)
    second = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_path=path)
    b = second.generate(reqs)
    _same(a, b)
    assert second.stats["forwards"] == 0 and second.stats["memo_hits"] == 3
    # the file is named by the weights: a copy shares it, one changed byte does not
    other = tmp_path / "other"
    model.save_pretrained(other)
    assert weights_digest(other) == weights_digest(folder)
    (other / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\1")
    assert weights_digest(other) != weights_digest(folder)


def test_evaluation_gives_learned_policies_the_memo_file(tmp_path, monkeypatch):
    from ratchet.evaluation.episodes import with_memo

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setenv("RATCHET_HOME", str(tmp_path / "home"))
    kw = with_memo("embedded:rl", {"path": str(ckpt)})
    assert kw["memo_path"].startswith(str(tmp_path / "home" / "cache" / "completions"))
    assert with_memo("embedded:rl", {"path": str(ckpt), "memo_path": None})["memo_path"] is None
    assert "memo_path" not in with_memo("harness:sbfl", {})


def test_a_locked_or_broken_memo_file_never_fails_generation(tiny, tmp_path):
    """Two processes opening the file at once, or a broken file: the memo warns and goes on in
    memory; the completions are the plain path's."""
    import sqlite3

    from ratchet.policy.engines.completion_memo import CompletionMemo

    path = tmp_path / "memo.sqlite"
    CompletionMemo(8, path)                                  # creates it (WAL)
    holder = sqlite3.connect(str(path))
    holder.execute("BEGIN EXCLUSIVE")                        # another process holds the write lock

    def open_and_write():
        memo = CompletionMemo(8, path, timeout=0.2)
        memo.put_many([(b"k", (1, 2))])
        return memo

    with pytest.warns(UserWarning, match="going on in memory"):
        memo = open_and_write()
    assert memo.get(b"k") == (1, 2)                          # in memory still
    holder.rollback()
    holder.close()
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.warns(UserWarning, match="going on in memory"):
        p = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_path=bad)
    reqs = _reqs(0.0, n=1, k=2)
    _same(p.generate(reqs), _plain(tiny).generate(reqs))


@pytest.mark.parametrize("q,masked", [(1, True), (3, True), (3, False)])
def test_shared_prefix_attention_equals_attention_over_the_whole_cache(q, masked):
    """One copy of the shared prefix's KV for every row gives what each row attending its own
    full copy gives: the same softmax over [prefix | own columns], with padding masked and rows
    whose own part is only padding."""
    import torch

    from ratchet.policy.engines.attention import shared_prefix_attention

    g = torch.Generator().manual_seed(0)
    b, h, kvh, d, n_pre, n_row = 3, 4, 2, 8, 5, 6
    query = torch.randn(b, h, q, d, generator=g)
    pk, pv = torch.randn(kvh, n_pre, d, generator=g), torch.randn(kvh, n_pre, d, generator=g)
    key, value = torch.randn(b, kvh, n_row, d, generator=g), torch.randn(b, kvh, n_row, d, generator=g)
    # row 1 left-padded, row 2 with nothing cached of its own (only the new tokens); no mask: causal
    own = [n_row, 4, q] if masked else [n_row] * b
    allowed = torch.zeros(b, 1, q, n_row, dtype=torch.bool)
    for i, n in enumerate(own):
        for j in range(q):                              # left padding, then causal among the last q
            allowed[i, 0, j, n_row - n:n_row - q + j + 1] = True
    out, _ = shared_prefix_attention(query, key, value, allowed if masked else None, pk, pv)
    full_k = torch.cat([pk.expand(b, -1, -1, -1), key], 2).repeat_interleave(h // kvh, 1)
    full_v = torch.cat([pv.expand(b, -1, -1, -1), value], 2).repeat_interleave(h // kvh, 1)
    full_mask = torch.cat([torch.ones(b, 1, q, n_pre, dtype=torch.bool), allowed], -1)
    ref = torch.nn.functional.scaled_dot_product_attention(query, full_k, full_v, attn_mask=full_mask)
    assert out.shape == (b, q, h, d)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_decoding_changes_no_token_over_turns(tiny, temperature):
    """Rows sharing the system turn decode it from one copy; the tokens, logprobs and the KV kept
    for the next turn (prefix + own columns) are the ones each row's own copy gives."""
    shared = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_size=0)
    own = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_size=0, share_prefix=False)
    long_sys = {"role": "system", "content": "You repair code with the tools you are given. " * 8}
    reqs = [replace(r, messages=[long_sys] + r.messages[1:]) for r in _reqs(temperature, n=2, k=3)]
    a, b = shared.generate(reqs), own.generate(reqs)
    _same(a, b)
    assert shared.stats["shared_prefix_tokens"] >= 6 * 64 and own.stats["shared_prefix_tokens"] == 0
    nxt = []
    for r, [c, _] in zip(reqs, a):
        conv = r.messages + [{"role": "assistant", "content": c.text, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls]}, {"role": "tool", "tool_call_id": "c", "name": "run_tests", "content": "1 failed"}]
        nxt.append(GenerationRequest(conv, TOOLS, seed=r.seed + 9, max_tokens=80, temperature=temperature,
                                     prefix_ids=c.prompt_ids + c.token_ids))
    cached = shared.stats["cached_tokens"]
    a2, b2 = shared.generate(nxt), own.generate(nxt)
    _same(a2, b2)
    assert shared.stats["cached_tokens"] - cached >= sum(len(c.prompt_ids) for [c, _] in a)   # turn 1's KV reused
    _same(a2, _plain(tiny).generate(nxt))


def test_shared_prefix_when_the_rows_share_their_whole_prompt(tiny):
    """A GRPO group: n samples of one prompt share all of it, so the batch cache starts empty and
    holds only what is decoded; tokens, logprobs and the next turn's reuse are the unshared ones."""
    long_sys = {"role": "system", "content": "You repair code with the tools you are given. " * 8}
    req = GenerationRequest([long_sys, {"role": "user", "content": "fix add"}], TOOLS, seed=7, max_tokens=80,
                            temperature=1.0, n=4)
    shared = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_size=0)
    own = TransformersPolicy(*tiny, constrained=True, grammar=GRAMMAR, memo_size=0, share_prefix=False)
    [a], [b] = shared.generate([req]), own.generate([req])
    _same([a], [b])
    assert shared.stats["shared_prefix_tokens"] == 4 * len(a[0].prompt_ids)
    assert len({tuple(c.token_ids) for c in a}) > 1                 # the samples did differ
    c = a[0]
    nxt = GenerationRequest(req.messages + [
        {"role": "assistant", "content": c.text, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": t.name, "arguments": t.arguments}} for t in c.tool_calls]},
        {"role": "tool", "tool_call_id": "c", "name": "run_tests", "content": "1 failed"}],
        TOOLS, seed=8, max_tokens=80, temperature=1.0, prefix_ids=c.prompt_ids + c.token_ids)
    cached = shared.stats["cached_tokens"]
    [[x]], [[y]] = shared.generate([nxt]), _plain(tiny).generate([nxt])
    assert x.token_ids == y.token_ids and x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    assert shared.stats["cached_tokens"] - cached == len(c.prompt_ids) + len(c.token_ids) - 1
