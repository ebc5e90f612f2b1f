"""The harness baselines and scripted agents (sandboxes.agents) as policies.

The agents are programs that call the env's tools in a loop. To emit one tool call per
`generate`, the agent program is replayed against the conversation it is given: a stand-in env
serves the observations already in the messages, and the first call the program makes past the
end of the conversation is the completion. That keeps the policy stateless and deterministic per
(agent, seed, task_id): the same conversation always gives the same next call, so a run through
the policy runner reproduces `sandboxes.agents.run_agent` call for call.

    make_policy("harness:sbfl", k=4)        # agent kwargs (the attempt budget k) pass through
    request.metadata = {"task_id": ..., "max_turns": ...}   # the runner fills these in
"""
from __future__ import annotations

import random
import time

from ratchet.policy.base import Completion, GenerationRequest, ToolCall

# policy id name -> the agent's registry name (sandboxes.agents): ids follow eval_contract.md.
ALIASES = {"harness:random": "random", "harness:sbfl": "sbfl", "harness:prior": "prior",
           "scripted:expert": "expert", "scripted:noisy": "noisy"}


class _NextCall(Exception):
    def __init__(self, message: dict):
        self.message = message


class DivergedHistory(ValueError):
    """The conversation holds a call this agent would not have made at that point."""


class _ReplayEnv:
    """Enough of RepairEnv for an agent program: observations come from the conversation."""

    def __init__(self, messages: list[dict], task_id: str, max_turns: int):
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        self.head = [dict(m) for m in messages[:first]]
        self.rest = messages[first:]
        self.bundle = type("B", (), {"task_id": task_id})()
        self.max_turns = max_turns
        self.steps: list = []
        self.done = False
        self.reward, self.sandbox_s, self.patch, self.explanation = None, 0.0, "", ""
        self.transcript: list[dict] = []
        self._pos = 0

    def reset(self) -> list[dict]:
        self.transcript = [dict(m) for m in self.head]
        return self.transcript            # the Session appends its assistant messages to this list

    @property
    def turns(self) -> int:
        return len(self.steps)

    def step(self, tool, arguments=None) -> str:
        wanted = self.transcript[-1]
        while self._pos < len(self.rest) and self.rest[self._pos]["role"] != "assistant":
            self._pos += 1
        if self._pos >= len(self.rest):
            raise _NextCall(wanted)
        had = self.rest[self._pos]
        calls = had.get("tool_calls") or []
        if len(calls) != 1 or calls[0]["function"]["name"] != tool:
            got = [c["function"]["name"] for c in calls]
            raise DivergedHistory(f"turn {self.turns}: the agent calls {tool!r}, the conversation has {got}")
        obs = next((m.get("content") or "" for m in self.rest[self._pos + 1:] if m["role"] == "tool"), None)
        if obs is None:
            raise DivergedHistory(f"turn {self.turns}: no tool result after the call to {tool!r}")
        self._pos += 1
        self.steps.append(tool)
        self.done = tool == "submit" or self.turns >= self.max_turns    # as the real env would be
        return obs

    def finish(self, explanation: str):
        # The program stopped without submitting (it only does so at the turn limit): submit.
        raise _NextCall({"role": "assistant", "content": None, "tool_calls": [{"function": {
            "name": "submit", "arguments": '{"explanation": ""}'}}]})

    def tool_schemas(self) -> list[dict]:
        return []


class HarnessPolicy:
    """A scripted agent or harness baseline behind the Policy interface (no tokens, no weights)."""

    def __init__(self, name: str, policy_id: str | None = None, **agent_kw):
        from sandboxes.agents import _REGISTRY

        self.policy_id = policy_id or f"harness:{name}"
        self.agent = ALIASES.get(self.policy_id, name)
        if self.agent not in _REGISTRY:
            raise ValueError(f"no agent {self.agent!r} for {self.policy_id!r}; registered: {tuple(_REGISTRY)}")
        self._runner = _REGISTRY[self.agent]
        self.agent_kw = agent_kw
        self.spec = {"policy_id": self.policy_id, "engine": "harness",
                     "config": {"agent": self.agent, **agent_kw}}

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        out = []
        for r in requests:
            c = self.next_call(r)
            out.append([c] * r.n)           # deterministic given (seed, conversation)
        return out

    def next_call(self, r: GenerationRequest) -> Completion:
        t0 = time.monotonic()
        task_id = r.metadata.get("task_id")
        if task_id is None:
            raise ValueError("harness policies need request.metadata['task_id'] (their rng is "
                             "seeded per task, as in sandboxes.agents.run_agent)")
        env = _ReplayEnv(r.messages, task_id, int(r.metadata.get("max_turns", 30)))
        seed = r.metadata.get("episode_seed", r.seed)
        rng = random.Random(f"{self.agent}:{seed}:{task_id}")   # the seed run_agent uses
        try:
            self._runner(env, rng, **self.agent_kw)
        except _NextCall as nxt:
            msg = nxt.message
        except AttributeError as e:         # the program ended, reading results we do not have
            raise DivergedHistory(f"the agent has nothing more to do in this conversation ({e})") from None
        else:
            raise DivergedHistory("the agent has nothing more to do in this conversation")
        calls = [ToolCall.from_raw(c["function"]["name"], c["function"]["arguments"])
                 for c in msg.get("tool_calls") or ()]
        return Completion(text=msg.get("content") or "", tool_calls=calls, finish_reason="tool_calls",
                          latency_s=time.monotonic() - t0)
