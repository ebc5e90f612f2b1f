"""RepairEnv: one episode of one TaskBundle, driven through the tools in `sandboxes.tools`.

    env = RepairEnv(bundle)                   # runtime: a shared LocalRuntime (bwrap) by default
    messages = env.reset()                    # [system, user (the issue)] in OpenAI chat form
    obs = env.step("localize", {"top": 5})    # always a string; "error: ..." on a bad call
    ...
    env.step("submit", {"explanation": "..."})
    env.done, env.reward                      # Reward from compose_reward (sandboxes.verifiers)
    env.steps                                 # every call: tool, arguments, observation, duration
    env.close()

The allowlist, argument validation, output limits and the turn limit are enforced here, not by
the policy. A turn is one step (one tool call). When the turn limit is hit the episode is scored
as it stands, with an empty explanation.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

SYSTEM_PROMPT = (
    "You are a code-repair agent working in a sandboxed checkout of a repository. Use the tools to "
    "read the issue, find the root cause and fix it with a minimal change. Do not modify tests, "
    "CI configuration or add credentials. Finish by calling submit with a root-cause explanation "
    "naming the function, the line and what was wrong.")


def user_prompt(bundle) -> str:
    # The issue text is in the prompt (as a harness would paste it): it is what makes two
    # trajectories of one problem near-duplicates for the dedup stage.
    return (f"Repository: {bundle.repo or bundle.task_id}\nIssue {bundle.issue_id or bundle.task_id}: "
            f"{bundle.issue_title}\n\n{bundle.issue_body}".rstrip())


@dataclass
class Step:
    index: int
    tool: str
    arguments: dict | str          # as the agent sent them (raw text when it was not valid JSON)
    observation: str
    duration_s: float
    error: bool = False


class InfraError(Exception):
    """The sandbox or harness failed (not the agent's fault): recorded, never scored as zero."""


_RUNTIME = None


def default_runtime():
    """One LocalRuntime per process (shares the snapshot cache)."""
    global _RUNTIME
    if _RUNTIME is None:
        from sandboxes.runtime import LocalRuntime
        _RUNTIME = LocalRuntime()
    return _RUNTIME


@dataclass
class RepairEnv:
    bundle: object
    runtime: object = None
    judge: object = None
    weights: object = None
    max_turns: int | None = None
    tracker: object = None
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self):
        self.max_turns = self.max_turns or self.bundle.limits.max_turns
        self.max_output_chars = self.bundle.limits.max_output_chars
        self.episode = None
        self.tracker_ns = None
        self.reward = None
        self.done = False
        self.last_outcomes: dict | None = None
        self.infra_errors: list[str] = []
        self.final_outcomes: dict | None = None
        self.explanation: str | None = None
        self.patch: str = ""
        self.sandbox_s = 0.0

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> list[dict]:
        from sandboxes.issue_tracker import IssueTracker

        self.close()
        self.steps, self.reward, self.done = [], None, False
        self.last_outcomes = self.final_outcomes = self.explanation = None
        self.infra_errors, self.patch, self.sandbox_s = [], "", 0.0
        self.runtime = self.runtime or default_runtime()
        self.tracker = self.tracker or IssueTracker.shared()
        self.tracker_ns = self.tracker.register(self.bundle)
        self.episode = self.runtime.episode(self.bundle)
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": user_prompt(self.bundle)}]

    def close(self) -> None:
        if self.episode is not None:
            self.episode.close()
            self.episode = None
        if self.tracker_ns is not None:
            self.tracker.unregister(self.tracker_ns)
            self.tracker_ns = None

    def __enter__(self) -> "RepairEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def turns(self) -> int:
        return len(self.steps)

    @property
    def allowed_tools(self) -> tuple[str, ...]:
        return tuple(self.bundle.tool_allowlist)

    def tool_schemas(self) -> list[dict]:
        """The schemas a policy is shown: only the allowlisted tools."""
        from sandboxes.tools import TOOL_SCHEMAS
        return [s for s in TOOL_SCHEMAS if s["function"]["name"] in self.allowed_tools]

    def infra(self, reason: str) -> InfraError:
        return InfraError(reason)

    # ------------------------------------------------------------------ acting
    def step(self, tool: str, arguments: dict | str | None = None) -> str:
        if self.episode is None and not self.done:
            raise RuntimeError("call reset() before step()")
        if self.done:
            return "error: the episode is over (submitted or turn limit reached)"
        t0 = time.monotonic()
        obs, err = self._dispatch(tool, arguments)
        if len(obs) > self.max_output_chars:
            obs, err = (f"error: the output of {tool} is {len(obs)} characters, over the "
                        f"{self.max_output_chars}-character limit; ask for less (a line range, a "
                        f"narrower path or pattern, fewer tests)"), True
        dt = time.monotonic() - t0
        if tool != "submit":
            self.sandbox_s += dt
        self.steps.append(Step(len(self.steps), tool, arguments if arguments is not None else {}, obs, dt, err))
        if not self.done and self.turns >= self.max_turns:
            self.finish("")
            obs += f"\n(turn limit {self.max_turns} reached: the episode ended and was scored)"
            self.steps[-1].observation = obs
        return obs

    def _dispatch(self, tool: str, arguments) -> tuple[str, bool]:
        from sandboxes.runtime import PathEscape
        from sandboxes.tools import IMPLEMENTATIONS, ToolError, check_arguments

        if tool not in IMPLEMENTATIONS:
            return f"error: unknown tool {tool!r}; available: {', '.join(self.allowed_tools)}", True
        if tool not in self.allowed_tools:
            return f"error: tool {tool!r} is not allowed in this environment", True
        try:
            args = _parse(arguments)
            args = check_arguments(tool, args)
            return IMPLEMENTATIONS[tool](self, **args), False
        except ToolError as e:
            return f"error: {e}", True
        except PathEscape as e:
            return f"error: path not allowed: {e}", True
        except InfraError as e:
            self.infra_errors.append(str(e))
            return f"error: sandbox infrastructure failure: {e}", True
        except (FileNotFoundError, NotADirectoryError) as e:
            return f"error: no such file or folder: {e.filename or e}", True
        except IsADirectoryError as e:
            return f"error: is a folder, not a file: {e.filename or e}", True
        except (OSError, ValueError) as e:   # e.g. file too large, unreadable
            return f"error: {type(e).__name__}: {e}", True
        except Exception as e:  # noqa: BLE001 - a bug in the harness is an infra failure, not the agent's
            self.infra_errors.append(f"{tool}: {type(e).__name__}: {e}")
            return f"error: internal tool failure ({type(e).__name__})", True

    # ------------------------------------------------------------------ scoring
    def finish(self, explanation: str):
        """Run the required tests on the final tree, take the diff and compose the reward."""
        from sandboxes.verifiers import compose_reward

        b = self.bundle
        self.explanation = explanation
        t0 = time.monotonic()
        rep = self.episode.run_tests(list(b.fail_to_pass) + list(b.pass_to_pass))
        infra = rep.infra_error or (self.infra_errors[0] if self.infra_errors else None)
        self.final_outcomes = None if rep.infra_error else dict(rep.outcomes)
        try:
            self.patch = self.episode.diff()
        except Exception as e:  # noqa: BLE001 - a broken worktree is the harness's failure
            infra, self.patch = infra or f"diff failed: {e}", ""
        self.sandbox_s += time.monotonic() - t0
        self.reward = compose_reward(b, outcomes=self.final_outcomes, diff=self.patch,
                                     explanation=explanation, infra_error=infra, judge=self.judge,
                                     weights=self.weights)
        self.done = True
        return self.reward

    @property
    def tests_passed(self) -> bool | None:
        if self.reward is None or self.reward.infra_failure:
            return None
        return self.reward.components.get("tests") == 1.0


def _parse(arguments) -> dict:
    from sandboxes.tools import ToolError

    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ToolError(f"arguments are not valid JSON: {e}") from None
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    return arguments
