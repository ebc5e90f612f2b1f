"""Policies: one interface (base.Policy.generate) over the engines (harness agents, local
transformers, OpenAI-compatible HTTP), and one runner that drives any of them through RepairEnv.
No Dagster, no heavy imports at module level (engines import torch/transformers when made)."""
from ratchet.policy.base import (Completion, GenerationRequest, Policy, PolicyError, ToolCall,
                                 engine_names, format_tool_call, make_policy, parse_tool_calls,
                                 register_engine)
from ratchet.policy.runner import (EpisodeRecord, Sampling, Turn, run_episodes, run_policy_episode,
                                   training_sequence)

__all__ = ["Completion", "EpisodeRecord", "GenerationRequest", "Policy", "PolicyError", "Sampling",
           "ToolCall", "Turn", "engine_names", "format_tool_call", "make_policy", "parse_tool_calls",
           "register_engine", "run_episodes", "run_policy_episode", "training_sequence"]
