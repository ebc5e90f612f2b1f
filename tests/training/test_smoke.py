"""The GPU smoke's code on the CPU: the same SFT and GRPO calls as on a GPU, on a small model of
the same architecture; the full shape is SmolLM2-135M's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_smoke_trains_and_reports_on_the_cpu(tmp_path):
    r = subprocess.run([str(ROOT / "scripts" / "gpu_smoke.sh"), "--device", "cpu", "--tiny", "--out", str(tmp_path)],
                       capture_output=True, text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["bench"] == "gpu_smoke" and res["device"] == "cpu" and res["shape"] == "tiny"
    assert res["sft_steps"] == 2 and len(res["sft_loss"]) == 2
    assert len(res["grpo_steps"]) == 2 and res["grpo_sequences"] >= 4
    assert res["grpo_steps"][0]["policy_tokens"] > 0
    assert res["generate_tokens_per_s"] > 0
    assert (tmp_path / "sft" / "config.json").exists()           # the SFT trainer saved its checkpoint
    assert "SFT: 2 steps" in r.stderr and "GRPO: 2 updates" in r.stderr


def test_the_full_shape_is_smollm2s():
    from ratchet.training.smoke import SMOLLM2_SHAPE

    from transformers import LlamaConfig, LlamaForCausalLM
    import torch

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE))
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 134.5   # the converted base's count


def test_cuda_without_a_gpu_fails_before_anything_runs(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from ratchet.training.smoke import run_smoke
    with pytest.raises(RuntimeError, match="no GPU"):
        run_smoke(device="cuda", tiny=True, out_dir=tmp_path)
