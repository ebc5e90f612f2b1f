"""The integrator's one call: SFT then RL under the structured action mask, on a tiny model in the
real sandbox; the checkpoints resolve through make_policy with the mask they were trained under;
GRPO's choice-only mask drops the tokens the grammar forced."""
import json

import pytest

pytestmark = pytest.mark.training


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    from sandboxes.runtime import LocalRuntime, SandboxUnavailable

    try:
        return LocalRuntime(tmp_path_factory.mktemp("rt"))
    except SandboxUnavailable as e:
        pytest.skip(f"sandbox unavailable: {e}")


def test_choice_mask_leaves_out_forced_tokens():
    from ratchet.policy.runner import Turn, training_sequence

    t0 = Turn(0, "", [], ["obs"], "stop", prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6], logprobs=[-1.0] * 3,
              forced=[False, True, True])
    t1 = Turn(1, "", [], [], "stop", prompt_ids=[1, 2, 3, 4, 5, 6, 7, 8], completion_ids=[9, 10],
              logprobs=[-1.0] * 2, forced=[True, False])
    s = training_sequence([t0, t1])
    assert s["env_mask"] == [1, 1, 1, 0, 0, 1, 1]
    assert s["choice_mask"] == [1, 0, 0, 0, 0, 0, 1]


def test_train_candidate_sft_then_rl_under_the_mask(tmp_path, tiny_model, tokenizer, trajectories, runtime):
    from ratchet.policy import make_policy
    from ratchet.training.recipe import RecipeSettings, structured_rows, train_candidate
    from sandboxes.humaneval import build_suite

    base = tmp_path / "base"
    tiny_model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    rows = [{"record_id": t["trajectory_id"], "task_id": t["task_id"], "consent_id": None,
             "messages": t["messages"], "tools": t["tools"] if "tools" in t else None}
            for t in trajectories if t["accepted"]]
    assert structured_rows(rows) == []               # the fixture's expert uses read_file etc.
    bundles = build_suite(seed=0, limit=1, per_problem=2, cache_dir=tmp_path / "suite").tasks[:1]
    s = RecipeSettings(sft_epochs=1.0, sft_batch=2, rl_steps=1, rl_tasks_per_step=1, rl_group_size=2,
                       max_turns=3, max_tokens=48)
    res = train_candidate(base, rows, tmp_path / "cand", s, bundles=bundles, runtime=runtime)
    assert res.sft.steps >= 1 and res.rl.history[0]["step"] == 1
    assert res.rl.history[0]["infra_failures"] == 0
    for stage in ("sft", "rl"):
        assert (tmp_path / "cand" / f"{stage}_curve.png").stat().st_size > 1000
    assert res.cpu_s["total"] == pytest.approx(res.cpu_s["sft"] + res.cpu_s["rl"], abs=1e-3) and res.cpu_s["sft"] > 0
    for ckpt in (res.sft.checkpoint, res.rl.checkpoint):
        pol = make_policy("embedded:cand", path=str(ckpt))
        assert pol.action_mask == "structured" and pol.grammar["bounds"].thought_chars == 0
    meta = json.loads((res.rl.checkpoint / "ratchet_checkpoint.json").read_text())
    assert meta["settings"]["action_mask"] == "structured" and meta["settings"]["choice_only"] is True
