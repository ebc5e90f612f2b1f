"""One policy interface for every engine: chat messages + tool schemas in, assistant turns out.

    policy = make_policy("harness:sbfl")               # or "scripted:expert", "hf:/path", "openai:gpt-x"
    [[c]] = policy.generate([GenerationRequest(messages, tools, seed=0)])
    c.text, c.tool_calls[0].name, c.tool_calls[0].arguments, c.token_ids, c.logprobs

An engine batches the requests it gets in one `generate` call (the transformers engine runs them
through the model together), so a runner that asks for every pending episode at once gets batched
generation for free. `Completion.token_ids` are the exact sampled ids (never re-tokenised text),
which is what RL trains on. Engines are registered by id prefix (`register_engine`); the id and
the arguments a policy was made with travel in `policy.spec` and are logged with every result.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, runtime_checkable


class PolicyError(Exception):
    """The engine could not produce a completion (server down, retries spent, model failed to
    load): the harness's fault, so the episode is an infra failure, never a scored zero."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict | None        # parsed JSON object; None when `raw` was not a JSON object
    raw: str = ""                 # the arguments as the model wrote them
    id: str = ""

    @classmethod
    def from_raw(cls, name: str, raw, id: str = "") -> "ToolCall":
        if isinstance(raw, dict):
            return cls(name, raw, json.dumps(raw), id)
        try:
            val = json.loads(raw) if raw not in (None, "") else {}
        except (TypeError, json.JSONDecodeError):
            val = None
        return cls(name, val if isinstance(val, dict) else None, raw or "", id)

    def openai(self) -> dict:
        """The OpenAI chat `tool_calls` entry."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.raw or json.dumps(self.arguments or {})}}


@dataclass
class GenerationRequest:
    """One conversation to continue. `seed` makes sampling reproducible per request (sample j of
    `n` uses seed derivation (seed, j), independent of what else is in the batch).

    `prefix_ids`: the token ids the conversation so far was sampled as (previous prompt +
    completion). An engine that supports it extends them with the new messages instead of
    re-tokenising the whole conversation, so the ids a trainer sees are exactly those sampled.
    `metadata`: engine hints (task_id, max_turns for the harness agents); never sent to a model.
    """
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    max_tokens: int = 256
    prefix_ids: list[int] | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.n < 1 or self.max_tokens < 1:
            raise ValueError(f"n ({self.n}) and max_tokens ({self.max_tokens}) must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature must be >= 0 and top_p in (0, 1]; got {self.temperature}, "
                             f"{self.top_p}")
        self.stop = tuple([self.stop] if isinstance(self.stop, str) else self.stop or ())


@dataclass
class Completion:
    """One sampled assistant turn.

    `prompt_ids` / `token_ids` / `logprobs`: the exact ids fed and sampled (None for engines that
    have no tokens: harness agents, most HTTP servers). `logprobs[i]` is the log-probability of
    `token_ids[i]` under the model's temperature-scaled distribution before any grammar mask (what
    a trainer recomputes from the same weights). Counts come from the engine or the server's
    `usage`; `cost_usd` only when a price is configured or the server reports one. An engine
    that fails for one request returns `Completion.failed(...)` for it (an infra failure of that
    episode only) instead of raising for the whole batch.
    """
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"          # "stop" | "length" | "tool_calls" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_ids: list[int] | None = None
    cost_usd: float | None = None
    error: str | None = None             # set (finish_reason "error") when the engine failed
    # per sampled token: True where the grammar allowed exactly one token (no choice was made);
    # None when the engine does not know (unconstrained, no tokens)
    forced: list[bool] | None = None
    # with masked logprobs (TransformersPolicy(masked_logprobs=True)): per sampled token, the ids
    # the grammar allowed (None where forced); `logprobs` are then under the renormalised masked
    # distribution, the policy a constrained decoder actually samples from
    allowed: list | None = None

    def message(self, call_prefix: str = "call") -> dict:
        """The OpenAI chat assistant message (tool call ids filled in when the engine gave none)."""
        calls = [c if c.id else ToolCall(c.name, c.arguments, c.raw, f"{call_prefix}_{i}")
                 for i, c in enumerate(self.tool_calls)]
        msg = {"role": "assistant", "content": self.text or None}
        if calls:
            msg["tool_calls"] = [c.openai() for c in calls]
        return msg

    @classmethod
    def failed(cls, error: str, latency_s: float = 0.0) -> "Completion":
        return cls("", finish_reason="error", error=error, latency_s=latency_s)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Completion":
        d = dict(d)
        d["tool_calls"] = [ToolCall(**c) for c in d.get("tool_calls") or ()]
        return cls(**d)


@runtime_checkable
class Policy(Protocol):
    policy_id: str
    spec: dict                    # {"policy_id", "engine", "config"}: logged with every result

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """One list of `request.n` completions per request, in order."""
        ...


# --------------------------------------------------------------------------- tool-call text format
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) from model text in the Hermes/Qwen format
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, or a bare JSON object of that
    shape. Text that holds no such call gives no calls (the runner reports it to the model)."""
    blobs = [m.group(1) for m in _TAGGED.finditer(text)]
    content = _TAGGED.sub("", text).strip() if blobs else text.strip()
    if not blobs and content.startswith("{"):
        blobs, content = [content], ""
    calls = []
    for blob in blobs:
        try:
            obj = json.loads(blob)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", obj.get("parameters", {}))
            calls.append(ToolCall.from_raw(obj["name"], args if isinstance(args, (dict, str)) else json.dumps(args)))
    return content, calls


def format_tool_call(name: str, arguments: dict) -> str:
    """The inverse of `parse_tool_calls` for one call."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# --------------------------------------------------------------------------- registry
_ENGINES: dict[str, Callable] = {}
_LOADED = False


def register_engine(prefix: str, factory: Callable) -> None:
    """`make_policy(f"{prefix}:{name}", **config)` calls `factory(name, policy_id=..., **config)`."""
    _builtin()
    if prefix in _ENGINES:
        raise ValueError(f"engine {prefix!r} is already registered")
    _ENGINES[prefix] = factory


def engine_names() -> tuple[str, ...]:
    _builtin()
    return tuple(_ENGINES)


def make_policy(policy_id: str, **config) -> Policy:
    """A policy from its id: "harness:random|sbfl|prior", "scripted:expert|noisy", "hf:<local
    path>", "embedded:<name>" (path=... to the checkpoint; grammar-constrained), "openai:<model>"
    (base_url=..., see engines.openai_http). `sampling={"temperature": ..., "max_tokens": ...}`
    sets the policy's default sampling for the runner (logged in `policy.spec`)."""
    _builtin()
    prefix, sep, name = policy_id.partition(":")
    if not sep or not name:
        raise ValueError(f"policy id {policy_id!r} is not '<engine>:<name>'; engines: {engine_names()}")
    if prefix not in engine_names():
        raise ValueError(f"unknown engine {prefix!r} in {policy_id!r}; one of {engine_names()}")
    sampling = config.pop("sampling", None)
    policy = _ENGINES[prefix](name, policy_id=policy_id, **config)
    if sampling is not None:
        from ratchet.policy.runner import Sampling
        policy.sampling = sampling if isinstance(sampling, Sampling) else Sampling(**sampling)
        policy.spec = {**policy.spec, "sampling": dict(vars(policy.sampling))}
    return policy


def _builtin() -> None:
    # Lazy: the engines import transformers/urllib only when a policy of theirs is made.
    global _LOADED
    if _LOADED:
        return
    _LOADED = True

    def harness(name, **kw):
        from ratchet.policy.engines.harness import HarnessPolicy
        return HarnessPolicy(name, **kw)

    def hf(name, **kw):
        from ratchet.policy.engines.transformers_engine import TransformersPolicy
        return TransformersPolicy.from_path(kw.pop("path", name), **kw)

    def embedded(name, **kw):
        from ratchet.policy.engines.transformers_engine import TransformersPolicy
        if "path" not in kw:
            raise ValueError(f"embedded:{name} needs path=<checkpoint folder>")
        from ratchet.policy.embedded.decoding import read_decoding
        kw.setdefault("constrained", True)
        kw.setdefault("chat", "embedded")
        for k, v in read_decoding(kw["path"]).items():   # the mask and bounds it was trained under
            kw.setdefault(k, v)
        return TransformersPolicy.from_path(kw.pop("path"), **kw)

    def openai(name, **kw):
        from ratchet.policy.engines.openai_http import OpenAIPolicy
        return OpenAIPolicy(name, **kw)

    for p, f in (("harness", harness), ("scripted", harness), ("hf", hf), ("embedded", embedded),
                 ("openai", openai)):
        _ENGINES[p] = f
