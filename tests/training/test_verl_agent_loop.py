"""The VeRL AgentLoop: whole episodes of a real RepairEnv driven through VeRL's own AgentLoopBase,
with a scripted server manager in place of vLLM (as VeRL's CPU tests of agent loops do)."""
import json
import math

import pytest

# hydra 1.3's calls into omegaconf 2.4 (the version VeRL's datasets are tested with) warn
pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
              pytest.mark.filterwarnings("ignore:Implicit conversion from Version:FutureWarning")]


@pytest.fixture(scope="module")
def verl_loop():
    """VeRL's agent-loop module (installed by `verl_pkgs`, or the test skips)."""
    from tests.training.verl_pkgs import DATA, LOOP, entered

    with entered(DATA, LOOP, run_init=True):
        import verl.experimental.agent_loop.agent_loop as agent_loop

        import ratchet.training.verl_agent_loop as ours
        yield agent_loop, ours
        ours._CLASS = None        # the class subclasses this VeRL import: not reused after it


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from sandboxes.humaneval import build_suite
    return sorted(build_suite(seed=0, limit=1, per_problem=1, cache_dir=tmp_path_factory.mktemp("suite")).tasks,
                  key=lambda b: b.task_id)


@pytest.fixture(scope="module")
def row(tasks, tmp_path_factory):
    import pyarrow.parquet as pq

    from ratchet.training.verl_data import write_rl_parquet
    d = tmp_path_factory.mktemp("data")
    return pq.read_table(write_rl_parquet(tasks, d / "train.parquet", bundle_dir=d / "bundles")).to_pylist()[0]


class ScriptedServer:
    """VeRL's server-manager interface (`generate` -> TokenOutput) answering with scripted turns;
    records every request so the test can check what the policy was shown."""

    def __init__(self, token_output, turns: list[list[int]]):
        self.TokenOutput, self.turns, self.requests = token_output, list(turns), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        ids = self.turns.pop(0)[: sampling_params["max_tokens"]]
        return self.TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def _turn(tokenizer, name, arguments, *, end=True) -> list[int]:
    from ratchet.policy.embedded.chat import IM_END
    text = f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'
    return tokenizer.encode(text + (IM_END if end else ""), add_special_tokens=False)


def _loop(verl_loop, tokenizer, server, runtime, *, response_length=4096, max_turns=None):
    from omegaconf import OmegaConf

    agent_loop, ours = verl_loop
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 4096, "response_length": response_length,
        "multi_turn": {"max_assistant_turns": max_turns}}}, "data": {}})
    entry = ours.agent_loop_config()[0]
    assert entry["name"] == "ratchet_repair"
    from hydra.utils import instantiate     # the way VeRL's AgentLoopWorker builds a loop from its registry
    return instantiate(entry, trainer_config=agent_loop.DictConfigWrap(cfg), server_manager=server,
                       tokenizer=tokenizer, processor=None, dataset_cls=RLHFDataset,
                       data_config=agent_loop.DictConfigWrap(cfg.data), runtime=runtime)


def _run(loop, row):
    return loop.loop.run_until_complete(      # the event loop VeRL's base bound the executor to
        loop.run({"temperature": 1.0}, raw_prompt=row["prompt"], extra_info=row["extra_info"],
                 tools_kwargs=row["extra_info"]["tools_kwargs"]))


def _env_replay(bundle, runtime, calls):
    """The same calls on a RepairEnv of Ratchet's own: (messages, observations, reward)."""
    from sandboxes.env import RepairEnv
    with RepairEnv(bundle, runtime=runtime) as env:
        messages = env.reset()
        tools = env.tool_schemas()
        obs = [env.step(name, args) for name, args in calls]
        return messages, tools, obs, env.reward


def test_registered_under_the_parquets_agent_name(verl_loop, row):
    agent_loop, ours = verl_loop
    cls = ours.RatchetRepairAgentLoop
    assert issubclass(cls, agent_loop.AgentLoopBase)
    assert agent_loop._agent_loop_registry[row["agent_name"]] == {
        "_target_": "ratchet.training.verl_agent_loop.RatchetRepairAgentLoop"}


def test_a_whole_episode_keeps_sampled_ids_masks_tool_tokens_and_scores_like_ratchet(
        verl_loop, tokenizer, runtime, tasks, row):
    from ratchet.policy.embedded.chat import render
    from verl.workers.rollout.replica import TokenOutput

    b = tasks[0]
    calls = [("apply_patch", {"patch": b.metadata["fix_diff"]}), ("submit", {"explanation": "fixed"})]
    turns = [_turn(tokenizer, n, a) for n, a in calls]
    server = ScriptedServer(TokenOutput, turns)
    out = _run(_loop(verl_loop, tokenizer, server, runtime), row)

    messages, tools, obs, reward = _env_replay(b, runtime, calls)
    prompt = tokenizer.encode(render(messages, tools), add_special_tokens=False)
    assert out.prompt_ids == prompt == server.requests[0]["prompt_ids"]
    # by hand: turn 1 as sampled, then the tool message and the next generation prompt, then turn 2
    tool_text = f"\n<|im_start|>tool\n{obs[0]}<|im_end|>\n<|im_start|>assistant\n"
    tool_ids = tokenizer.encode(tool_text, add_special_tokens=False)
    assert len(obs[0]) < 600        # not clipped by the chat view: the text above is exactly it
    assert out.response_ids == turns[0] + tool_ids + turns[1]
    assert out.response_mask == [1] * len(turns[0]) + [0] * len(tool_ids) + [1] * len(turns[1])
    assert out.response_logprobs == [-0.5] * len(turns[0]) + [0.0] * len(tool_ids) + [-0.5] * len(turns[1])
    # the second request is the first context grown by exactly these ids
    assert server.requests[1]["prompt_ids"] == prompt + turns[0] + tool_ids
    assert server.requests[1]["sampling_params"]["max_tokens"] == 4096 - len(turns[0]) - len(tool_ids)
    assert out.reward_score == pytest.approx(reward.value) and reward.value >= 0.55
    extra = out.extra_fields
    assert extra["infra_failure"] is False and extra["stop_reason"] == "submit" and extra["turns"] == 2
    assert extra["reward_extra_info"]["status"] == reward.status
    assert extra["patch"].strip() and not server.turns


def test_a_wrong_fix_scores_what_ratchet_scores(verl_loop, tokenizer, runtime, tasks, row):
    from verl.workers.rollout.replica import TokenOutput

    from tests.training.test_verl_seam import _wrong_patch

    b = tasks[0]
    calls = [("apply_patch", {"patch": _wrong_patch(b)}), ("submit", {"explanation": "fixed"})]
    out = _run(_loop(verl_loop, tokenizer, ScriptedServer(TokenOutput, [_turn(tokenizer, n, a) for n, a in calls]),
                     runtime), row)
    assert out.reward_score == pytest.approx(_env_replay(b, runtime, calls)[3].value) == 0.0
    assert out.extra_fields["infra_failure"] is False


def test_a_reply_without_a_call_gets_ratchets_notice_masked(verl_loop, tokenizer, runtime, row):
    from ratchet.policy.runner import NO_CALL
    from verl.workers.rollout.replica import TokenOutput

    chatter = tokenizer.encode("I think it is fine.<|im_end|>", add_special_tokens=False)
    server = ScriptedServer(TokenOutput, [chatter, _turn(tokenizer, "submit", {"explanation": "x"})])
    out = _run(_loop(verl_loop, tokenizer, server, runtime), row)
    n = len(chatter)
    notice = out.response_ids[n:out.response_mask.index(1, n)]
    tools = ", ".join(sorted(row["extra_info"]["tools_kwargs"], key=lambda t: t))
    text = tokenizer.decode(notice, skip_special_tokens=False)
    assert text.startswith("\n<|im_start|>user\nerror: your reply contained no tool call")
    assert NO_CALL.split("{")[0] in text and all(t in text for t in tools.split(", "))
    assert out.extra_fields["stop_reason"] == "submit" and out.extra_fields["turns"] == 2


def test_the_turn_limit_and_the_length_limit_end_the_episode_scored(verl_loop, tokenizer, runtime, row):
    from verl.workers.rollout.replica import TokenOutput

    look = _turn(tokenizer, "view_issue", {})
    chatter = tokenizer.encode("Hmm.<|im_end|>", add_special_tokens=False)
    server = ScriptedServer(TokenOutput, [look, chatter, look])   # replies without a call count as turns
    out = _run(_loop(verl_loop, tokenizer, server, runtime, max_turns=2), row)
    assert out.extra_fields["stop_reason"] == "max_turns" and out.extra_fields["turns"] == 2
    assert len(server.turns) == 1 and out.reward_score == 0.0 and not out.extra_fields["infra_failure"]

    # a turn cut by the length budget: no stop token, nothing appended after it, still scored
    cut = _turn(tokenizer, "view_issue", {}, end=False)
    server = ScriptedServer(TokenOutput, [cut + cut])
    out = _run(_loop(verl_loop, tokenizer, server, runtime, response_length=len(cut) + 3), row)
    assert out.response_ids == (cut + cut)[:len(cut) + 3] and out.response_mask == [1] * (len(cut) + 3)
    assert out.extra_fields["stop_reason"] == "length" and out.reward_score == 0.0


def test_an_infra_failure_is_flagged_not_scored_zero(verl_loop, tokenizer, tasks, row, broken_verdict_runtime):
    """The harness's verdict script broken (as in the seam test): NaN and the flag, never 0.0."""
    from verl.workers.rollout.replica import TokenOutput

    rt = broken_verdict_runtime
    calls = [("apply_patch", {"patch": tasks[0].metadata["fix_diff"]}), ("submit", {"explanation": "fixed"})]
    out = _run(_loop(verl_loop, tokenizer, ScriptedServer(TokenOutput, [_turn(tokenizer, n, a) for n, a in calls]),
                     rt), row)
    assert out.extra_fields["infra_failure"] is True and math.isnan(out.reward_score)
    assert out.extra_fields["reward_extra_info"]["status"] == "infra_failure"


def test_a_sandbox_that_cannot_start_is_an_infra_failure(verl_loop, tokenizer, row):
    from verl.workers.rollout.replica import TokenOutput

    class NoSandbox:                   # a runtime whose episodes cannot be created
        def episode(self, bundle):
            raise OSError("bubblewrap: cannot create the namespace")

    server = ScriptedServer(TokenOutput, [])
    out = _run(_loop(verl_loop, tokenizer, server, NoSandbox()), row)
    assert out.extra_fields["infra_failure"] is True and math.isnan(out.reward_score)
    assert "cannot create the namespace" in out.extra_fields["reward_extra_info"]["reason"]
    assert out.response_ids == [] and server.requests == []


def test_a_row_without_a_bundle_is_a_clear_error(verl_loop, tokenizer, runtime, row):
    from verl.workers.rollout.replica import TokenOutput

    loop = _loop(verl_loop, tokenizer, ScriptedServer(TokenOutput, []), runtime)
    bad = dict(row, extra_info={k: v for k, v in row["extra_info"].items() if k != "bundle_path"})
    with pytest.raises(ValueError, match="no extra_info.bundle_path"):
        _run(loop, bad)
