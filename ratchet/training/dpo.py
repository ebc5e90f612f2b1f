"""DPO (TRL DPOTrainer) from preferred vs rejected trajectories of the same task, on one tenant's
governed rows, with the loss on policy tokens only.

    pairs = preference_pairs(tenant_training_rows(con, "acme", accepted_only=False))
    res = train_dpo(sft_checkpoint, pairs, out_dir, DPOSettings())

A pair shares the prompt (system + issue: the environment's, identical for one task); the
preferred side is an accepted trajectory (tests pass, scored), the rejected side one of the same
task that was not. TRL's preference collator counts every token after the prompt, tool outputs
included (verified against TRL 1.16); here the pair is pre-tokenised through the same seam as SFT and a collator
subclass turns the completion mask into the assistant mask, so the environment's text never
enters the log-ratio. Kept in this one file: TRL's trainer internals are an experimental API.
"""
from __future__ import annotations

import copy
import json
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class DPOSettings:
    beta: float = 0.1
    epochs: float = 1.0
    max_steps: int = -1
    learning_rate: float = 5e-4
    batch_size: int = 2
    max_length: int = 4096
    max_pairs_per_task: int = 4
    seed: int = 0
    threads: int = 1                     # see docs/training.md: 1 beat 2 by 2-3x per CPU-second here
    logging_steps: int = 1
    lora: str = "auto"                   # as SFTSettings.lora: an adapter for > 50M parameters, merged on save
    device: str = "auto"                 # as SFTSettings.device (ratchet.training.device)
    overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.beta <= 0 or self.learning_rate <= 0 or self.batch_size < 1:
            raise ValueError("beta and learning_rate must be > 0, batch_size >= 1")
        from ratchet.policy.embedded.model import LORA_MODES
        if self.lora not in LORA_MODES:
            raise ValueError(f"lora must be one of {LORA_MODES}")
        from ratchet.training.device import DEVICES
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}")
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ValueError("set epochs > 0 or max_steps > 0")


def preference_pairs(rows: Sequence[Mapping], max_pairs_per_task: int = 4) -> list[tuple[Mapping, Mapping]]:
    """(preferred, rejected) rows of the same task: accepted vs not, in record_id order, at most
    `max_pairs_per_task` per task (each preferred row is reused round-robin)."""
    by_task: dict[str, dict[bool, list]] = defaultdict(lambda: {True: [], False: []})
    for r in sorted(rows, key=lambda r: r["record_id"]):
        by_task[r["task_id"]][bool(r.get("accepted"))].append(r)
    pairs = []
    for task in sorted(by_task):
        good, bad = by_task[task][True], by_task[task][False]
        for k, rej in enumerate(bad[:max_pairs_per_task] if good else []):
            pairs.append((good[k % len(good)], rej))
    return pairs


def pair_example(chosen: Mapping, rejected: Mapping, tokenizer, max_length: int | None = None) -> dict | None:
    """prompt_ids / chosen_ids / rejected_ids plus the assistant masks of both completions, or
    None when the two do not share the prompt (then they are not a pair of the same task)."""
    from ratchet.training.examples import to_training_example

    a = to_training_example(chosen["messages"], chosen.get("tools"), tokenizer, max_length=max_length)
    b = to_training_example(rejected["messages"], rejected.get("tools"), tokenizer, max_length=max_length)
    if 1 not in a["assistant_masks"] or 1 not in b["assistant_masks"]:
        return None
    p = a["assistant_masks"].index(1)
    if b["assistant_masks"].index(1) != p or a["input_ids"][:p] != b["input_ids"][:p]:
        return None
    return {"prompt_ids": a["input_ids"][:p], "chosen_ids": a["input_ids"][p:], "rejected_ids": b["input_ids"][p:],
            "chosen_mask": a["assistant_masks"][p:], "rejected_mask": b["assistant_masks"][p:]}


def _collator(pad_token_id: int, max_length: int | None):
    import torch
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.utils import pad

    class AssistantMaskPreferenceCollator(DataCollatorForPreference):
        """TRL's collator, with completion_mask = the assistant mask instead of 'after the prompt'."""

        def torch_call(self, examples):
            out = super().torch_call(examples)
            masks = [[0] * len(e["prompt_ids"]) + list(e[k]) for k in ("chosen_mask", "rejected_mask")
                     for e in examples]
            masks = [m[: self.max_length] if self.max_length else m for m in masks]
            out["completion_mask"] = pad([torch.tensor(m, dtype=torch.long) for m in masks], padding_value=0,
                                         padding_side="right")[:, : out["input_ids"].shape[1]]
            return out

    return AssistantMaskPreferenceCollator(pad_token_id=pad_token_id, max_length=max_length)


@dataclass
class DPOResult:
    checkpoint: Path
    losses: list[float]
    reward_margins: list[float]
    steps: int
    cpu_s: float
    wall_s: float
    n_pairs: int
    manifest: dict
    parent: str


def train_dpo(base: str | Path, pairs: Sequence[tuple[Mapping, Mapping]], out_dir: str | Path,
              settings: DPOSettings = DPOSettings(), *, model=None, tokenizer=None, on_log=None) -> DPOResult:
    import torch
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from ratchet.policy.embedded.model import load_policy, maybe_lora, merged
    from ratchet.training.data import data_manifest
    from ratchet.training.quiet import quiet_libraries, quiet_trainer

    quiet_libraries()

    class _PreTokenized(DPOTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset              # already prompt/chosen/rejected ids + masks (see pair_example)

    if model is None or tokenizer is None:
        model, tokenizer = load_policy(base)
    model, lora = maybe_lora(model, settings.lora, seed=settings.seed)
    examples, used = [], []
    for good, bad in pairs:
        ex = pair_example(good, bad, tokenizer, settings.max_length)
        if ex is not None:
            examples.append(ex)
            used += [good, bad]
    if not examples:
        raise ValueError("no usable preference pair (same task, shared prompt, trainable turns on both sides)")
    from ratchet.training.device import resolve_device, trainer_device_args

    torch.set_num_threads(settings.threads)
    # a large model on the CPU: one pair at a time, the batch accumulated (ratchet.training.sft.micro_batched)
    micro = settings.batch_size if lora and resolve_device(settings.device) == "cpu" \
        and "gradient_accumulation_steps" not in settings.overrides else 1
    cfg = DPOConfig(
        output_dir=str(Path(out_dir) / "trainer"), beta=settings.beta, num_train_epochs=settings.epochs,
        max_steps=settings.max_steps, per_device_train_batch_size=settings.batch_size // micro or 1,
        gradient_accumulation_steps=micro,
        learning_rate=settings.learning_rate, logging_steps=settings.logging_steps, save_strategy="no",
        seed=settings.seed, data_seed=settings.seed, max_length=settings.max_length,
        **trainer_device_args(settings.device), gradient_checkpointing=False, report_to=[], disable_tqdm=True, remove_unused_columns=False,
        dataloader_num_workers=0, **settings.overrides)
    # The reference is the starting policy, frozen: a copy (TRL would reload it from the model's hub
    # id/path, which an in-memory model lacks); a peft model needs none (adapters off = reference).
    ref = None if hasattr(model, "peft_config") else copy.deepcopy(model).eval().requires_grad_(False)
    trainer = _PreTokenized(model=model, ref_model=ref, args=cfg, train_dataset=Dataset.from_list(examples),
                            processing_class=tokenizer,
                            data_collator=_collator(tokenizer.pad_token_id, settings.max_length))
    quiet_trainer(trainer, on_log)      # log dicts to `on_log` (the Dagster step log), not printed
    c0, t0 = time.process_time(), time.monotonic()
    trainer.train()
    cpu_s, wall_s = time.process_time() - c0, time.monotonic() - t0
    hist = trainer.state.log_history
    losses = [h["loss"] for h in hist if "loss" in h]
    margins = [h["rewards/margins"] for h in hist if "rewards/margins" in h]
    out = Path(out_dir)
    if lora:
        merged(trainer.model).save_pretrained(str(out))
    else:
        trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    manifest = data_manifest(used)
    (out / "ratchet_checkpoint.json").write_text(json.dumps({
        "stage": "dpo", "parent": str(base), "settings": asdict(settings), "lora": lora, "losses": losses,
        "reward_margins": margins, "steps": trainer.state.global_step, "cpu_s": round(cpu_s, 3),
        "wall_s": round(wall_s, 3), "n_pairs": len(examples), **manifest}, indent=1))
    return DPOResult(out, losses, margins, trainer.state.global_step, round(cpu_s, 3), round(wall_s, 3),
                     len(examples), manifest, str(base))
