"""DPO from preferred vs rejected trajectories of the same task, assistant tokens only."""
import json

import pytest

from ratchet.training.dpo import DPOSettings, _collator, pair_example, preference_pairs, train_dpo

pytestmark = pytest.mark.training


def _rows(trajectories, tools):
    return [{**t, "record_id": f"rec-{i:02d}", "consent_id": "C-1", "tools": tools} for i, t in enumerate(trajectories)]


def test_pairs_are_accepted_vs_not_of_the_same_task(trajectories, tools):
    pairs = preference_pairs(_rows(trajectories, tools))
    assert pairs
    for good, bad in pairs:
        assert good["task_id"] == bad["task_id"] and good["accepted"] and not bad["accepted"]
    tasks_with_both = {t["task_id"] for t in trajectories if t["accepted"]} & \
        {t["task_id"] for t in trajectories if not t["accepted"]}
    assert {g["task_id"] for g, _ in pairs} == tasks_with_both


def test_collator_masks_tool_outputs_out_of_the_preference_loss(trajectories, tools, tokenizer):
    good, bad = preference_pairs(_rows(trajectories, tools))[0]
    ex = pair_example(good, bad, tokenizer)
    batch = _collator(tokenizer.pad_token_id, None)([ex])
    p = len(ex["prompt_ids"])
    chosen_mask = batch["completion_mask"][0].tolist()
    assert chosen_mask[:p] == [0] * p
    assert chosen_mask[p:p + len(ex["chosen_mask"])] == ex["chosen_mask"]
    assert 0 in ex["chosen_mask"] and 1 in ex["chosen_mask"]          # tool outputs inside are masked
    masked_in = tokenizer.decode([t for t, m in zip(batch["input_ids"][0].tolist(), chosen_mask) if m])
    assert "<|im_start|>tool" not in masked_in and "<tool_call>" in masked_in


def test_dpo_step_moves_the_margin(tmp_path, tiny_model, tokenizer, trajectories, tools):
    pairs = preference_pairs(_rows(trajectories, tools))[:2]
    res = train_dpo("in-memory", pairs, tmp_path / "dpo",
                    DPOSettings(max_steps=4, batch_size=1, learning_rate=1e-2, threads=1, max_length=640),
                    model=tiny_model, tokenizer=tokenizer)
    assert res.steps == 4 and res.n_pairs == 2 and len(res.losses) == 4
    assert res.reward_margins[-1] > res.reward_margins[0], res.reward_margins
    assert (tmp_path / "dpo" / "ratchet_checkpoint.json").exists()


def test_dpo_with_lora_moves_the_margin_and_saves_merged_weights(tmp_path, tiny_model, tokenizer, trajectories, tools):
    """lora="on": TRL trains the adapter against the adapter-off reference; the checkpoint is plain weights."""
    from ratchet.policy.embedded.model import load_policy

    pairs = preference_pairs(_rows(trajectories, tools))[:2]
    res = train_dpo("in-memory", pairs, tmp_path / "dpo",
                    DPOSettings(max_steps=4, batch_size=1, learning_rate=2e-2, threads=1, max_length=640, lora="on"),
                    model=tiny_model, tokenizer=tokenizer)
    assert res.reward_margins[-1] > res.reward_margins[0], res.reward_margins
    meta = json.loads((tmp_path / "dpo" / "ratchet_checkpoint.json").read_text())
    assert meta["lora"] is True and not (tmp_path / "dpo" / "adapter_config.json").exists()
    assert not hasattr(load_policy(tmp_path / "dpo")[0], "peft_config")
