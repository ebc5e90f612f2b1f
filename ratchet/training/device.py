"""Where the trainers run: a GPU with bf16 when one is present, else the CPU, with one code path.

    args = trainer_device_args(settings.device)     # TRL config kwargs: use_cpu, bf16, fp16

"auto" (the default) picks CUDA when torch sees a GPU and the CPU otherwise; "cpu" forces the
CPU (the reference every test runs); "cuda" without a GPU is an error rather than a silent
fallback, so a cluster job that lost its GPU fails instead of training 50x slower. bf16 only where
the GPU supports it: on the CPU bf16 autocast was ~10x slower than float32 (docs/training.md).
"""
from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str = "auto") -> str:
    import torch

    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    has_gpu = torch.cuda.is_available()
    if device == "cuda" and not has_gpu:
        raise RuntimeError("device 'cuda' was asked for but torch sees no GPU (use 'auto' or 'cpu')")
    return "cuda" if device == "cuda" or (device == "auto" and has_gpu) else "cpu"


def trainer_device_args(device: str = "auto") -> dict:
    """The transformers/TRL TrainingArguments that place a run: CPU float32, or CUDA with bf16
    when the GPU has it."""
    import torch

    dev = resolve_device(device)
    bf16 = dev == "cuda" and torch.cuda.is_bf16_supported()
    return {"use_cpu": dev == "cpu", "bf16": bf16, "fp16": False}
