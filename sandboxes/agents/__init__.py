"""Reference agents that act only through the env's tools (no learned weights).

    from sandboxes.agents import run_agent
    run = run_agent("expert", bundle, seed=0)       # -> AgentRun(messages, reward, steps, ...)

Agents: "expert" (scripted expert), "noisy" (seeded weaker agent, gate violations included),
"random" and "sbfl" (harness baselines with an attempt budget `k`), "prior" (SBFL + a count prior
over fix kinds fit on train tasks: `prior=fit_prior(train_tasks)`), "structured" (the same logic
through the structured tools only, logged as the production agent agent@v7-structured), "lm"
(SBFL + the candidate edits ranked by a language model's likelihood: `scorer=LMScorer(base)`).
"""
from __future__ import annotations

import random

from sandboxes.agents.base import AgentRun, Session
from sandboxes.agents.baselines import run_random, run_sbfl
from sandboxes.agents.expert import run_expert
from sandboxes.agents.lm import run_lm
from sandboxes.agents.shell import run_shell
from sandboxes.agents.noisy import run_noisy
from sandboxes.agents.prior import Prior, fit_prior, run_prior

# One registry: name -> runner(env, rng, **kw). Add an agent with `register_agent`.
_REGISTRY: dict = {}


def register_agent(name: str, runner) -> None:
    """Make `run_agent(name, ...)` call `runner(env, rng, **kw)` (env: a reset-able RepairEnv)."""
    if name in _REGISTRY:
        raise ValueError(f"agent {name!r} is already registered")
    _REGISTRY[name] = runner


register_agent("expert", lambda env, rng, **kw: run_expert(env, **kw))
register_agent("noisy", run_noisy)
register_agent("random", run_random)
register_agent("sbfl", lambda env, rng, **kw: run_sbfl(env, **kw))
AGENTS = tuple(_REGISTRY)          # the landed reference agents, in a stable order
# prior-based agents (need prior=...): the no-weights bar for learned policies, and its
# structured-tools variant that the demo's production logs carry
register_agent("prior", run_prior)
register_agent("structured", lambda env, rng, **kw: run_prior(env, rng, structured=True, **kw))
# the base model's likelihood ranks the candidate edits (needs scorer=: ratchet.policy.lm_score):
# the no-weights bar for policies trained from that base
register_agent("lm", run_lm)
# the prior harness's choices through bash and str_replace_editor (the tools real agents use)
register_agent("shell", run_shell)

__all__ = ["AGENTS", "AgentRun", "Prior", "Session", "fit_prior", "register_agent", "run_agent",
           "run_expert", "run_lm", "run_noisy", "run_prior", "run_random", "run_sbfl"]


def run_agent(name: str, bundle, *, seed: int = 0, runtime=None, max_turns: int | None = None,
              **kw) -> AgentRun:
    """One episode of `bundle` with agent `name` in a fresh RepairEnv (closed afterwards)."""
    from sandboxes.env import RepairEnv

    runner = _REGISTRY.get(name)
    if runner is None:
        raise ValueError(f"unknown agent {name!r}; one of {tuple(_REGISTRY)}")
    rng = random.Random(f"{name}:{seed}:{bundle.task_id}")
    with RepairEnv(bundle, runtime=runtime, max_turns=max_turns) as env:
        return runner(env, rng, **kw)
