"""The embedded policy's tokenizer: byte-level BPE trained locally (HF `tokenizers`) on the
documented corpus (`ratchet.policy.embedded.corpus`), saved as a `PreTrainedTokenizerFast`.

Byte-level: every string has a tokenisation (no unknown token), which the grammar engine needs to
reach any character a JSON string may hold. Load it with `load_tokenizer`, not `AutoTokenizer`: a
folder whose model config says qwen2 is silently rebuilt as `Qwen2Tokenizer` with another
pre-tokeniser (different ids, no warning).
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ratchet.policy.embedded.chat import CHAT_TEMPLATE, IM_END, PAD, SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2):
    """A fresh byte-level BPE tokenizer trained on `texts` (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return wrap(tok)


def wrap(tok):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD,
                                   additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (IM_END, PAD)],
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def load_tokenizer(path: str | Path):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast.from_pretrained(str(path))
    fast.chat_template = fast.chat_template or CHAT_TEMPLATE
    return fast
