"""Training tells the console nothing: the trainer's per-step dicts go to the caller's log (the
Dagster step log; MLflow gets the history), and no progress bar is drawn for loading weights,
saving them or TRL's dataset passes. `ratchet demo` printed all of these between its own lines."""
import pytest

from ratchet.training.sft import SFTSettings, train_sft

pytestmark = pytest.mark.training

NOISE = ("{'loss'", "'grad_norm'", "Loading weights", "Writing model shards", "train dataset", "it/s]")


@pytest.fixture
def loud(monkeypatch):
    """The libraries as a fresh process has them (an earlier test may have quieted them): the test
    shows that training quiets them itself."""
    import datasets
    import huggingface_hub.utils as hub
    import transformers.utils.logging as tf_logging

    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY"):
        monkeypatch.delenv(var, raising=False)
    hub.enable_progress_bars()
    datasets.enable_progress_bars()
    tf_logging.enable_progress_bar()
    tf_logging.set_verbosity_warning()


def test_sft_prints_no_log_dicts_and_draws_no_progress_bars(loud, tmp_path, tiny_model, tokenizer, trajectories,
                                                             tools, capfd):
    base = tmp_path / "base"
    tiny_model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    rows = [{**t, "record_id": f"rec-{i:02d}", "consent_id": "C-1", "tools": tools}
            for i, t in enumerate(trajectories[:2])]
    capfd.readouterr()
    steps = []
    res = train_sft(str(base), rows, tmp_path / "sft", SFTSettings(max_steps=2, batch_size=1, threads=1,
                                                                   max_length=640), on_log=steps.append)
    out, err = capfd.readouterr()
    printed = [line for line in (out + err).splitlines() if any(n in line for n in NOISE)]
    assert not printed, printed
    # the numbers are not lost: each logging step reached the caller, as the checkpoint records them
    assert [s["loss"] for s in steps if "loss" in s] == res.losses and [s["step"] for s in steps][:2] == [1, 2]
