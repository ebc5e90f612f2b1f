"""Reward-filtered self-training (ReST-EM, expert iteration): an RL step whose policy improvement
is maximum likelihood on the policy's own rewarded episodes.

One round from a checkpoint: sample `k` episodes per task at temperature T in the sandbox (the
composed verifier scores them, as GRPO's rollouts), keep per task the passing episode with the
fewest turns (infra failures never), then continue SFT from the same checkpoint on the kept
episodes (plus, optionally, the demonstrations SFT trained on), under the checkpoint's view and
decoding. Why a second RL method beside GRPO (`grpo_loop`): under greedy decoding, what the holdout
evaluation does, GRPO's small KL-bounded steps moved the sampled distribution but not the
policy's first choice (RL - SFT -0.6 and +2.2 points pooled on two task samples, measured with
bench/rl_variant.py; see docs/experiments/);
a likelihood step on a sampled pass moves the argmax toward it, as SFT moved the untrained model.

    res = train_rest(sft_ckpt, bundles, out_dir, RestSettings(), demos=rows, runtime=rt)
    res.checkpoint, res.kept, res.sampled, res.cpu_s
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence


@dataclass
class RestSettings:
    samples: int = 4                 # episodes per task
    keep: int = 1                    # passes kept per task (the fewest turns first)
    temperature: float = 1.0
    epochs: float = 2.0
    learning_rate: float = 1e-3
    batch_size: int = 4
    max_turns: int = 14
    max_tokens: int = 96
    concurrency: int = 16
    rollout_workers: int = 2
    seed: int = 0
    threads: int = 1
    sft_overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.samples < 1 or self.keep < 1:
            raise ValueError("samples and keep must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0: greedy samples of one task are all the same episode")


@dataclass
class RestResult:
    checkpoint: Path
    sampled: int
    passed: int
    kept: int
    tasks_with_pass: int
    infra: int
    cpu_s: float
    sample_cpu_s: float
    wall_s: float
    losses: list = field(default_factory=list)
    parent: str = ""


def select_passes(records, keep: int = 1) -> list:
    """Per task the passing, non-infra records with the fewest turns (ties: the lower seed), at most
    `keep` each, in task order."""
    by: dict = {}
    for r in records:
        if r.passed and r.outcome != "infra_failure":
            by.setdefault(r.task_id, []).append(r)
    return [r for t in sorted(by) for r in sorted(by[t], key=lambda r: (r.turns, r.seed))[:keep]]


def as_rows(records, tag: str = "rest") -> list[dict]:
    """Episode records -> SFT rows (the shape `tenant_training_rows` gives)."""
    return [{"record_id": f"{tag}-{r.task_id}-{r.seed}", "task_id": r.task_id, "consent_id": None,
             "messages": r.messages, "tools": r.tools} for r in records]


def sample(start, bundles: Sequence, settings: RestSettings, *, runtime=None) -> list:
    """`settings.samples` episodes per bundle from checkpoint `start` under its decoding (mask,
    bounds, view), seeds 1000 * (seed + 1) + i, over `rollout_workers` processes."""
    from ratchet.policy.embedded.decoding import read_decoding
    from ratchet.policy.embedded.model import load_policy
    from ratchet.policy.rollout_pool import RolloutPool
    from ratchet.policy.runner import Sampling

    model, tok = load_policy(start)
    model.eval()
    dec = read_decoding(start)
    engine = {"policy_id": "rest", "constrained": True, "chat": "embedded", **dec}
    base = 1000 * (settings.seed + 1)
    jobs = [(b, base + i) for i in range(settings.samples) for b in bundles]
    kw = {"concurrency": settings.concurrency, "max_turns": settings.max_turns,
          "sampling": Sampling(temperature=settings.temperature, max_tokens=settings.max_tokens),
          "min_batch": settings.concurrency}
    with RolloutPool(max(1, settings.rollout_workers), runtime=runtime) as pool:
        return pool.run(model, tok, engine, jobs, runtime=runtime, **kw)


def train_rest(start, bundles: Sequence, out_dir, settings: RestSettings = RestSettings(), *, demos=(),
               runtime=None) -> RestResult:
    """One ReST round from checkpoint `start` on `bundles` (train-split tasks); `demos`: SFT rows
    trained on again beside the kept passes. Writes out_dir with the checkpoint's decoding and a
    `ratchet_checkpoint.json` whose stage is "rl" and method "rest"."""
    import torch

    from ratchet.policy.embedded.decoding import read_decoding, write_decoding
    from ratchet.policy.grammar import Bounds
    from ratchet.training.sft import CHECKPOINT_META, SFTSettings, train_sft
    from sandboxes.cpu_meter import tree_cpu_s

    torch.set_num_threads(settings.threads)
    out = Path(out_dir)
    c0, t0 = tree_cpu_s(), time.monotonic()
    recs = sample(start, bundles, settings, runtime=runtime)
    sample_cpu = tree_cpu_s() - c0
    kept = select_passes(recs, settings.keep)
    rows = as_rows(kept) + list(demos)
    if not rows:
        raise ValueError(f"ReST: no episode of {len(recs)} passed and no demonstrations were given: nothing to train on")
    dec = read_decoding(start)
    view = dec.get("view")
    sft = train_sft(start, rows, out, SFTSettings(epochs=settings.epochs, learning_rate=settings.learning_rate,
                                                  batch_size=settings.batch_size, thoughts=False, seed=settings.seed,
                                                  threads=settings.threads, overrides=dict(settings.sft_overrides)),
                    view=view)
    bounds = dec.get("grammar", {}).get("bounds")
    write_decoding(out, action_mask=dec.get("action_mask"), bounds=bounds if isinstance(bounds, Bounds) else None,
                   view=view)
    res = RestResult(checkpoint=out, sampled=len(recs), passed=sum(1 for r in recs if r.passed),
                     kept=len(kept), tasks_with_pass=len({r.task_id for r in kept}),
                     infra=sum(1 for r in recs if r.outcome == "infra_failure"),
                     cpu_s=round(tree_cpu_s() - c0, 3), sample_cpu_s=round(sample_cpu, 3),
                     wall_s=round(time.monotonic() - t0, 3), losses=sft.losses, parent=str(start))
    meta_p = out / CHECKPOINT_META
    meta = json.loads(meta_p.read_text())
    meta.update({"stage": "rl", "method": "rest", "parent": str(start), "rest": asdict(settings),
                 "sampled": res.sampled, "passed": res.passed, "kept": res.kept, "infra": res.infra,
                 "kept_ids": [f"{r.task_id}:{r.seed}" for r in kept], "cpu_s": res.cpu_s,
                 "sample_cpu_s": res.sample_cpu_s, "wall_s": res.wall_s})
    meta_p.write_text(json.dumps(meta, indent=1))
    return res
