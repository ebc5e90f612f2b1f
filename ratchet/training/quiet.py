"""Keep the training libraries off the console: the per-step numbers belong in the Dagster run
log and MLflow (ratchet.training.lineage.log_history), not on the terminal of `ratchet demo`.

What reached the console before: transformers' Trainer prints every log dict (`{'loss': ...,
'grad_norm': ...}`) to stdout when `disable_tqdm=True` (it swaps its progress bar for
`PrinterCallback`, which `print()`s), and transformers and datasets draw tqdm bars on stderr for
loading and saving weights ("Loading weights", "Writing model shards") and for TRL's dataset
passes ("Building labels for train dataset", "Truncating train dataset")."""
from __future__ import annotations

import os
from typing import Callable, Mapping

StepLog = Callable[[Mapping], None]


def quiet_libraries() -> None:
    """transformers: errors only, no progress bars; datasets and huggingface_hub: no progress
    bars. Process-wide and idempotent (every training entry point calls it). The environment
    variables carry it to the processes started from here (the rollout pool's spawned workers
    load the policy too); one the user set is kept."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers.utils.logging as tf_logging

    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()
    except ImportError:  # datasets comes with TRL; guarded for a transformers-only load
        pass
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()


def quiet_trainer(trainer, on_log: StepLog | None = None):
    """Drop the Trainer's console printer; hand each log dict to `on_log` instead (the Dagster
    step's log). The dicts stay in `trainer.state.log_history` either way."""
    from transformers.trainer_callback import PrinterCallback, TrainerCallback

    trainer.remove_callback(PrinterCallback)
    if on_log is not None:
        class _Forward(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and state.is_local_process_zero:
                    on_log({"step": state.global_step, **{k: v for k, v in logs.items() if k != "total_flos"}})

        trainer.add_callback(_Forward())
    return trainer
