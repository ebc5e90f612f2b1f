"""VeRL (0.9) AgentLoop that drives one stateful Ratchet sandbox per trajectory.

VeRL's built-in tool loop creates a tool instance per call, so it cannot hold a worktree across
turns; this loop opens one `RepairEnv` (from `extra_info.bundle_path`, written by
`ratchet.training.verl_data.write_rl_parquet`) and keeps it for the whole trajectory:

    prompt  = the chat template over [system, user] with the allowlisted tools
    loop:   generate (VeRL's server manager) -> parse the tool calls (Ratchet's chat format)
            -> step the env -> append the observation tokens (response_mask 0)
    stop:   submit (the env is done), the turn limit, or the response length
    reward: the env's composed reward (`sandboxes.verifiers`), as `reward_score`

The token ids are those the embedded/pretrained engine builds (`TransformersPolicy.prompt_ids`):
the sampled ids are kept exactly (mask 1) and only the text the template adds after the sampled
stop token is tokenized (mask 0), so a turn's context is what the policy saw when it sampled.

VeRL loads it through `actor_rollout_ref.rollout.agent.agent_loop_config_path` (the launcher
writes that file, `ratchet.training.verl_launch`); the rows' `agent_name` selects it. The class is
built on first access, so importing this module needs no VeRL (only using the class does).

An infrastructure failure (sandbox or harness, never the agent's code) gives `reward_score` NaN
and `extra_fields["infra_failure"] = True`: VeRL has no "unscored" value, and a 0.0 would teach
the policy the harness's fault (the same rule as `verl_data.compute_score`).
"""
from __future__ import annotations

import math
from typing import Any

from ratchet.training.verl_data import AGENT_NAME, reward_to_score

CLASS_NAME = "RatchetRepairAgentLoop"


def agent_loop_config() -> list[dict]:
    """The `agent_loop_config_path` file's content: VeRL instantiates `_target_` by name."""
    return [{"name": AGENT_NAME, "_target_": f"{__name__}.{CLASS_NAME}"}]


def observation_delta(messages: list[dict], tools: list[dict], view: dict | None = None) -> str:
    """The text the chat template adds after the last assistant turn's stop token, up to the next
    generation prompt (the tool results, or the no-call notice). Same cut as the embedded engine's
    `prompt_ids`: the assistant turn re-rendered from its parse may differ from what was sampled,
    so only what follows its `<|im_end|>` is taken."""
    from ratchet.policy.embedded.chat import IM_END, render

    kw = {"view": view} if view else {}
    last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    full = render(messages, tools, add_generation_prompt=True, **kw)
    head = render(messages[:last + 1], tools, add_generation_prompt=False, **kw)
    at = head.rfind(IM_END)
    if at < 0 or not full.startswith(head[:at + len(IM_END)]):
        raise ValueError("the chat template does not extend the conversation as a prefix: cannot "
                         "append observation tokens to the sampled ones")
    return full[at + len(IM_END):]


def step_turn(env, messages: list[dict], text: str, tools: list[dict], max_turns: int, turn: int) -> list[str]:
    """One assistant turn against the env, as `ratchet.policy.runner.Episode` plays it: every
    parsed call in order (until the episode ends), a notice when the reply holds none, and the
    turn budget (replies without calls count). Appends to `messages`; returns the observations."""
    from ratchet.policy.embedded.chat import parse_turn
    from ratchet.policy.runner import NO_CALL

    msg = parse_turn(text)
    calls = msg["tool_calls"]
    for i, c in enumerate(calls):
        c["id"] = f"call_{len(env.steps) + i:02d}"
    messages.append({"role": "assistant", "content": msg["content"], **({"tool_calls": calls} if calls else {})})
    obs = []
    for c in calls:
        if env.done:
            break
        o = env.step(c["function"]["name"], c["function"]["arguments"])
        obs.append(o)
        messages.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": o})
    if not calls:
        o = NO_CALL.format(tools=", ".join(t["function"]["name"] for t in tools))
        obs.append(o)
        messages.append({"role": "user", "content": o})
    if not env.done and turn + 1 >= max_turns:
        env.finish("")
    return obs


def _build_class():
    from uuid import uuid4

    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

    class RatchetRepairAgentLoop(AgentLoopBase):
        """One RepairEnv per trajectory (module doc). `runtime`: the sandbox runtime (default:
        the process's shared LocalRuntime); `max_turns`: defaults to
        `rollout.multi_turn.max_assistant_turns`, else the task's own limit."""

        def __init__(self, *args, runtime=None, judge=None, weights=None, view: dict | None = None,
                     tools=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.runtime, self.judge, self.weights, self.view = runtime, judge, weights, view
            self.response_length = int(self.rollout_config.response_length)
            self.max_assistant_turns = self.rollout_config.multi_turn.get("max_assistant_turns") or None

        async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
            from sandboxes.bundle import TaskBundle
            from sandboxes.env import RepairEnv

            info = dict(kwargs.get("extra_info") or {})
            path = info.get("bundle_path")
            if not path:
                raise ValueError(f"row {info.get('index')!r} has no extra_info.bundle_path: write the data "
                                 "with ratchet.training.verl_data.write_rl_parquet")
            bundle = TaskBundle.load(path)
            env = RepairEnv(bundle, runtime=self.runtime, judge=self.judge, weights=self.weights,
                            max_turns=self.max_assistant_turns)
            try:
                return await self._episode(env, sampling_params, kwargs)
            finally:
                await self.loop.run_in_executor(None, env.close)

        async def _episode(self, env, sampling_params, kwargs) -> AgentLoopOutput:
            import time

            from ratchet.policy.embedded.chat import render
            from sandboxes.env import InfraError

            run = self.loop.run_in_executor     # sandbox calls block: other trajectories keep generating
            view = {"view": self.view} if self.view else {}
            metrics = {"generate_sequences": 0.0, "tool_calls": 0.0}
            ids: list[int] = []
            mask: list[int] = []
            logprobs: list[float] = []
            have_logprobs = True
            turns, stop, error, prompt_ids = 0, "length", None, []
            try:
                messages = await run(None, env.reset)
            except Exception as e:  # noqa: BLE001 - a sandbox that cannot start is the harness's fault
                messages, error = None, f"env reset failed: {type(e).__name__}: {e}"
            try:
                if messages is None:
                    raise InfraError(error)
                tools = env.tool_schemas()
                prompt_ids = self.tokenizer.encode(render(messages, tools, add_generation_prompt=True, **view),
                                                   add_special_tokens=False)
                request_id = uuid4().hex
                eos = set(_eos_ids(self.tokenizer))
                while len(ids) < self.response_length:
                    t0 = time.monotonic()
                    out = await self.server_manager.generate(
                        request_id=request_id, prompt_ids=prompt_ids + ids,
                        sampling_params={**sampling_params, "max_tokens": self.response_length - len(ids)})
                    metrics["generate_sequences"] += time.monotonic() - t0
                    sampled = list(out.token_ids)
                    ids += sampled
                    mask += [1] * len(sampled)
                    if out.log_probs and len(out.log_probs) == len(sampled):
                        logprobs += list(out.log_probs)
                    else:
                        have_logprobs = False
                    text = self.tokenizer.decode(sampled, skip_special_tokens=False)
                    t0 = time.monotonic()
                    await run(None, step_turn, env, messages, text, tools, env.max_turns, turns)
                    metrics["tool_calls"] += time.monotonic() - t0
                    turns += 1
                    if env.done:
                        last = env.steps[-1] if env.steps else None
                        stop = ("submit" if last is not None and last.tool == "submit" and not last.error
                                else "max_turns" if turns >= env.max_turns or env.turns >= env.max_turns
                                else "env")     # the env ended it (the disk quota)
                        break
                    if not sampled or sampled[-1] not in eos:
                        break                       # cut by the length limit mid-turn
                    delta = self.tokenizer.encode(observation_delta(messages, tools, self.view),
                                                  add_special_tokens=False)
                    ids += delta
                    mask += [0] * len(delta)
                    logprobs += [0.0] * len(delta)
                if not env.done:
                    await run(None, env.finish, "")   # scored as it stands, like the turn limit
            except InfraError as e:
                error = error or f"{type(e).__name__}: {e}"
            n = self.response_length
            reward = env.reward
            infra = error is not None or reward is None or bool(reward.infra_failure)
            if reward is not None:
                score = reward_to_score(reward)
            else:
                score = {"score": math.nan, "infra_failure": True, "status": "infra_failure", "reason": error}
            extra = {"infra_failure": infra, "stop_reason": stop, "turns": turns, "patch": env.patch,
                     "task_id": env.bundle.task_id, "reward_extra_info": score,
                     "turn_scores": [], "tool_rewards": []}
            return AgentLoopOutput(
                prompt_ids=self._cap_text_prompt_length(prompt_ids),
                response_ids=ids[:n], response_mask=mask[:n],
                response_logprobs=logprobs[:n] if have_logprobs and ids else None,
                reward_score=math.nan if infra else float(reward.value),
                num_turns=2 * turns + 1, metrics=AgentLoopMetrics(**metrics), extra_fields=extra)

    RatchetRepairAgentLoop.__module__ = __name__
    RatchetRepairAgentLoop.__qualname__ = CLASS_NAME
    return register(AGENT_NAME)(RatchetRepairAgentLoop)


def _eos_ids(tokenizer) -> list[int]:
    from ratchet.policy.embedded.chat import IM_END
    ids = {tokenizer.convert_tokens_to_ids(IM_END)}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return [i for i in ids if i is not None and i >= 0]


_CLASS = None


def __getattr__(name: str):
    # built on first access so the module imports without VeRL; VeRL's hydra `_target_` lookup
    # and `from ... import RatchetRepairAgentLoop` both go through here
    global _CLASS
    if name == CLASS_NAME:
        if _CLASS is None:
            _CLASS = _build_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
