"""Trainer placement: CUDA with bf16 where a GPU is, the CPU otherwise, one code path."""
import pytest


def test_auto_is_the_cpu_here_and_cuda_where_a_gpu_is(monkeypatch):
    import torch

    from ratchet.training.device import resolve_device, trainer_device_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device() == "cpu"
    assert trainer_device_args() == {"use_cpu": True, "bf16": False, "fp16": False}
    with pytest.raises(RuntimeError, match="no GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert trainer_device_args() == {"use_cpu": False, "bf16": True, "fp16": False}
    assert trainer_device_args("cpu")["use_cpu"] is True
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert trainer_device_args("auto")["bf16"] is False


def test_the_trainers_take_their_placement_from_the_setting(monkeypatch, tmp_path):
    import torch

    from ratchet.training.sft import SFTSettings, make_trainer
    from tests.policy.conftest import tiny_model

    with pytest.raises(ValueError, match="device"):
        SFTSettings(device="tpu")
    with pytest.raises(ValueError, match="use_cpu"):
        SFTSettings(overrides={"use_cpu": False})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from datasets import Dataset

    model, tok = tiny_model()
    ds = Dataset.from_list([{"input_ids": [1, 2, 3], "assistant_masks": [0, 1, 1]}])
    trainer = make_trainer(model, tok, ds, tmp_path, SFTSettings(max_steps=1))
    assert trainer.args.use_cpu is True and trainer.args.bf16 is False
