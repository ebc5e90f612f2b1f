"""Drive any Policy through RepairEnv: one episode, or many at once with batched generation.

    rec = run_policy_episode(policy, bundle, seed=0)                 # one episode
    recs = run_episodes(policy, [(bundle, seed), ...], concurrency=16)

Both use one turn loop (`_Episode`): render the conversation as a GenerationRequest, ask the
policy, execute its tool calls in the env, append the observations, until the env is done
(submit or its turn limit) or the turn budget is spent. `run_episodes` keeps up to `concurrency`
episodes open: sandbox steps run in a thread pool while the policy generates for every episode
that is waiting for a reply, in one `generate` call (a batch for the transformers engine).
Results do not depend on the batching: each episode's sampling is seeded per (seed, turn).

Failures: a broken sandbox (the env's reward says infra_failure), a crashed env, or an engine that
cannot answer (PolicyError, a failed Completion) make the episode `outcome="infra_failure"` with
`reward=None` and the reason in `error`: it is counted, never scored.
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from ratchet.policy.base import Completion, GenerationRequest, PolicyError

# The turn budget episodes run under, in training (`ratchet.training.recipe.RecipeSettings.max_turns`)
# and in the holdout evaluation (`HoldoutEvalConfig.max_turns`): a policy is scored under the budget
# it learned in, and everyone (harness, scripted, learned) gets the same one. The task suite's own
# limit (30, `sandboxes.bundle.Limits`) stays the ceiling. Evaluating at 30 scored candidates under a
# budget they never trained in and cost the untrained policy's first seed 1,083 s of `demo --full`.
TURN_BUDGET = 14

NO_CALL = ("error: your reply contained no tool call. Reply with exactly one call to one of the "
           "tools: {tools}.")


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()


@dataclass
class Turn:
    """One assistant turn: what the policy saw (prompt_ids) and sampled (completion_ids)."""
    index: int
    text: str
    tool_calls: list[dict]                 # {"id", "name", "arguments", "raw"}
    observations: list[str]
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_s: float = 0.0
    forced: list[bool] | None = None       # per sampled token: the grammar left one choice (Completion.forced)
    allowed: list | None = None            # per sampled token: allowed ids at a choice (Completion.allowed)


@dataclass
class EpisodeRecord:
    policy_id: str
    task_id: str
    seed: int
    outcome: str                           # "pass" | "fail" | "infra_failure"
    passed: bool                           # tests pass at submit and no hard gate was violated
    reward: float | None                   # None for infra_failure
    status: str                            # the Reward's status, or "infra_failure"
    components: dict
    hard_gates: list[str]
    turns: int                             # assistant turns (a reply without a call counts)
    tool_calls: int
    tokens_in: int
    tokens_out: int
    latency_s: float
    policy_s: float                        # wall time this episode waited on the policy
    sandbox_s: float                       # tool calls + final verification
    cost_usd: float | None
    environment_id: str
    environment_digest: str
    started_at: datetime
    finished_at: datetime
    error: str | None = None
    patch: str = ""
    explanation: str = ""
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    turn_records: list[Turn] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    policy_spec: dict = field(default_factory=dict)

    @property
    def tests_passed(self) -> bool | None:
        return None if self.outcome == "infra_failure" else self.components.get("tests") == 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def _policy_sampling(policy) -> Sampling:
    s = getattr(policy, "sampling", None)
    return s if isinstance(s, Sampling) else Sampling(**(s or {}))


def turn_seed(seed: int, turn: int) -> int:
    """Each turn samples from its own stream, derived from the episode seed only."""
    return (int(seed) * 1_000_003 + turn * 7919) % (2**31 - 1)


def training_sequence(rec) -> dict | None:
    """The episode as one token sequence for RL: prompt_ids (the first prompt), completion_ids
    (every later token: sampled ones and the tool/observation tokens between them), env_mask
    (1 = sampled by the policy, 0 = tool output) and logprobs (0.0 at env tokens), the shape TRL's
    GRPO `rollout_func` returns; plus choice_mask (env_mask without the tokens the grammar forced:
    where it allowed one token, the policy chose nothing) and allowed (per completion token, the ids
    the grammar allowed at a choice, when the engine recorded them; else None). None when the engine has no token ids or a turn's prompt does
    not extend the previous prompt + completion (then train per turn on `turn_records`).
    `rec`: an EpisodeRecord or its list of Turns."""
    turns = rec if isinstance(rec, list) else rec.turn_records
    ts = [t for t in turns if t.completion_ids is not None and t.prompt_ids is not None]
    if not ts or len(ts) != len(turns):
        return None
    ids = list(ts[0].prompt_ids)
    prompt_len = len(ids)
    mask, lps, choice, allowed = [], [], [], []
    for t in ts:
        if t.prompt_ids[:len(ids)] != ids:
            return None
        gap = t.prompt_ids[len(ids):]
        ids += gap + t.completion_ids
        mask += [0] * len(gap) + [1] * len(t.completion_ids)
        lps += [0.0] * len(gap) + list(t.logprobs or [0.0] * len(t.completion_ids))
        forced = t.forced if t.forced is not None and len(t.forced) == len(t.completion_ids) else None
        choice += [0] * len(gap) + ([int(not f) for f in forced] if forced is not None else [1] * len(t.completion_ids))
        ok = t.allowed is not None and len(t.allowed) == len(t.completion_ids)
        allowed = None if allowed is None or not ok else allowed + [None] * len(gap) + list(t.allowed)
    return {"prompt_ids": ids[:prompt_len], "completion_ids": ids[prompt_len:], "env_mask": mask,
            "logprobs": lps, "choice_mask": choice, "allowed": allowed}


class _Episode:
    """One episode's turn loop, advanced by the runner (so one or many run the same code)."""

    def __init__(self, policy, bundle, seed: int, sampling: Sampling, *, runtime=None, judge=None,
                 weights=None, max_turns: int | None = None, env=None):
        from sandboxes.env import RepairEnv

        self.policy, self.bundle, self.seed, self.sampling = policy, bundle, int(seed), sampling
        self.env = env if env is not None else RepairEnv(bundle, runtime=runtime, judge=judge, weights=weights,
                                                         max_turns=max_turns)
        self.messages: list[dict] = []
        self.tools: list[dict] = []
        self.turns: list[Turn] = []
        self.error: str | None = None
        self.policy_s = 0.0
        self.cost: float | None = None
        self.started_at = datetime.now(timezone.utc)
        self.t0 = time.monotonic()
        self.done = False
        self._pending: Completion | None = None

    # -- sandbox side (runs in the pool) ----------------------------------------------------
    def start(self) -> None:
        try:
            self.messages = self.env.reset()
            self.tools = self.env.tool_schemas()
        except Exception as e:  # noqa: BLE001 - a sandbox that cannot start is the harness's fault
            self.fail(f"env reset failed: {type(e).__name__}: {e}")
        self._close_if_done()

    def act(self) -> None:
        c, self._pending = self._pending, None
        try:
            self._act(c)
        except Exception as e:  # noqa: BLE001 - a crash in the env is never the policy's score
            self.fail(f"env step failed: {type(e).__name__}: {e}")
        self._close_if_done()

    def _close_if_done(self) -> None:
        """Tear the finished episode's sandbox down here, in the pool thread. `record()` runs on
        the thread that generates: closing there (unmounting the quota tmpfs and deleting the
        worktree wait on the kernel, ~0.1 s an episode) held up generation for the episodes still
        open (a profile of a batch of 32 in bench/rollout.py: 3.5 s of its 16.9 s on that thread).
        Where every episode ends on the same turn the wall did not change measurably (the
        unmounts serialise in the kernel); it is for runs whose episodes end at different turns."""
        if not self.done:
            return
        try:
            self.env.close()
        except Exception:  # noqa: BLE001 - cleanup must not turn a result into a crash
            pass

    def _act(self, c: Completion) -> None:
        env = self.env
        calls, obs = [], []
        for i, tc in enumerate(c.tool_calls):
            cid = tc.id or f"call_{len(env.steps) + i:02d}"
            calls.append({"id": cid, "name": tc.name, "arguments": tc.arguments, "raw": tc.raw})
        msg = {"role": "assistant", "content": c.text or None}
        if calls:
            msg["tool_calls"] = [{"id": k["id"], "type": "function", "function": {
                "name": k["name"], "arguments": k["raw"] if k["arguments"] is None else _dumps(k["arguments"])}}
                for k in calls]
        self.messages.append(msg)
        for k in calls:
            if env.done:
                break
            o = env.step(k["name"], k["raw"] if k["arguments"] is None else k["arguments"])
            obs.append(o)
            self.messages.append({"role": "tool", "tool_call_id": k["id"], "name": k["name"], "content": o})
        if not calls:
            o = NO_CALL.format(tools=", ".join(t["function"]["name"] for t in self.tools))
            obs.append(o)
            self.messages.append({"role": "user", "content": o})
        self.turns.append(Turn(len(self.turns), c.text, calls, obs, c.finish_reason, c.prompt_tokens,
                               c.completion_tokens, c.prompt_ids, c.token_ids, c.logprobs, c.latency_s,
                               c.forced, c.allowed))
        if not env.done and len(self.turns) >= env.max_turns:
            env.finish("")                 # the runner's budget (replies without calls count)
        self.done = env.done

    # -- policy side ------------------------------------------------------------------------
    def request(self) -> GenerationRequest:
        s, last = self.sampling, (self.turns[-1] if self.turns else None)
        prefix = (last.prompt_ids + last.completion_ids) if last and last.prompt_ids is not None \
            and last.completion_ids is not None else None
        return GenerationRequest(
            list(self.messages), self.tools, 1, s.temperature, s.top_p, turn_seed(self.seed, len(self.turns)),
            s.stop, s.max_tokens, prefix_ids=prefix,
            metadata={"task_id": self.bundle.task_id, "episode_seed": self.seed,
                      "max_turns": self.env.max_turns, "turn": len(self.turns)})

    def receive(self, c: Completion, waited_s: float) -> bool:
        """Store the reply; False (and the episode failed) when the engine could not answer."""
        self.policy_s += waited_s
        if c.cost_usd is not None:
            self.cost = (self.cost or 0.0) + c.cost_usd
        if c.finish_reason == "error" or c.error:
            self.fail(f"policy failed: {c.error}")
            return False
        self._pending = c
        return True

    def fail(self, reason: str) -> None:
        self.error = self.error or reason
        self.done = True

    # -- result -----------------------------------------------------------------------------
    def record(self) -> EpisodeRecord:
        env, b = self.env, self.bundle
        r = None if self.error else env.reward
        try:
            env.close()
        except Exception:  # noqa: BLE001 - cleanup must not turn a result into a crash
            pass
        infra = self.error is not None or r is None or r.infra_failure
        error = self.error or (None if r is None or not r.infra_failure else "; ".join(r.reasons)) \
            or (None if r is not None else "the episode produced no reward")
        details = (r.details if r is not None else {}) or {}
        gates = [g for g in ("secrets", "forbidden", "tampering") if details.get(g)]
        passed = bool(not infra and r.status == "scored" and r.components.get("tests") == 1.0)
        spec = getattr(self.policy, "spec", {}) or {}
        return EpisodeRecord(
            policy_id=getattr(self.policy, "policy_id", spec.get("policy_id", "?")), task_id=b.task_id,
            seed=self.seed, outcome="infra_failure" if infra else ("pass" if passed else "fail"),
            passed=passed, reward=None if infra else r.value, status="infra_failure" if infra else r.status,
            components={} if infra else dict(r.components), hard_gates=[] if infra else gates,
            turns=len(self.turns), tool_calls=len(env.steps),
            tokens_in=sum(t.prompt_tokens for t in self.turns),
            tokens_out=sum(t.completion_tokens for t in self.turns),
            latency_s=time.monotonic() - self.t0, policy_s=self.policy_s, sandbox_s=env.sandbox_s,
            cost_usd=self.cost, environment_id=b.environment_id, environment_digest=b.environment_digest,
            started_at=self.started_at, finished_at=datetime.now(timezone.utc), error=error,
            patch=env.patch, explanation=env.explanation or "", messages=self.messages, tools=self.tools,
            turn_records=self.turns, reasons=list(r.reasons) if r is not None else [], policy_spec=spec)


def _dumps(obj) -> str:
    import json
    return json.dumps(obj)


def _generate(policy, eps: list[_Episode]) -> list[_Episode]:
    """One policy call for every waiting episode; returns those that got a reply to act on."""
    reqs = [e.request() for e in eps]
    t0 = time.monotonic()
    try:
        outs = policy.generate(reqs)
        if len(outs) != len(reqs):
            raise PolicyError(f"engine returned {len(outs)} results for {len(reqs)} requests")
    except Exception as e:  # noqa: BLE001 - any engine failure is an infra failure of these episodes
        dt = time.monotonic() - t0
        for ep in eps:
            ep.policy_s += dt
            ep.fail(f"policy failed: {type(e).__name__}: {e}")
        return []
    dt = time.monotonic() - t0
    return [ep for ep, out in zip(eps, outs) if ep.receive(out[0] if out else Completion.failed("no completion"), dt)]


def run_episodes(policy, jobs, *, concurrency: int = 8, sandbox_workers: int | None = None,
                 sampling: Sampling | None = None, runtime=None, judge=None, weights=None,
                 max_turns: int | None = None, min_batch: int | None = None, progress=None) -> list[EpisodeRecord]:
    """Run `jobs` [(bundle, seed), ...] with up to `concurrency` episodes open at once; records
    come back in job order. `min_batch`: when fewer episodes than this wait for the policy and
    sandbox steps are in flight, wait for one of those first (bigger batches); default half the
    open episodes. `progress(done, total)` is called after each finished episode."""
    sampling = sampling or _policy_sampling(policy)
    jobs = list(jobs)
    queue = deque(enumerate(jobs))
    results: dict[int, EpisodeRecord] = {}
    open_: dict[int, _Episode] = {}
    ready: list[int] = []
    inflight: dict = {}
    with ThreadPoolExecutor(sandbox_workers or max(1, concurrency)) as pool:
        while queue or open_:
            while queue and len(open_) < concurrency:
                i, (bundle, seed) = queue.popleft()
                ep = _Episode(policy, bundle, seed, sampling, runtime=runtime, judge=judge,
                              weights=weights, max_turns=max_turns)
                open_[i] = ep
                inflight[pool.submit(ep.start)] = i
            want = min_batch if min_batch is not None else max(1, len(open_) // 2)
            if ready and (not inflight or len(ready) >= want):
                batch, ready = ready, []
                for ep in _generate(policy, [open_[i] for i in batch]):
                    i = next(k for k in batch if open_[k] is ep)
                    inflight[pool.submit(ep.act)] = i
                for i in batch:
                    if open_[i].done and not any(v == i for v in inflight.values()):
                        _close(i, open_, results, progress, len(jobs))
                continue
            finished, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for f in finished:
                i = inflight.pop(f)
                f.result()
                if open_[i].done:
                    _close(i, open_, results, progress, len(jobs))
                else:
                    ready.append(i)
    return [results[i] for i in range(len(jobs))]


def _close(i, open_, results, progress, total) -> None:
    results[i] = open_.pop(i).record()
    if progress:
        progress(len(results), total)


def run_policy_episode(policy, bundle, seed: int = 0, *, runtime=None, judge=None, weights=None,
                       max_turns: int | None = None, sampling: Sampling | None = None, **sampling_kw) -> EpisodeRecord:
    """One episode of `bundle` with `policy` (the seam ratchet.evaluation calls). Sampling
    settings: `sampling=Sampling(...)`, keywords (temperature=, max_tokens=, ...), else the
    policy's own (`make_policy(..., sampling={...})`), else greedy with 256 new tokens a turn."""
    sampling = sampling or (Sampling(**sampling_kw) if sampling_kw else _policy_sampling(policy))
    return run_episodes(policy, [(bundle, seed)], concurrency=1, sandbox_workers=1, sampling=sampling,
                        runtime=runtime, judge=judge, weights=weights, max_turns=max_turns)[0]


def drive(policy, env, seed: int = 0, sampling: Sampling | None = None) -> EpisodeRecord:
    """The turn loop on an env someone else built (not yet reset); the env stays the caller's
    to read (reward, steps) after this returns."""
    ep = _Episode(policy, env.bundle, seed, sampling or _policy_sampling(policy), env=env)
    ep.start()
    while not ep.done:
        for e in _generate(policy, [ep]):
            e.act()
    return ep.record()

