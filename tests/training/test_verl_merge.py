"""VeRL's FSDP checkpoint -> a plain HF folder through VeRL's own model merger, on a tiny Llama with
a LoRA adapter, written in the layout VeRL's FSDP checkpoint manager writes (per-rank DTensor
state dicts, `fsdp_config.json`, `huggingface/`, `lora_train_meta.json`)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.training

# Runs in a child: torch.distributed (one gloo rank, to make DTensors) stays out of the test process.
WRITE_CHECKPOINT = textwrap.dedent(r"""
    import json, sys
    from pathlib import Path
    import torch, torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer, models, pre_tokenizers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = Path(sys.argv[1])
    actor = root / "checkpoints" / "global_step_2" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (root / "checkpoints" / "global_step_1" / "actor").mkdir(parents=True)      # an older one
    (root / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(cfg)
    cfg.save_pretrained(actor / "huggingface")
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, root / "base.pt")
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(63)} | {"<unk>": 63}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(actor / "huggingface")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for n, p in peft_model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)          # a trained adapter: folding it changes the weights
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    sd = {k: distribute_tensor(v.detach().clone(), mesh, [Shard(0)]) for k, v in peft_model.state_dict().items()}
    torch.save(sd, actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"}))
    merged = peft_model.merge_and_unload()
    torch.save({k: v.clone() for k, v in merged.state_dict().items()}, root / "reference.pt")
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def merger_env():
    """The child's environment: VeRL (with ray, which its `__init__` imports) on the path."""
    from tests.training.verl_pkgs import DATA, LOOP, install

    from ratchet.training.verl_launch import verl_env
    env = verl_env()
    env["PYTHONPATH"] = os.pathsep.join([str(install(DATA)), str(install(LOOP)), env["PYTHONPATH"]])
    return env


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl_ckpt")
    r = subprocess.run([sys.executable, "-c", WRITE_CHECKPOINT, str(root)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return root


def test_the_merged_lora_checkpoint_is_a_plain_hf_folder_with_the_adapter_folded(checkpoint, merger_env, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ratchet.training.verl_launch import latest_actor_dir, merge_checkpoint

    assert latest_actor_dir(checkpoint / "checkpoints").parent.name == "global_step_2"
    out = merge_checkpoint(checkpoint / "checkpoints", tmp_path / "rl", env=merger_env)
    assert not (out / "adapter_config.json").exists()           # loads with no peft
    assert json.loads((out / "lora_adapter" / "adapter_config.json").read_text())["r"] == 4
    model = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("w5") == 5
    ref = torch.load(checkpoint / "reference.pt")
    got = model.state_dict()
    assert set(got) == set(ref)
    for k, v in ref.items():
        # VeRL's merger writes bf16: the folded weights match the reference fold to bf16 precision
        assert torch.allclose(got[k].float(), v, atol=2e-2, rtol=1e-2), k
    base_q = torch.load(checkpoint / "base.pt")["model.layers.0.self_attn.q_proj.weight"]
    assert (got["model.layers.0.self_attn.q_proj.weight"].float() - base_q).abs().max() > 0.1
    assert not (tmp_path / "rl.merging").exists()


def test_a_merge_that_cannot_run_fails_clearly_and_writes_nothing(checkpoint, tmp_path):
    from ratchet.training.verl_launch import latest_actor_dir, merge_checkpoint, verl_env

    with pytest.raises(FileNotFoundError, match="no VeRL checkpoint"):
        latest_actor_dir(tmp_path)
    (tmp_path / "ck" / "global_step_3" / "actor").mkdir(parents=True)      # a save cut short
    with pytest.raises(FileNotFoundError, match="not a VeRL FSDP actor checkpoint"):
        latest_actor_dir(tmp_path / "ck")
    # where VeRL is not installed (the venv itself): the merger's own error, and no folder
    with pytest.raises(RuntimeError, match="model merger failed .*No module named 'verl'"):
        merge_checkpoint(checkpoint / "checkpoints", tmp_path / "rl", env=verl_env())
    assert not (tmp_path / "rl").exists() and not (tmp_path / "rl.merging").exists()
