"""Reference agents that act only through the env's tools (no learned weights).

    from sandboxes.agents import run_agent
    run = run_agent("expert", bundle, seed=0)       # -> AgentRun(messages, reward, steps, ...)

Agents: "expert" (scripted expert), "noisy" (seeded weaker agent, gate violations included),
"random" and "sbfl" (harness baselines with an attempt budget `k`).
"""
from __future__ import annotations

import random

from sandboxes.agents.base import AgentRun, Session
from sandboxes.agents.baselines import run_random, run_sbfl
from sandboxes.agents.expert import run_expert
from sandboxes.agents.noisy import run_noisy

AGENTS = ("expert", "noisy", "random", "sbfl")

__all__ = ["AGENTS", "AgentRun", "Session", "run_agent", "run_expert", "run_noisy", "run_random",
           "run_sbfl"]


def run_agent(name: str, bundle, *, seed: int = 0, runtime=None, max_turns: int | None = None,
              **kw) -> AgentRun:
    """One episode of `bundle` with agent `name` in a fresh RepairEnv (closed afterwards)."""
    from sandboxes.env import RepairEnv

    rng = random.Random(f"{name}:{seed}:{bundle.task_id}")
    with RepairEnv(bundle, runtime=runtime, max_turns=max_turns) as env:
        if name == "expert":
            return run_expert(env, **kw)
        if name == "noisy":
            return run_noisy(env, rng, **kw)
        if name == "random":
            return run_random(env, rng, **kw)
        if name == "sbfl":
            return run_sbfl(env, **kw)
        raise ValueError(f"unknown agent {name!r}; one of {AGENTS}")
