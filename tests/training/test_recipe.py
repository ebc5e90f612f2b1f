"""The integrator's one call: SFT then RL under the structured action mask, on a tiny model in the
real sandbox; the checkpoints resolve through make_policy with the mask they were trained under;
GRPO's choice-only mask drops the tokens the grammar forced."""
import json

import pytest

pytestmark = pytest.mark.training


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
    from sandboxes.agents import fit_prior
    prior = fit_prior(bundles)           # the caller's train-split tasks: the view's prior
    assert prior.counts
    res = train_candidate(base, rows, tmp_path / "cand", s, bundles=bundles, runtime=runtime, prior=prior)
    assert res.sft.steps >= 1 and res.rl.history[0]["step"] == 1
    assert res.rl.history[0]["infra_failures"] == 0
    for stage in ("sft", "rl"):
        assert (tmp_path / "cand" / f"{stage}_curve.png").stat().st_size > 1000
    assert res.cpu_s["total"] == pytest.approx(res.cpu_s["sft"] + res.cpu_s["rl"], abs=1e-3) and res.cpu_s["sft"] > 0
    for ckpt in (res.sft.checkpoint, res.rl.checkpoint):
        pol = make_policy("embedded:cand", path=str(ckpt))
        assert pol.action_mask == "structured" and pol.grammar["bounds"].thought_chars == 0
        # SFT trained and RL sampled under the view; both save it, and the resolver reads it back
        assert pol.view == res.sft.view and pol.view["prior"]["counts"] == prior.counts
    meta = json.loads((res.rl.checkpoint / "ratchet_checkpoint.json").read_text())
    assert meta["settings"]["action_mask"] == "structured" and meta["settings"]["choice_only"] is True


def test_an_sft_only_candidate_trains_and_loads(tmp_path, tiny_model, tokenizer, trajectories):
    # rl_steps=0 (SFT only, bench/learning.py --rl-steps 0): it crashed after SFT had trained, on
    # GRPO settings that are not valid with 0 steps
    from ratchet.policy import make_policy
    from ratchet.training.recipe import RecipeSettings, train_candidate

    base = tmp_path / "base"
    tiny_model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    rows = [{"record_id": t["trajectory_id"], "task_id": t["task_id"], "consent_id": None,
             "messages": t["messages"], "tools": t.get("tools")} for t in trajectories if t["accepted"]]
    res = train_candidate(base, rows, tmp_path / "cand", RecipeSettings(sft_epochs=1.0, sft_batch=2, rl_steps=0))
    assert res.rl is None and res.sft.steps >= 1 and res.cpu_s["rl"] == 0
    pol = make_policy("embedded:cand", path=str(res.sft.checkpoint))
    assert pol.action_mask == "structured" and pol.grammar["bounds"] == RecipeSettings().bounds()


def test_masked_logprobs_are_the_trainers(tiny_model, tokenizer, trajectories, tools):
    """With masked_logprobs the sampler's logprob of each token is under the grammar-masked
    distribution, and the trainer recomputes exactly that from the recorded allowed ids."""
    from ratchet.policy.base import GenerationRequest
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from ratchet.policy.grammar import Bounds
    from ratchet.training.grpo_loop import _token_logprobs

    pol = TransformersPolicy(tiny_model, tokenizer, constrained=True, chat="embedded", action_mask="structured",
                             masked_logprobs=True, grammar={"bounds": Bounds(thought_chars=0, max_string=32)},
                             prefix_cache=0)
    t = next(t for t in trajectories if t["agent_id"].startswith("expert"))
    loc = next(i for i, m in enumerate(t["messages"]) if m.get("name") == "localize" and m["role"] == "tool")
    c = pol.generate([GenerationRequest(t["messages"][:loc + 1], tools, n=1, temperature=1.0, seed=3,
                                        max_tokens=200)])[0][0]
    assert c.finish_reason == "stop" and len(c.allowed) == len(c.token_ids)
    choices = [i for i, a in enumerate(c.allowed) if a is not None]
    assert choices and all(c.allowed[i] is None for i, f in enumerate(c.forced) if f)
    assert all(c.logprobs[i] == 0.0 for i, f in enumerate(c.forced) if f)          # prob 1 under the mask
    ids = c.prompt_ids + c.token_ids
    lp, _ = _token_logprobs(tiny_model, ids, 1.0, [None] * len(c.prompt_ids) + c.allowed)
    full, _ = _token_logprobs(tiny_model, ids, 1.0)
    p, lp, full = len(c.prompt_ids), lp.detach(), full.detach()
    for i in choices:
        assert abs(float(lp[p + i]) - c.logprobs[i]) < 1e-4
        assert float(lp[p + i]) > float(full[p + i])          # renormalised over fewer tokens
