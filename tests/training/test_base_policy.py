"""The embedded base policy: built once from a clean corpus, cached by content, loadable, LoRA-able."""
import json

import pytest

from ratchet.policy.embedded.corpus import CorpusError, task_texts, trajectory_texts
from ratchet.policy.embedded.model import EmbeddedConfig, base_manifest, build_base_policy, load_policy, with_lora

pytestmark = pytest.mark.training

SMALL = EmbeddedConfig(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1)


def _tasks(n=4, split="train"):
    return [{"task_id": f"humaneval-00{i}-x", "repo": f"humaneval/HumanEval/{i}", "issue_id": f"HE-00{i}",
             "issue_text": f"`f{i}` returns the wrong value for ({i}, 2)", "split": split,
             "solution": f"def f{i}(a, b):\n    return a - b\n"} for i in range(n)]


def test_corpus_refuses_validation_holdout_and_unassigned_items(tools, trajectories):
    texts = task_texts(_tasks(), tools)
    assert len(texts) == 4 and "   2|     return a - b" in texts[0] and "# Tools" in texts[0]
    for split in ("validation", "holdout", None):
        with pytest.raises(CorpusError):
            task_texts(_tasks(2) + _tasks(1, split=split), tools)
        with pytest.raises(CorpusError):
            trajectory_texts([{**trajectories[0], "split": split, "tools": tools}])
    assert trajectory_texts([{**trajectories[0], "split": "train", "tools": tools}])


def test_build_base_policy_once_then_cached_and_loadable(tmp_path, tools):
    corpus = task_texts(_tasks(), tools)
    p1 = build_base_policy(tmp_path, corpus, config=SMALL)
    stamp = (p1 / "model.safetensors").stat().st_mtime_ns
    p2 = build_base_policy(tmp_path, corpus, config=SMALL)
    assert p1 == p2 and (p2 / "model.safetensors").stat().st_mtime_ns == stamp      # not rebuilt
    p3 = build_base_policy(tmp_path, corpus + ["def extra():\n    pass\n"], config=SMALL)
    assert p3 != p1                                                                   # content-keyed
    man = base_manifest(p1)
    assert man["corpus_texts"] == 4 and man["parameters"] > 10_000 and man["vocab"] <= 600
    model, tok = load_policy(p1)
    saved = json.loads((p1 / "tokenizer.json").read_text())         # not silently rebuilt as Qwen2Tokenizer
    loaded = json.loads(tok.backend_tokenizer.to_str())
    assert loaded["pre_tokenizer"] == saved["pre_tokenizer"] and loaded["model"]["merges"] == saved["model"]["merges"]
    assert model.config.vocab_size == len(tok) and tok.eos_token == "<|im_end|>"
    assert tok.chat_template and "{% generation %}" in tok.chat_template
    ids = tok("def f(a):\n    return a", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "def f(a):\n    return a"


def test_load_policy_refuses_a_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "Qwen" / "Qwen2.5-0.5B")


def test_lora_trains_only_the_adapter(tiny_model):
    peft_model = with_lora(tiny_model, r=4, alpha=8)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with pytest.raises(ValueError):
        with_lora(tiny_model, target_modules=("no_such_proj",))


def test_resolve_base_policy_embedded_or_a_local_folder(tmp_path, tools):
    from ratchet.policy.embedded.model import resolve_base_policy

    p = resolve_base_policy("embedded", tmp_path, lambda: task_texts(_tasks(2), tools), config=SMALL)
    assert (p / "ratchet_base.json").exists()
    assert resolve_base_policy(str(p), tmp_path / "unused", None) == p      # a local checkpoint by path
    with pytest.raises(FileNotFoundError):
        resolve_base_policy("Qwen/Qwen2.5-0.5B-Instruct", tmp_path, None)
