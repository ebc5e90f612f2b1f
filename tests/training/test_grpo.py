"""GRPO pieces, checked by hand on a small group: advantages, env masks, the token loss."""
import math

import pytest

from ratchet.training.grpo import assemble_episode, group_advantages, observation_ids, token_loss

pytestmark = pytest.mark.training


def test_group_advantages_by_hand_with_an_infra_failure():
    rewards = [1.0, 0.0, 0.5, None,          # task A: one infra failure, left out of mean and std
               0.9, 0.9, 0.9, 0.9,           # task B: no signal
               None, None, 1.0, None]        # task C: one scored rollout, no signal
    adv, counts = group_advantages(rewards, 4)
    # A: mean 0.5, sample std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    assert adv[:3] == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, 0.0]) and adv[3] is None
    assert adv[4:8] == [0.0] * 4
    assert adv[8:] == [None, None, 0.0, None]
    assert counts == {"rollouts": 12, "infra_failures": 4, "groups": 3, "flat_groups": 2}
    unscaled, _ = group_advantages([1.0, 0.0, 0.5, None], 4, scale=False)
    assert unscaled[:3] == pytest.approx([0.5, -0.5, 0.0])
    with pytest.raises(ValueError):
        group_advantages([1.0, 0.0, 0.5], 2)


def test_episode_from_sampled_ids_equals_the_training_example(tokenizer, trajectories, tools):
    """Built turn by turn as a rollout would (sampled ids + tool tokens), the episode is exactly the
    seam's example of the finished trajectory, and env_mask is its assistant mask."""
    from ratchet.policy.embedded.chat import render_spans
    from ratchet.training.examples import to_training_example

    msgs = next(t for t in trajectories if t["agent_id"].startswith("expert"))["messages"]
    text, spans = render_spans(msgs, tools)
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]
    turns = []
    asst = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    for n, k in enumerate(asst):
        ids = enc(text[spans[n][0]:spans[n][1]])
        nxt = asst[n + 1] if n + 1 < len(asst) else len(msgs)
        tool_msgs = msgs[k + 1:nxt]
        obs = observation_ids(tool_msgs, tools, tokenizer, next_turn=n + 1 < len(asst)) if tool_msgs else []
        turns.append({"completion_ids": ids, "logprobs": [-0.5] * len(ids), "observation_ids": obs})
    ex = to_training_example(msgs, tools, tokenizer)
    p = ex["assistant_masks"].index(1)
    ep = assemble_episode(ex["input_ids"][:p], turns)
    assert ep["prompt_ids"] + ep["completion_ids"] == ex["input_ids"]
    assert ep["env_mask"] == ex["assistant_masks"][p:]
    assert all(lp == 0.0 for lp, m in zip(ep["logprobs"], ep["env_mask"]) if not m)
    assert 0 in ep["env_mask"] and sum(ep["env_mask"]) == sum(ex["assistant_masks"])


def test_token_loss_by_hand_and_no_gradient_on_tool_tokens():
    import torch

    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    old = torch.log(torch.tensor([[0.5, 0.2, 0.4], [0.3, 0.6, 0.9]]))
    new = old.clone().requires_grad_(True)
    adv = torch.tensor([2.0, 0.5])
    loss, stats = token_loss(new, old, old.clone(), adv, mask, beta=0.04)
    # ratio 1, KL 0: loss = -(2 + 2 + 0.5 + 0.5) / 4 policy tokens
    assert float(loss.detach()) == pytest.approx(-1.25)
    assert stats["kl"] == pytest.approx(0.0) and stats["clip_fraction"] == 0.0
    loss.backward()
    assert new.grad[0, 1] == 0 and new.grad[1, 2] == 0              # tool-output tokens: no gradient
    assert float(new.grad[0, 0]) == pytest.approx(-2.0 / 4) and float(new.grad[1, 1]) == pytest.approx(-0.5 / 4)
    # Clipping: ratio 1.5 on a positive-advantage token counts as 1.2 and gets no gradient.
    new2 = old.clone()
    new2[0, 0] += math.log(1.5)
    new2.requires_grad_(True)
    loss2, stats2 = token_loss(new2, old, new2.detach().clone(), adv, mask, beta=0.0)
    assert float(loss2.detach()) == pytest.approx(-(2 * 1.2 + 2 + 0.5 + 0.5) / 4)
    assert stats2["clip_fraction"] == pytest.approx(0.25)
    loss2.backward()
    assert new2.grad[0, 0] == 0
    # KL to the reference is positive when the policy moved away from it.
    _, stats3 = token_loss(new2.detach(), old, old, adv, mask)
    assert stats3["kl"] == pytest.approx((1 / 1.5 + math.log(1.5) - 1) / 4)    # k3 at the one moved token
