"""The local transformers engine on a tiny randomly initialised Qwen2 model: batching does not
change what a request samples, ids and logprobs are the exact ones, checkpoints load from local
folders only, and the prompt extends the previously sampled ids."""
import pytest

from ratchet.policy import GenerationRequest, training_sequence
from ratchet.policy.engines.transformers_engine import TransformersPolicy

pytestmark = pytest.mark.training

SYS = {"role": "system", "content": "You repair code."}


def _reqs(temperature, n=1):
    return [GenerationRequest([SYS, {"role": "user", "content": "fix add " + "x" * (3 * i)}], seed=100 + i,
                              max_tokens=12, temperature=temperature, n=n) for i in range(5)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_equals_one_at_a_time(tiny, temperature):
    p = TransformersPolicy(*tiny, max_batch=8)
    reqs = _reqs(temperature)
    together = p.generate(reqs)
    alone = [p.generate([r])[0] for r in reqs]
    for a, b in zip(together, alone):
        assert a[0].token_ids == b[0].token_ids and a[0].text == b[0].text
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    # a different batch split (max_batch=2) changes nothing either
    small = TransformersPolicy(*tiny, max_batch=2).generate(reqs)
    assert [c[0].token_ids for c in small] == [c[0].token_ids for c in together]
    if temperature > 0:        # seeds matter: another seed samples another sequence
        other = p.generate([GenerationRequest(reqs[0].messages, seed=7, max_tokens=12, temperature=1.0)])
        assert other[0][0].token_ids != together[0][0].token_ids


def test_n_samples_are_seeded_per_sample(tiny):
    p = TransformersPolicy(*tiny)
    [four] = p.generate([_reqs(1.0, n=4)[0]])
    [one] = p.generate([_reqs(1.0, n=1)[0]])
    assert len(four) == 4 and four[0].token_ids == one[0].token_ids   # sample 0 = the n=1 sample
    assert len({tuple(c.token_ids) for c in four}) > 1


def test_ids_and_logprobs_are_what_the_model_gives(tiny):
    """Recompute with one plain forward pass over prompt + completion: the returned ids are what
    was fed/sampled and each logprob is the model's (temperature-scaled) log-probability."""
    import torch

    model, tok = tiny
    p = TransformersPolicy(model, tok)
    for temperature in (0.0, 0.7):
        [[c]] = p.generate([GenerationRequest([SYS, {"role": "user", "content": "hello"}], seed=3,
                                              max_tokens=10, temperature=temperature)])
        assert c.prompt_ids == tok.encode(tok.apply_chat_template(
            [SYS, {"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False)
        assert c.prompt_tokens == len(c.prompt_ids) and c.completion_tokens == len(c.token_ids) == len(c.logprobs)
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(c.prompt_ids) - 1:-1].float()
        t = temperature or 1.0
        want = torch.log_softmax(logits / t, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert c.logprobs == pytest.approx(want.tolist(), abs=1e-4)
        if temperature == 0.0:
            assert c.token_ids == logits.argmax(-1).tolist()


def test_stop_strings_and_length(tiny):
    p = TransformersPolicy(*tiny)
    [[free]] = p.generate([GenerationRequest([SYS], seed=1, max_tokens=15, temperature=1.0)])
    assert free.finish_reason == "length" and len(free.token_ids) == 15
    stop = free.text[4:6]
    [[cut]] = p.generate([GenerationRequest([SYS], seed=1, max_tokens=15, temperature=1.0, stop=(stop,))])
    assert cut.finish_reason == "stop" and stop not in cut.text and free.text.startswith(cut.text)


def test_loads_local_folders_only(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    p = TransformersPolicy.from_path(tmp_path / "ckpt")
    req = _reqs(0.0)[:2]
    assert [c[0].token_ids for c in p.generate(req)] == [c[0].token_ids for c in TransformersPolicy(*tiny).generate(req)]
    assert p.spec["config"]["path"] == str(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError):
        TransformersPolicy.from_path(tmp_path / "missing")


def test_prompt_extends_the_sampled_ids(tiny):
    """Turn 2's prompt = turn 1's prompt + sampled ids + the tokens of the tool message, so the
    episode is one token sequence with the env's tokens masked (training_sequence)."""
    from ratchet.policy.runner import Turn

    p = TransformersPolicy(*tiny)
    msgs = [SYS, {"role": "user", "content": "fix it"}]
    [[c1]] = p.generate([GenerationRequest(msgs, seed=2, max_tokens=8, temperature=1.0)])
    msgs2 = msgs + [{"role": "assistant", "content": c1.text},
                    {"role": "tool", "tool_call_id": "call_00", "name": "run_tests", "content": "1 failed"}]
    [[c2]] = p.generate([GenerationRequest(msgs2, seed=3, max_tokens=8, temperature=1.0,
                                           prefix_ids=c1.prompt_ids + c1.token_ids)])
    head = c1.prompt_ids + c1.token_ids
    assert c2.prompt_ids[:len(head)] == head
    gap = c2.prompt_ids[len(head):]
    assert "1 failed" in p.tok.decode(gap) and "<|im_start|>tool" in p.tok.decode(gap)
    turns = [Turn(i, c.text, [], [], c.finish_reason, prompt_ids=c.prompt_ids, completion_ids=c.token_ids,
                  logprobs=c.logprobs) for i, c in enumerate((c1, c2))]
    seq = training_sequence(turns)
    assert seq["prompt_ids"] == c1.prompt_ids
    assert seq["completion_ids"] == c1.token_ids + gap + c2.token_ids
    assert seq["env_mask"] == [1] * len(c1.token_ids) + [0] * len(gap) + [1] * len(c2.token_ids)
    assert [lp for lp, m in zip(seq["logprobs"], seq["env_mask"]) if m] == c1.logprobs + c2.logprobs
    turns[1].prompt_ids = c2.prompt_ids[1:]          # a prompt that does not extend the last turn
    assert training_sequence(turns) is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefix_cache_prefills_only_new_tokens_and_changes_nothing(tiny, temperature):
    """Over three turns of five conversations, keeping each episode's KV cache between turns gives
    the same ids and logprobs as re-reading the whole prompt, while prefilling far fewer tokens."""
    outs, stats = {}, {}
    for size in (0, 64):
        p = TransformersPolicy(*tiny, prefix_cache=size)
        convs = [[SYS, {"role": "user", "content": "fix add " + "x" * (7 * i)}] for i in range(5)]
        prev, got = [None] * 5, []
        for turn in range(3):
            reqs = [GenerationRequest(c, seed=10 * i + turn, max_tokens=4 + 3 * i, temperature=temperature,
                                      prefix_ids=pv) for i, (c, pv) in enumerate(zip(convs, prev))]
            for i, [c] in enumerate(p.generate(reqs)):
                got.append(c)
                convs[i] = convs[i] + [{"role": "assistant", "content": c.text},
                                       {"role": "tool", "tool_call_id": "c", "name": "run_tests", "content": f"obs {turn}"}]
                prev[i] = c.prompt_ids + c.token_ids
        outs[size], stats[size] = got, p.stats
    for a, b in zip(outs[0], outs[64]):
        assert a.prompt_ids == b.prompt_ids and a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert stats[0]["cached_tokens"] == 0 and stats[64]["cached_tokens"] > 0
    assert stats[64]["prefill_tokens"] + stats[64]["cached_tokens"] == stats[0]["prefill_tokens"]
    assert stats[64]["prefill_tokens"] < stats[0]["prefill_tokens"] / 2


def test_shared_system_turn_is_prefilled_once(tiny):
    """A new episode with the same system prompt and tools reuses the system turn's KV."""
    cold, warm = TransformersPolicy(*tiny, prefix_cache=0), TransformersPolicy(*tiny, prefix_cache=8)
    first = [GenerationRequest([SYS, {"role": "user", "content": "fix add"}], seed=1, max_tokens=5, temperature=1.0)]
    warm.generate(first)
    assert warm.stats["cached_tokens"] == 0
    later = [GenerationRequest([SYS, {"role": "user", "content": f"fix sub {i}"}], seed=i, max_tokens=5,
                               temperature=1.0) for i in range(3)]
    a, b = cold.generate(later), warm.generate(later)
    assert [c[0].token_ids for c in a] == [c[0].token_ids for c in b]
    for x, y in zip(a, b):
        assert y[0].logprobs == pytest.approx(x[0].logprobs, abs=1e-4)
    tok = tiny[1]
    ids = tok.encode(tok.apply_chat_template([SYS], tokenize=False), add_special_tokens=False)
    system_turn = ids.index(tok.eos_token_id) + 1            # up to and including its <|im_end|>
    assert warm.stats["cached_tokens"] == 3 * system_turn


def test_copy_free_decode_attention_matches_sdpa(tiny):
    """engines.attention (grouped-query decode without repeating the cache, in-place KV buffers)
    gives the ids and logprobs of transformers' own SDPA path, on a padded batch, and leaves the
    model's attention setting as it was."""
    reqs = _reqs(1.0)
    fast, plain = TransformersPolicy(*tiny, gqa_decode=True), TransformersPolicy(*tiny, gqa_decode=False)
    assert fast.gqa_decode and not plain.gqa_decode
    a, b = fast.generate(reqs), plain.generate(reqs)
    for x, y in zip(a, b):
        assert x[0].token_ids == y[0].token_ids
        assert x[0].logprobs == pytest.approx(y[0].logprobs, abs=1e-4)
    assert tiny[0].config._attn_implementation == "sdpa"
