"""Shared fixtures for the training tests: real trajectories recorded from the scripted expert and
the noisy agent in the real sandbox (`fixtures/make_trajectories.py` regenerates them), a tokenizer
trained on them, and a tiny randomly initialised model of the embedded architecture."""
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def trajectories() -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / "trajectories.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def tools() -> list[dict]:
    """The tools these trajectories were recorded with: Ratchet's own twelve (the agent tools,
    bash and str_replace_editor, came later; tests of them build their own rows)."""
    from sandboxes.tools import TOOL_SCHEMAS
    return [t for t in TOOL_SCHEMAS if t["function"]["name"] not in ("bash", "str_replace_editor")]


@pytest.fixture(scope="session")
def tokenizer(trajectories, tools):
    from ratchet.policy.embedded.chat import render
    from ratchet.policy.embedded.tokenizer import train_tokenizer

    return train_tokenizer([render(t["messages"], tools, add_generation_prompt=False) for t in trajectories],
                           vocab_size=1024)


TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 8192}


@pytest.fixture
def tiny_model(tokenizer):
    from ratchet.policy.embedded.model import EmbeddedConfig, new_model
    return new_model(tokenizer, EmbeddedConfig(**TINY), seed=0)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine the
    spinning threads made each small matmul ~100x slower (measured 6 ms per tiny linear)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
