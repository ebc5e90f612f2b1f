"""GRPO pieces that need no sandbox: group-normalised advantages with infra failures left out,
multi-turn episodes assembled from the exact sampled ids with an env mask over tool output, and
the clipped per-token loss with a KL term (for a hand-written loop and for checking TRL's).

Multi-turn layout (TRL GRPOTrainer `rollout_func` keys; VeRL's response_mask is the same idea):

    prompt_ids      system + issue + "<|im_start|>assistant\\n"            (not trained)
    completion_ids  turn 1 sampled ids | tool output + next gen prompt | turn 2 sampled ids | ...
    env_mask        1 ... 1            | 0 ... 0                       | 1 ... 1
    logprobs        sampler's logprobs | 0.0                           | sampler's logprobs

The sampled ids are used as sampled (never re-tokenised from text); the tool span between two
turns is the chat template's own text for those tool messages (`observation_ids`), so the
assembled sequence equals `to_training_example` of the finished trajectory whenever the sampler
chose canonical tokens (tests/training/test_grpo.py).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def group_advantages(rewards: Sequence[float | None], group_size: int, *, scale: bool = True,
                     eps: float = 1e-4) -> tuple[list[float | None], dict]:
    """Per consecutive group of `group_size` rollouts of one task: A = (r - mean) / (std + eps)
    over the group's scored rollouts (TRL's default: sample std, `scale_rewards="group"`).
    None (an infra failure: unscorable, never 0.0) gets None and is left out of the mean and
    std, so a harness fault neither lowers nor raises anyone's advantage. A group with fewer than
    two scored rollouts carries no signal: advantages 0. Returns (advantages, counts)."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    out: list[float | None] = []
    counts = {"rollouts": len(rewards), "infra_failures": 0, "groups": len(rewards) // group_size,
              "flat_groups": 0}
    for g in range(0, len(rewards), group_size):
        grp = rewards[g:g + group_size]
        scored = [r for r in grp if r is not None]
        counts["infra_failures"] += len(grp) - len(scored)
        if len(scored) < 2:
            counts["flat_groups"] += 1
            out += [None if r is None else 0.0 for r in grp]
            continue
        mean = sum(scored) / len(scored)
        std = math.sqrt(sum((r - mean) ** 2 for r in scored) / (len(scored) - 1))
        if std == 0:
            counts["flat_groups"] += 1
        denom = (std + eps) if scale else 1.0
        out += [None if r is None else (r - mean) / denom for r in grp]
    return out, counts


def observation_ids(tool_messages: Sequence[Mapping], tools, tokenizer, *, next_turn: bool = True) -> list[int]:
    """The env tokens between two policy turns: the template's text after an assistant turn's stop
    token, for these tool messages, up to the next `<|im_start|>assistant\\n` (when `next_turn`)."""
    from ratchet.policy.embedded.chat import render_spans

    stub = {"role": "assistant", "content": "", "tool_calls": []}
    text, spans = render_spans([stub, *tool_messages], tools, add_generation_prompt=next_turn)
    return tokenizer(text[spans[-1][1]:], add_special_tokens=False)["input_ids"]


def assemble_episode(prompt_ids: Sequence[int], turns: Sequence[Mapping]) -> dict:
    """One multi-turn rollout as TRL's `rollout_func` wants it. Each turn: `completion_ids` and
    `logprobs` as sampled, and `observation_ids` (what the environment answered, tokenised by
    `observation_ids`; empty after the last turn)."""
    completion, mask, logprobs = [], [], []
    for t in turns:
        ids, lps = list(t["completion_ids"]), list(t["logprobs"])
        if len(ids) != len(lps):
            raise ValueError("each sampled id needs its logprob")
        obs = list(t.get("observation_ids") or ())
        completion += ids + obs
        mask += [1] * len(ids) + [0] * len(obs)
        logprobs += lps + [0.0] * len(obs)
    return {"prompt_ids": list(prompt_ids), "completion_ids": completion, "env_mask": mask, "logprobs": logprobs}


def token_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, *, clip_eps: float = 0.2,
               beta: float = 0.04):
    """GRPO's per-token objective (DAPO-style token mean over the batch's policy tokens):
        ratio = exp(logp - logp_old);  surrogate = min(ratio * A, clip(ratio, 1 +- eps) * A)
        kl    = exp(ref - logp) - (ref - logp) - 1           (k3 estimator, >= 0)
        loss  = sum(mask * (-surrogate + beta * kl)) / sum(mask)
    Tensors [batch, tokens]; `advantages` [batch]; `mask` 1 on policy tokens, 0 on tool output and
    padding, so env tokens get no gradient. Returns (loss, {"kl", "clip_fraction"})."""
    import torch

    adv = advantages.unsqueeze(1)
    ratio = torch.exp(logprobs - old_logprobs)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    diff = ref_logprobs - logprobs
    kl = torch.exp(diff) - diff - 1
    m = mask.to(logprobs.dtype)
    n = m.sum().clamp(min=1)
    loss = (m * (-surrogate + beta * kl)).sum() / n
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip_eps).to(m.dtype)
        stats = {"kl": float((m * kl).sum() / n), "clip_fraction": float((m * clipped).sum() / n)}
    return loss, stats
