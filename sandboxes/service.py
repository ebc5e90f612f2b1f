"""Ratchet as an environment service: an HTTP API over a bounded pool of `RepairEnv` episodes,
for trainers Ratchet does not run (TRL, OpenRLHF, VeRL, a hand-written GRPO loop).

    python -m sandboxes.service --tasks DIR --port 8765 --max-episodes 16 --idle-timeout 300

    GET    /tasks                     task ids (+ repo and issue title) of the suite served
    GET    /tasks/{task_id}           one task's initial messages and tools (no sandbox opened)
    GET    /tools                     every tool schema (an episode gets its task's allowlist)
    POST   /episodes                  {task_id, seed?} -> episode id, initial messages, tools
    POST   /episodes/{id}/step        {tool, arguments} -> observation, done, turn
    GET    /episodes/{id}/reward      reward + verifier breakdown, or infra_failure + reason
    DELETE /episodes/{id}             close (idempotent)
    GET    /health                    open episodes, capacity, idle timeout

An episode is exactly the in-process one (`sandboxes.env.RepairEnv`): same tools, allowlist,
limits, turn limit, pristine verification and reward. The service adds what a network needs:
at most `max_episodes` sandboxes open at once (429 + Retry-After beyond that), a reaper that
closes an episode nobody touched for `idle_timeout_s` (a client that dies mid-episode leaves no
sandbox process or worktree behind), and 4xx answers for requests that are not an episode's
move (unknown task, episode or tool, arguments that are not a JSON object). Argument values that
do not fit the tool's schema are the agent's mistake, as in-process: an "error: ..." observation
that uses a turn.

Sandbox work blocks (subprocesses, test runs), so it runs in a thread pool, never on the event
loop; calls on one episode are serialised by its own lock. The pool (`EpisodePool`) is plain
Python; `create_app` wraps it in FastAPI (OpenAPI docs at /docs and /openapi.json).
"""
# No `from __future__ import annotations`: FastAPI resolves the request models of create_app
# from the endpoints' annotations, and those models are local to it (pydantic loads lazily).
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_EPISODES = 16
DEFAULT_IDLE_TIMEOUT_S = 300.0
# Closed episodes remembered (id -> why, reward): a repeated close, a late step or a reward asked
# after close get a precise answer instead of "unknown episode". Bounded: a long-running
# server must not grow without limit.
CLOSED_MEMORY = 4096


class ServiceError(Exception):
    """A request the service refuses: HTTP status, a message for the client, extra headers."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, dict(headers or {})


class TaskSuiteError(ValueError):
    """The task suite given to the server cannot be loaded (nothing is served)."""


# --------------------------------------------------------------------------- task suites
def load_tasks(path: str | Path | None = None, *, seed: int = 0, limit: int | None = None,
               per_problem: int = 8) -> dict:
    """{task_id: TaskBundle} from the formats the code base writes:

    * a written suite folder (`manifest.json` + `tasks/*.json`, `sandboxes.humaneval.suite`),
      checked against its sha256 manifest;
    * a folder of saved bundles (`*.json`, one `TaskBundle.save` each, as
      `ratchet.training.verl_data.write_rl_parquet` leaves them), or one bundle file;
    * None: the HumanEval-derived repair suite (`build_suite(seed, limit, per_problem)`, cached).
    """
    from sandboxes.bundle import TaskBundle

    if path is None:
        from sandboxes.humaneval import build_suite
        bundles = build_suite(seed=seed, limit=limit, per_problem=per_problem).tasks
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise TaskSuiteError(f"task suite {p} does not exist")
        if p.is_dir() and (p / "manifest.json").exists():
            from sandboxes.humaneval.suite import load_suite
            try:
                bundles = load_suite(p).tasks
            except (ValueError, OSError, KeyError) as e:
                raise TaskSuiteError(f"task suite {p}: {e}") from e
        else:
            files = [p] if p.is_file() else sorted(p.glob("*.json"))
            if not files:
                raise TaskSuiteError(f"{p} holds no saved task bundles (*.json) and no suite manifest.json")
            bundles = []
            for f in files:
                try:
                    bundles.append(TaskBundle.load(f))
                except (ValueError, TypeError, KeyError, OSError) as e:
                    raise TaskSuiteError(f"{f} is not a task bundle: {e}") from e
        if limit is not None:
            bundles = bundles[:limit]
    tasks: dict = {}
    for b in bundles:
        if b.task_id in tasks:
            raise TaskSuiteError(f"two bundles have task id {b.task_id!r}")
        tasks[b.task_id] = b
    if not tasks:
        raise TaskSuiteError("the task suite is empty")
    return tasks


def task_messages(bundle) -> list[dict]:
    from sandboxes.env import SYSTEM_PROMPT, user_prompt
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_prompt(bundle)}]


def tool_schemas(bundle) -> list[dict]:
    from sandboxes.tools import TOOL_SCHEMAS
    return [s for s in TOOL_SCHEMAS if s["function"]["name"] in bundle.tool_allowlist]


def reward_payload(episode_id: str, task_id: str, reward, turns: int) -> dict:
    """The reward as the API returns it: value None and infra_failure true (with the reason) when
    the harness failed, never a 0 score for it."""
    d = json.loads(json.dumps(reward.to_dict(), default=str))     # details may hold tuples, paths
    infra = reward.infra_failure
    return {"episode_id": episode_id, "task_id": task_id, "turns": turns, "reward": d["value"],
            "status": d["status"], "infra_failure": infra,
            "infra_reason": "; ".join(reward.reasons) if infra else None,
            "components": d["components"], "weights": d["weights"], "reasons": d["reasons"],
            "details": d["details"]}


# --------------------------------------------------------------------------- the pool
@dataclass
class _Episode:
    id: str
    task_id: str
    seed: int | None
    env: object
    created: float
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    sandbox_open: bool = True
    closed: str | None = None            # why, once closed


class EpisodePool:
    """At most `max_episodes` open sandboxes; episodes idle past `idle_timeout_s` are closed by
    `reap_idle` (the reaper thread runs it; `start()` / `stop()`). Thread-safe. Methods raise
    `ServiceError` for requests they refuse and return JSON-ready dicts."""

    def __init__(self, tasks: dict, *, runtime=None, max_episodes: int = DEFAULT_MAX_EPISODES,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, retry_after_s: int = 1,
                 judge=None, weights=None, max_turns: int | None = None, clock=time.monotonic):
        if max_episodes < 1:
            raise ValueError(f"max_episodes must be >= 1, got {max_episodes}")
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        self.tasks = dict(tasks)
        self._task_order = sorted(self.tasks)
        self.runtime = runtime
        self.max_episodes, self.idle_timeout_s = int(max_episodes), float(idle_timeout_s)
        self.retry_after_s = max(1, int(retry_after_s))
        self.judge, self.weights, self.max_turns = judge, weights, max_turns
        self._clock = clock
        self._lock = threading.Lock()
        self._episodes: dict[str, _Episode] = {}
        self._reserved = 0                       # slots taken by episodes still starting
        self._closed: OrderedDict[str, tuple[str, dict | None]] = OrderedDict()
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ lifecycle of the pool
    def start(self) -> "EpisodePool":
        """Start the reaper thread (idempotent)."""
        if self.runtime is None:
            from sandboxes.env import default_runtime
            self.runtime = default_runtime()
        if self._reaper is None or not self._reaper.is_alive():
            self._stop.clear()
            self._reaper = threading.Thread(target=self._reap_loop, name="episode-reaper", daemon=True)
            self._reaper.start()
        return self

    def stop(self) -> None:
        """Stop the reaper and close every episode (server shutdown)."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=10)
            self._reaper = None
        for eid in list(self._episodes):
            self._close(eid, "server shutdown")

    def _reap_loop(self) -> None:
        # check several times per timeout, so an episode outlives its timeout by a fraction of it
        interval = min(max(self.idle_timeout_s / 4, 0.05), 5.0)
        while not self._stop.wait(interval):
            try:
                self.reap_idle()
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad close
                log.exception("episode reaper")

    # ------------------------------------------------------------------ queries
    def stats(self) -> dict:
        with self._lock:
            open_ = sum(1 for e in self._episodes.values() if e.sandbox_open)
            return {"open_episodes": open_, "starting": self._reserved, "max_episodes": self.max_episodes,
                    "finished_episodes": len(self._episodes) - open_,
                    "idle_timeout_s": self.idle_timeout_s, "tasks": len(self.tasks)}

    def list_tasks(self) -> list[dict]:
        return [{"task_id": t, "repo": self.tasks[t].repo, "issue_title": self.tasks[t].issue_title}
                for t in self._task_order]

    def task(self, task_id: str) -> dict:
        b = self._bundle(task_id)
        return {"task_id": task_id, "repo": b.repo, "issue_id": b.issue_id, "messages": task_messages(b),
                "tools": tool_schemas(b), "max_turns": self.max_turns or b.limits.max_turns,
                "environment_digest": b.environment_digest}

    def _bundle(self, task_id: str):
        b = self.tasks.get(task_id)
        if b is None:
            raise ServiceError(404, f"unknown task {task_id!r}: this server serves {len(self.tasks)} tasks "
                                    f"(GET /tasks lists them)")
        return b

    # ------------------------------------------------------------------ episodes
    def create(self, task_id: str | None = None, seed: int | None = None) -> dict:
        """Open an episode (blocking: it starts a sandbox). Without task_id the seed picks one task
        of the suite (sorted ids, seed modulo their number)."""
        from sandboxes.env import RepairEnv

        if task_id is None:
            if seed is None:
                raise ServiceError(400, "give a task_id (GET /tasks lists them) or a seed to pick one")
            task_id = self._task_order[seed % len(self._task_order)]
        bundle = self._bundle(task_id)
        with self._lock:
            used = self._reserved + sum(1 for e in self._episodes.values() if e.sandbox_open)
            if used >= self.max_episodes:
                raise ServiceError(
                    429, f"all {self.max_episodes} episode slots are in use; retry after "
                         f"{self.retry_after_s} s, or close finished episodes (DELETE /episodes/{{id}})",
                    {"Retry-After": str(self.retry_after_s)})
            self._reserved += 1
        env = None
        try:
            if self.runtime is None:
                self.start()
            env = RepairEnv(bundle, runtime=self.runtime, judge=self.judge, weights=self.weights,
                            max_turns=self.max_turns)
            messages = env.reset()
        except Exception as e:  # noqa: BLE001 - whatever stopped the sandbox, the client gets why
            if env is not None:
                try:
                    env.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing an episode that failed to start")
            with self._lock:
                self._reserved -= 1
            raise ServiceError(503, f"infra failure: the sandbox for {task_id} did not start: "
                                    f"{type(e).__name__}: {e}") from e
        now = self._clock()
        ep = _Episode(uuid.uuid4().hex, task_id, seed, env, now, now)
        with self._lock:
            self._reserved -= 1
            self._episodes[ep.id] = ep
        return {"episode_id": ep.id, "task_id": task_id, "seed": seed, "messages": messages,
                "tools": env.tool_schemas(), "max_turns": env.max_turns,
                "idle_timeout_s": self.idle_timeout_s, "environment_digest": bundle.environment_digest}

    def _get(self, episode_id: str) -> _Episode:
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is not None:
                return ep
            gone = self._closed.get(episode_id)
        if gone is not None:
            raise ServiceError(410, f"episode {episode_id} is closed ({gone[0]})")
        raise ServiceError(404, f"unknown episode {episode_id!r}")

    def step(self, episode_id: str, tool: str, arguments=None) -> dict:
        """One tool call (blocking). Refused with 4xx, using no turn: an unknown or disallowed
        tool, arguments that are not a JSON object, a closed or finished episode."""
        ep = self._get(episode_id)
        allowed = ep.env.allowed_tools
        if tool not in allowed:
            from sandboxes.tools import TOOL_NAMES
            what = "not allowed for this task" if tool in TOOL_NAMES else "unknown"
            raise ServiceError(400, f"tool {tool!r} is {what}; this episode's tools: {', '.join(allowed)}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                raise ServiceError(400, f"arguments are not valid JSON: {e}") from None
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ServiceError(400, f"arguments must be a JSON object, got {type(arguments).__name__}")
        with ep.lock:
            if ep.closed:
                raise ServiceError(410, f"episode {episode_id} is closed ({ep.closed})")
            env = ep.env
            if env.done:
                raise ServiceError(409, f"episode {episode_id} is over (submitted or turn limit reached); "
                                        f"GET /episodes/{episode_id}/reward")
            ep.last_used = self._clock()
            try:
                obs = env.step(tool, arguments)
            finally:
                ep.last_used = self._clock()
            last = env.steps[-1] if env.steps else None
            out = {"episode_id": episode_id, "observation": obs, "done": env.done, "turn": env.turns,
                   "max_turns": env.max_turns, "error": bool(last and last.error)}
            if env.done:
                # the sandbox is no longer needed: free it (and its slot) now; the record and
                # the reward stay until DELETE or the idle timeout
                self._release_sandbox(ep)
                out.update(reward=env.reward.value, status=env.reward.status,
                           infra_failure=env.reward.infra_failure)
            return out

    def reward(self, episode_id: str) -> dict:
        with self._lock:
            gone = self._closed.get(episode_id) if episode_id not in self._episodes else None
        if gone is not None and gone[1] is not None:
            return gone[1]
        ep = self._get(episode_id)
        with ep.lock:
            env = ep.env
            if ep.closed and env.reward is None:
                raise ServiceError(410, f"episode {episode_id} was closed before it was scored ({ep.closed})")
            if env.reward is None:
                raise ServiceError(409, f"episode {episode_id} is not finished: call the submit tool "
                                        f"(turn {env.turns} of {env.max_turns})")
            ep.last_used = self._clock()
            return reward_payload(ep.id, ep.task_id, env.reward, env.turns)

    def close(self, episode_id: str) -> dict:
        """Close an episode: kill its processes, delete its worktree. Idempotent."""
        with self._lock:
            known = episode_id in self._episodes
            gone = self._closed.get(episode_id)
        if not known:
            if gone is None:
                raise ServiceError(404, f"unknown episode {episode_id!r}")
            return {"episode_id": episode_id, "closed": True, "already_closed": True, "reason": gone[0]}
        closed = self._close(episode_id, "closed by the client")
        return {"episode_id": episode_id, "closed": True, "already_closed": not closed,
                "reason": "closed by the client"}

    def _release_sandbox(self, ep: _Episode) -> None:
        """Close the episode's sandbox (caller holds ep.lock)."""
        if ep.sandbox_open:
            try:
                ep.env.close()
            finally:
                with self._lock:
                    ep.sandbox_open = False

    def _close(self, episode_id: str, why: str, *, idle_since: float | None = None) -> bool:
        """Close one episode; with `idle_since` (the reaper) only if it is not busy and was last
        used before then, else leave it."""
        with self._lock:
            ep = self._episodes.get(episode_id)
        if ep is None:
            return False
        if not ep.lock.acquire(blocking=idle_since is None):
            return False                                  # busy: a step is running
        try:
            if ep.closed or (idle_since is not None and ep.last_used > idle_since):
                return False
            ep.closed = why
            try:
                self._release_sandbox(ep)
            finally:          # a close that failed must not leave a record the reaper retries forever
                env = ep.env
                rec = reward_payload(ep.id, ep.task_id, env.reward, env.turns) if env.reward is not None else None
                with self._lock:
                    self._episodes.pop(episode_id, None)
                    self._closed[episode_id] = (why, rec)
                    while len(self._closed) > CLOSED_MEMORY:
                        self._closed.popitem(last=False)
            return True
        finally:
            ep.lock.release()

    def reap_idle(self) -> list[str]:
        """Close every episode untouched for idle_timeout_s (one in the middle of a step is
        busy, not idle: skipped). Returns the ids closed."""
        cutoff = self._clock() - self.idle_timeout_s
        with self._lock:
            idle = [e.id for e in self._episodes.values() if e.last_used < cutoff]
        closed = []
        for eid in idle:
            if self._close(eid, f"idle for more than {self.idle_timeout_s:g} s", idle_since=cutoff):
                closed.append(eid)
        if closed:
            log.info("closed %d idle episode(s)", len(closed))
        return closed


# --------------------------------------------------------------------------- HTTP
def create_app(pool: EpisodePool):
    """The FastAPI app over `pool`: starts its reaper on startup, closes every episode on
    shutdown. Blocking pool calls run in a thread pool of max_episodes + 8 threads (the extra
    ones keep closes and rewards answering while every episode is mid-step)."""
    from contextlib import asynccontextmanager
    from typing import Any

    import anyio
    from fastapi import Body, FastAPI, Request
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    limiter: list = []

    async def blocking(fn, *args):
        if not limiter:
            limiter.append(anyio.CapacityLimiter(pool.max_episodes + 8))
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter[0])

    @asynccontextmanager
    async def lifespan(_app):
        await blocking(pool.start)
        try:
            yield
        finally:
            await blocking(pool.stop)

    app = FastAPI(title="Ratchet environment service", lifespan=lifespan,
                  description="Repair episodes in Ratchet's sandboxes, scored by its verifiers. "
                              "See docs/envservice.md.")

    @app.exception_handler(ServiceError)
    async def _refused(_request: Request, exc: ServiceError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=exc.headers)

    class CreateEpisode(BaseModel):
        task_id: str | None = Field(None, description="a task id from GET /tasks")
        seed: int | None = Field(None, description="recorded with the episode (the environment is "
                                                   "deterministic); picks the task when task_id is omitted")

    class StepRequest(BaseModel):
        tool: str = Field(..., description="a tool name from the episode's tools")
        arguments: dict[str, Any] | str | None = Field(
            None, description="the tool's arguments: a JSON object, or a string holding one")

    @app.get("/health")
    async def health():
        return pool.stats()

    @app.get("/tools")
    async def tools():
        from sandboxes.tools import TOOL_SCHEMAS
        return {"tools": TOOL_SCHEMAS}

    @app.get("/tasks")
    async def tasks():
        return {"tasks": pool.list_tasks()}

    @app.get("/tasks/{task_id:path}")
    async def task(task_id: str):
        return pool.task(task_id)

    @app.post("/episodes", status_code=201)
    async def create(req: CreateEpisode = Body(...)):
        return await blocking(pool.create, req.task_id, req.seed)

    @app.post("/episodes/{episode_id}/step")
    async def step(episode_id: str, req: StepRequest):
        return await blocking(pool.step, episode_id, req.tool, req.arguments)

    @app.get("/episodes/{episode_id}/reward")
    async def reward(episode_id: str):
        return await blocking(pool.reward, episode_id)

    @app.delete("/episodes/{episode_id}")
    async def close(episode_id: str):
        return await blocking(pool.close, episode_id)

    return app


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sandboxes.service", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=None,
                    help="a written suite folder (manifest.json), a folder of saved bundles (*.json) or one "
                         "bundle file; default: the HumanEval-derived repair suite")
    ap.add_argument("--suite-seed", type=int, default=0, help="seed of the default suite")
    ap.add_argument("--limit", type=int, default=None, help="serve only the first N tasks (default suite: N problems)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--max-episodes", type=int, default=DEFAULT_MAX_EPISODES)
    ap.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                    help="seconds an episode may go untouched before it is closed")
    ap.add_argument("--max-turns", type=int, default=None, help="turn limit (default: each task's own)")
    ap.add_argument("--sandbox-root", default=None, help="the runtime's root (default: sandboxes.runtime.default_root)")
    ap.add_argument("--log-level", default="info")
    a = ap.parse_args(argv)

    import uvicorn

    from sandboxes.runtime import LocalRuntime

    try:
        tasks = load_tasks(a.tasks, seed=a.suite_seed, limit=a.limit)
    except TaskSuiteError as e:
        ap.error(str(e))
    from sandboxes.runtime import SandboxUnavailable
    try:
        pool = EpisodePool(tasks, runtime=LocalRuntime(a.sandbox_root), max_episodes=a.max_episodes,
                           idle_timeout_s=a.idle_timeout, max_turns=a.max_turns)
    except (ValueError, SandboxUnavailable) as e:
        ap.error(str(e))
    print(f"serving {len(tasks)} tasks on http://{a.host}:{a.port} (docs: /docs), at most "
          f"{a.max_episodes} episodes, idle timeout {a.idle_timeout:g} s", flush=True)
    uvicorn.run(create_app(pool), host=a.host, port=a.port, log_level=a.log_level)


if __name__ == "__main__":
    main()
