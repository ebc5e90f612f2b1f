import pytest

HERMES = (
    "{%- for m in messages -%}"
    "<|im_start|>{{ m.role }}\n"
    "{%- if m.content -%}{{ m.content }}{%- endif -%}"
    "{%- for c in (m.tool_calls or []) -%}<tool_call>{\"name\": {{ c.function.name | tojson }}, "
    "\"arguments\": {{ c.function.arguments }}}</tool_call>{%- endfor -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")


def _corpus() -> list[str]:
    """Text like what the policy reads (prompts, tool output) so prompts are tens of tokens
    per line, not one per byte."""
    import json

    from sandboxes.env import SYSTEM_PROMPT
    from sandboxes.tools import TOOL_SCHEMAS

    return [SYSTEM_PROMPT, json.dumps(TOOL_SCHEMAS), "error: your reply contained no tool call. Reply with",
            "Repository: humaneval/HumanEval/0\nIssue HE-0: `has_close_elements` returns the wrong result",
            "1 failed, 3 passed\nFAILED test_solution.py::test_check_00", "def add(a, b):\n    return a + b\n",
            '<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>']


def tiny_model(vocab: int = 1000, layers: int = 2, hidden: int = 64, seed: int = 0):
    """A randomly initialised Qwen2 model and a byte-level BPE tokenizer trained here on a few
    strings (offline), with a Hermes-style chat template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus() * 5, tr)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = HERMES
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval(), fast


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from sandboxes.humaneval import build_suite

    return build_suite(seed=0, limit=3, per_problem=2, cache_dir=tmp_path_factory.mktemp("suite")).tasks
