"""SFT warm start with TRL's SFTTrainer on one tenant's governed training rows, loss on the
policy's own tokens only.

    rows = tenant_training_rows(con, "acme")          # ratchet.training.data
    res = train_sft(base_path, rows, out_dir, SFTSettings(epochs=3))
    res.checkpoint, res.losses, res.cpu_s, res.manifest

Examples come from the seam (`ratchet.training.examples.to_training_example`): input_ids plus
`assistant_masks`, which TRL folds into labels = -100 (tool outputs, prompts and masked invalid
calls carry no loss). The dataset is pre-tokenised, so TRL's own `assistant_only_loss` switch
(which re-renders messages through a chat template) stays off; the mask is the same one, built
once (tests/training/test_examples.py checks it against `apply_chat_template`).

Placement (`device`, ratchet.training.device): a GPU with bf16 when one is present, else the CPU
with float32 and gradient checkpointing off (~10x slower on CPU otherwise) and an explicit torch
thread count.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

CHECKPOINT_META = "ratchet_checkpoint.json"


@dataclass(frozen=True)
class SFTSettings:
    epochs: float = 3.0
    max_steps: int = -1                 # > 0 overrides epochs
    learning_rate: float = 2e-3         # a ~1M-parameter model from scratch takes a large step size
    batch_size: int = 4
    grad_accum: int = 1
    max_length: int = 4096
    warmup_steps: int = 2
    weight_decay: float = 0.0
    seed: int = 0
    threads: int = 1                     # see docs/training.md: 1 beat 2 by 2-3x per CPU-second here
    logging_steps: int = 1
    save_steps: int = 0                 # 0 = only the final save
    thoughts: bool = True               # train on the text before each call (False: calls only)
    # "auto": a peft LoRA adapter when the model has > 50M parameters (a large local base_policy),
    # full fine-tuning otherwise (the embedded model); "on" / "off" force it. The saved checkpoint
    # has the adapter merged in either way (model.merged): the next stage loads plain weights.
    lora: str = "auto"
    device: str = "auto"                # "auto": CUDA + bf16 when a GPU is present; "cpu"; "cuda"
    overrides: dict = field(default_factory=dict)   # passed to trl.SFTConfig as is

    def __post_init__(self):
        if self.learning_rate <= 0 or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("learning_rate must be > 0, batch_size and grad_accum >= 1")
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ValueError("set epochs > 0 or max_steps > 0")
        if self.threads < 1:
            raise ValueError("threads must be >= 1 (torch.set_num_threads)")
        from ratchet.policy.embedded.model import LORA_MODES
        if self.lora not in LORA_MODES:
            raise ValueError(f"lora must be one of {LORA_MODES}")
        from ratchet.training.device import DEVICES
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}")
        clash = {"output_dir", "assistant_only_loss", "bf16", "use_cpu"} & set(self.overrides)
        if clash:
            raise ValueError(f"overrides may not set {sorted(clash)}: SFTSettings owns them")


@dataclass
class SFTResult:
    checkpoint: Path
    losses: list[float]                 # training loss per logging step
    steps: int
    cpu_s: float                        # process CPU seconds of the training loop (what economics prices)
    wall_s: float
    n_examples: int
    n_tokens: int
    n_loss_tokens: int
    manifest: dict                      # ratchet.training.data.data_manifest of the rows used
    parent: str


def micro_batched(settings: SFTSettings, large: bool) -> SFTSettings:
    """A large model (the LoRA path) on the CPU steps one example at a time and accumulates the
    batch: the same update (transformers normalises an accumulated loss by the batch's label
    tokens), but no padded batch, whose activations and attention mask grew with the longest row.
    Measured on SmolLM2-135M: 4 x 1500 tokens in one forward peaked at 23.3 GB and got a 24 GB
    machine's trainer OOM-killed; 1 x 1500 peaked at 6.4 GB."""
    from dataclasses import replace

    from ratchet.training.device import resolve_device

    if not large or settings.batch_size == 1 or resolve_device(settings.device) != "cpu":
        return settings
    return replace(settings, batch_size=1, grad_accum=settings.batch_size * settings.grad_accum)


def build_dataset(rows: Sequence[Mapping], tokenizer, *, max_length: int | None = None, **prepare_kw):
    """(datasets.Dataset of input_ids + assistant_masks, the record ids that gave at least one
    example). A trajectory longer than `max_length` gives several (`training_windows`)."""
    from datasets import Dataset

    from ratchet.training.examples import to_training_example, training_windows

    examples, ids = [], []
    for r in rows:
        if max_length is None:
            exs = [to_training_example(r["messages"], r.get("tools"), tokenizer, **prepare_kw)]
        else:                                 # longer than the context: windows of whole turns
            exs = training_windows(r["messages"], r.get("tools"), tokenizer, max_length=max_length, **prepare_kw)
        exs = [ex for ex in exs if any(ex["assistant_masks"])]   # no trainable turn teaches nothing
        if exs:
            examples += exs
            ids.append(r["record_id"])
    if not examples:
        raise ValueError("no training example has a trainable assistant turn")
    return Dataset.from_list(examples), ids


def make_trainer(model, tokenizer, dataset, out_dir: str | Path, settings: SFTSettings = SFTSettings(),
                 on_log=None):
    """A TRL SFTTrainer on a pre-tokenised dataset with CPU-sane settings (see module doc); its log
    dicts go to `on_log` (a step's loss, grad norm, ...), never to the console (ratchet.training.quiet)."""
    import torch
    from trl import SFTConfig, SFTTrainer

    from ratchet.training.device import trainer_device_args
    from ratchet.training.quiet import quiet_libraries, quiet_trainer

    quiet_libraries()
    torch.set_num_threads(settings.threads)
    cfg = SFTConfig(
        output_dir=str(out_dir), num_train_epochs=settings.epochs, max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size, gradient_accumulation_steps=settings.grad_accum,
        learning_rate=settings.learning_rate, warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay, lr_scheduler_type="cosine", logging_steps=settings.logging_steps,
        save_strategy="steps" if settings.save_steps else "no", save_steps=settings.save_steps or 500,
        seed=settings.seed, data_seed=settings.seed, max_length=settings.max_length,
        **trainer_device_args(settings.device), gradient_checkpointing=False, report_to=[],
        disable_tqdm=True, dataloader_num_workers=0, assistant_only_loss=False, packing=False,
        **settings.overrides)
    return quiet_trainer(SFTTrainer(model=model, args=cfg, train_dataset=dataset, processing_class=tokenizer), on_log)


def train_sft(base: str | Path, rows: Sequence[Mapping], out_dir: str | Path,
              settings: SFTSettings = SFTSettings(), *, tokenizer=None, model=None, view: dict | None = None,
              on_log=None) -> SFTResult:
    """Fine-tune the checkpoint at `base` on `rows` (one tenant's `tenant_training_rows`) and save
    the result to `out_dir` with `ratchet_checkpoint.json` (parent, data manifest, settings,
    losses, CPU seconds). `model`/`tokenizer` skip loading `base` (tests pass in-memory ones).
    `view`: the observation view to render with (`chat.make_view`; save it with the checkpoint).
    `on_log`: gets each logging step's dict (the Dagster step log); nothing is printed."""
    from ratchet.policy.embedded.model import load_policy, maybe_lora, merged
    from ratchet.training.data import data_manifest
    from ratchet.training.quiet import quiet_libraries

    quiet_libraries()          # before the load: its "Loading weights" bar

    if model is None or tokenizer is None:
        model, tokenizer = load_policy(base)
    model, lora = maybe_lora(model, settings.lora, seed=settings.seed)
    settings = micro_batched(settings, lora)
    dataset, used = build_dataset(rows, tokenizer, max_length=settings.max_length, thoughts=settings.thoughts,
                                  **({"view": view} if view else {}))
    by_id = {r["record_id"]: r for r in rows}
    manifest = data_manifest([by_id[i] for i in used])
    out = Path(out_dir)
    trainer = make_trainer(model, tokenizer, dataset, out / "trainer", settings, on_log=on_log)
    c0, t0 = time.process_time(), time.monotonic()
    trainer.train()
    cpu_s, wall_s = time.process_time() - c0, time.monotonic() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if lora:
        merged(trainer.model).save_pretrained(str(out))
    else:
        trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    n_tokens = sum(len(x) for x in dataset["input_ids"])
    n_loss = sum(sum(m) for m in dataset["assistant_masks"])
    res = SFTResult(checkpoint=out, losses=losses, steps=trainer.state.global_step, cpu_s=round(cpu_s, 3),
                    wall_s=round(wall_s, 3), n_examples=len(used), n_tokens=n_tokens, n_loss_tokens=n_loss,
                    manifest=manifest, parent=str(base))
    (out / CHECKPOINT_META).write_text(json.dumps({
        "stage": "sft", "parent": str(base), "settings": asdict(settings), "lora": lora, "losses": losses,
        "view": view, "steps": res.steps, "cpu_s": res.cpu_s, "wall_s": res.wall_s, "n_examples": res.n_examples,
        "n_tokens": n_tokens, "n_loss_tokens": n_loss, **manifest}, indent=1))
    return res
