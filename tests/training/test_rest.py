"""ReST-EM (`ratchet.training.rest`): which sampled episodes it trains on, and one real round from a
tiny checkpoint through the sandbox and SFT."""
import json
from types import SimpleNamespace

import pytest

from ratchet.training.rest import RestSettings, as_rows, select_passes, train_rest

pytestmark = pytest.mark.training


def _rec(task, seed, *, passed=True, outcome=None, turns=3):
    return SimpleNamespace(task_id=task, seed=seed, passed=passed, turns=turns,
                           outcome=outcome or ("pass" if passed else "fail"),
                           messages=[{"role": "user", "content": f"{task}/{seed}"}], tools=[{"name": "t"}])


def test_select_keeps_the_shortest_passes_and_never_a_fail_or_an_infra_failure():
    recs = [_rec("b", 1, turns=5), _rec("b", 2, turns=2), _rec("b", 3, turns=2),  # tie at 2 turns: lower seed
            _rec("a", 7, turns=4),
            _rec("c", 1, passed=False, turns=1),                                  # a fail is never kept
            _rec("d", 1, passed=True, outcome="infra_failure", turns=1)]          # nor an infra failure
    assert [(r.task_id, r.seed) for r in select_passes(recs)] == [("a", 7), ("b", 2)]
    assert [(r.task_id, r.seed) for r in select_passes(recs, keep=2)] == [("a", 7), ("b", 2), ("b", 3)]
    rows = as_rows(select_passes(recs))
    assert [r["record_id"] for r in rows] == ["rest-a-7", "rest-b-2"]
    assert rows[1]["messages"] == [{"role": "user", "content": "b/2"}] and rows[1]["tools"] == [{"name": "t"}]
    assert all(r["consent_id"] is None for r in rows)


def test_settings_refuse_greedy_sampling_and_empty_groups():
    with pytest.raises(ValueError, match="temperature"):
        RestSettings(temperature=0)
    with pytest.raises(ValueError, match="samples"):
        RestSettings(samples=0)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    from sandboxes.humaneval import build_suite

    return build_suite(seed=0, limit=2, per_problem=1, cache_dir=tmp_path_factory.mktemp("suite")).tasks


def test_one_round_samples_in_the_sandbox_and_trains_a_checkpoint(tmp_path, tiny_model, tokenizer, trajectories,
                                                                  tools, bundles, runtime):
    import torch
    from safetensors.torch import load_file

    from ratchet.policy.embedded.decoding import read_decoding, write_decoding

    start = tmp_path / "start"
    tiny_model.save_pretrained(start)
    tokenizer.save_pretrained(start)
    (start / "ratchet_checkpoint.json").write_text(json.dumps({"stage": "sft"}))
    write_decoding(start, action_mask=None, bounds=None, view=None)
    demos = [{**t, "record_id": f"demo-{i}", "consent_id": "C-1", "tools": tools} for i, t in enumerate(trajectories[:2])]
    # 2 demos x 2 epochs at batch 1: 4 optimizer steps, past SFT's 2 warm-up steps (lr 0 at the first)
    settings = RestSettings(samples=2, epochs=2, learning_rate=1e-2, batch_size=1, max_turns=1, max_tokens=12,
                            concurrency=4, rollout_workers=1)
    res = train_rest(start, bundles, tmp_path / "rl", settings, demos=demos, runtime=runtime)

    assert res.sampled == 2 * len(bundles) and res.infra == 0
    assert res.kept == res.tasks_with_pass <= res.passed      # one pass a task at most
    meta = json.loads((tmp_path / "rl" / "ratchet_checkpoint.json").read_text())
    assert meta["stage"] == "rl" and meta["method"] == "rest" and meta["parent"] == str(start)
    assert meta["sampled"] == res.sampled and len(meta["kept_ids"]) == res.kept
    assert meta["cpu_s"] >= meta["sample_cpu_s"] > 0
    assert read_decoding(tmp_path / "rl") == read_decoding(start)
    before, after = load_file(start / "model.safetensors"), load_file(tmp_path / "rl" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)   # the likelihood step moved the weights


def test_nothing_to_train_on_is_a_clear_error(tmp_path, tiny_model, tokenizer, bundles, runtime):
    start = tmp_path / "start"
    tiny_model.save_pretrained(start)
    tokenizer.save_pretrained(start)
    (start / "ratchet_checkpoint.json").write_text(json.dumps({"stage": "sft"}))
    # an untrained tiny model in one turn never passes a repair task
    with pytest.raises(ValueError, match="nothing to train on"):
        train_rest(start, bundles[:1], tmp_path / "rl",
                   RestSettings(samples=1, max_turns=1, max_tokens=8, concurrency=2, rollout_workers=1),
                   runtime=runtime)
