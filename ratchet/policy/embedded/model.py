"""The embedded base policy: a small Qwen2-style transformer sized to train on 2 CPU cores in
minutes, with the locally trained tokenizer, saved as a local HF checkpoint.

    path = build_base_policy(out_dir, corpus_texts)        # built once, cached by content key
    model, tok = load_policy(path)                         # or any local HF checkpoint path
    model = with_lora(model)                               # peft LoRA, for large checkpoints
    model, used = maybe_lora(model, "auto")                # what the trainers call (lora="auto")

`build_base_policy` is deterministic for (corpus, config, seed, format version): the folder is
named by that content key and reused when present, so the asset builds it once. Its weights are
random (untrained): the "untrained base_policy" every candidate starts from, which the grammar
makes a random-but-valid agent. Nothing here touches a hub (`local_files_only=True`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT_VERSION = "ratchet-embedded/1"   # bump when the chat template or tokenizer recipe changes
MANIFEST = "ratchet_base.json"


@dataclass(frozen=True)
class EmbeddedConfig:
    """~1.3M parameters with a 4k vocabulary: small enough to train on CPU (~4.3k training tokens/s
    were measured for a 1.5M-parameter model of this shape on 2 cores)."""
    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    rope_theta: float = 10_000.0
    min_frequency: int = 2


def content_key(texts: Sequence[str], config: EmbeddedConfig, seed: int) -> str:
    from ratchet.policy.embedded.chat import CHAT_TEMPLATE
    from ratchet.policy.embedded.corpus import corpus_sha256

    blob = json.dumps({"corpus": corpus_sha256(texts), "config": asdict(config), "seed": seed,
                       "format": FORMAT_VERSION, "template": hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def new_model(tokenizer, config: EmbeddedConfig = EmbeddedConfig(), seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM whose vocabulary is exactly the tokenizer's."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=config.hidden_size,
                      intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
                      num_attention_heads=config.num_attention_heads,
                      num_key_value_heads=config.num_key_value_heads,
                      max_position_embeddings=config.max_position_embeddings, rope_theta=config.rope_theta,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, use_cache=True)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_base_policy(out_dir: str | Path, corpus: Sequence[str], *, config: EmbeddedConfig = EmbeddedConfig(),
                      seed: int = 0) -> Path:
    """Train the tokenizer on `corpus` (see `corpus.py` for what may enter it), initialise the model,
    save both under `out_dir/base-<content key>` and return that path (reused when it exists)."""
    from ratchet.policy.embedded.corpus import corpus_sha256
    from ratchet.policy.embedded.tokenizer import train_tokenizer

    corpus = list(corpus)
    if not corpus:
        raise ValueError("empty corpus: the tokenizer needs train-split text (see ratchet.policy.embedded.corpus)")
    key = content_key(corpus, config, seed)
    final = Path(out_dir) / f"base-{key}"
    if (final / MANIFEST).exists():
        return final
    t0, c0 = time.monotonic(), time.process_time()
    tok = train_tokenizer(corpus, vocab_size=config.vocab_size, min_frequency=config.min_frequency)
    model = new_model(tok, config, seed)
    tmp = Path(out_dir) / f".base-{key}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    n_params = sum(p.numel() for p in model.parameters())
    (tmp / MANIFEST).write_text(json.dumps({
        "key": key, "format": FORMAT_VERSION, "config": asdict(config), "seed": seed,
        "corpus_sha256": corpus_sha256(corpus), "corpus_texts": len(corpus),
        "corpus_chars": sum(map(len, corpus)), "vocab": len(tok), "parameters": n_params,
        "build_wall_s": round(time.monotonic() - t0, 3), "build_cpu_s": round(time.process_time() - c0, 3)},
        indent=1))
    try:
        tmp.rename(final)              # atomic: a concurrent builder of the same key loses the race cleanly
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def base_manifest(path: str | Path) -> dict | None:
    p = Path(path) / MANIFEST
    return json.loads(p.read_text()) if p.exists() else None


def load_policy(path: str | Path, *, dtype=None):
    """(model, tokenizer) from a local HF checkpoint folder: the embedded base, a trained
    candidate, or any local checkpoint by configuration. Never downloads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ratchet.policy.embedded.tokenizer import load_tokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a local HF checkpoint (no config.json); hub ids are not fetched")
    ours = (path / MANIFEST).exists() or (path / "ratchet_checkpoint.json").exists()
    tok = load_tokenizer(path) if ours else AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    kw = {"local_files_only": True}
    if dtype is not None:
        kw["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(str(path), **kw)
    return model, tok


def with_lora(model, *, r: int = 16, alpha: int = 32, dropout: float = 0.05,
              target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj")):
    """Wrap a causal LM with a peft LoRA adapter (only the adapter trains). For large local
    checkpoints; the embedded model is small enough to train in full."""
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in target_modules if t in present]
    if not targets:
        raise ValueError(f"none of {list(target_modules)} are modules of this model")
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                                            task_type="CAUSAL_LM"))


def should_use_lora(model, threshold: int = 50_000_000) -> bool:
    return sum(p.numel() for p in model.parameters()) > threshold


LORA_MODES = ("auto", "on", "off")


def maybe_lora(model, mode: str = "auto", *, seed: int = 0, **lora_kw):
    """(model, used): the trainers' one switch. "on": `with_lora`; "auto": LoRA when the model has
    more than 50M parameters (a large local checkpoint given as base_policy's spec), the model
    itself otherwise (the embedded one trains in full); "off": the model itself. The adapter's
    random init draws from its own generator seeded by `seed` (the global one is left as it was),
    so two runs of the same settings start from the same adapter."""
    if mode not in LORA_MODES:
        raise ValueError(f"lora must be one of {LORA_MODES}, got {mode!r}")
    if mode == "on" or (mode == "auto" and should_use_lora(model)):
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return with_lora(model, **lora_kw), True
    return model, False


def has_adapter(model) -> bool:
    return hasattr(model, "peft_config")


def merged(model):
    """A plain HF model with the LoRA adapter folded into its weights (a copy: `model` keeps its
    adapter and can go on training), or `model` itself when it has none. What a trained checkpoint
    saves, so evaluation and the next stage load it with `load_policy` and no peft."""
    if not has_adapter(model):
        return model
    import copy

    return copy.deepcopy(model).merge_and_unload()


def resolve_base_policy(spec: str, out_dir: str | Path, corpus, **build_kw) -> Path:
    """What the `base_policy` asset calls: spec "embedded" builds (or reuses) the embedded base from
    `corpus` (texts, or a zero-argument callable returning them: the content key needs them);
    any other spec is a local HF checkpoint folder, returned after checking it exists (no hub ids)."""
    if spec != "embedded":
        path = Path(spec).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"base policy {spec!r} is neither 'embedded' nor a local HF checkpoint folder")
        return path
    return build_base_policy(out_dir, corpus() if callable(corpus) else corpus, **build_kw)
