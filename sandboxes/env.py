"""RepairEnv: one episode of one TaskBundle, driven through the tools in `sandboxes.tools`.

    env = RepairEnv(bundle)                   # runtime: a shared LocalRuntime (bwrap) by default
    messages = env.reset()                    # [system, user (the issue)] in OpenAI chat form
    obs = env.step("localize", {"top": 5})    # always a string; "error: ..." on a bad call
    ...
    env.step("submit", {"explanation": "..."})
    env.done, env.reward                      # Reward from compose_reward (sandboxes.verifiers)
    env.steps                                 # every call: tool, arguments, observation, duration
    env.close()

The allowlist, argument validation, output limits, the turn limit and the disk quota are
enforced here, not by the policy. A turn is one step (one tool call). When the turn limit is
hit the episode is scored as it stands, with an empty explanation.

Scoring (`finish`) never trusts the agent's worktree: the required tests run in a fresh sandbox
on the task's own tests and configuration plus the agent's changes to the code
(`sandboxes.verify`). Failure attribution: a crash, timeout or broken sandbox caused by code the
agent wrote or ran is the agent's failure (the tests fail, the episode is scored); only a fault
of the harness itself, confirmed by the runtime's health probe, is `infra_failure` (unscored),
and only such a fault voids the episode.
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
        self.verification = None

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> list[dict]:
        from sandboxes.issue_tracker import IssueTracker

        self.close()
        self.steps, self.reward, self.done = [], None, False
        self.last_outcomes = self.final_outcomes = self.explanation = None
        self.infra_errors, self.patch, self.sandbox_s = [], "", 0.0
        self.verification = None
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
        t0, r0 = time.monotonic(), self._reused_s()
        obs, err = self._dispatch(tool, arguments)
        if len(obs) > self.max_output_chars:
            obs, err = (f"error: the output of {tool} is {len(obs)} characters, over the "
                        f"{self.max_output_chars}-character limit; ask for less (a line range, a "
                        f"narrower path or pattern, fewer tests)"), True
        dt = time.monotonic() - t0
        if tool != "submit":
            self.sandbox_s += dt + self._reused_s() - r0
        self.steps.append(Step(len(self.steps), tool, arguments if arguments is not None else {}, obs, dt, err))
        over = None if self.done else self._over_quota()
        if over:
            self.finish("", failure=over)
            self.steps[-1].observation = obs + f"\n({over}: the episode ended and was scored 0)"
            return self.steps[-1].observation
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

    def _reused_s(self) -> float:
        """A reused test run (sandboxes.result_cache) counts the seconds it took when it was made:
        `sandbox_s` prices the episode's sandbox work whichever policy happened to run it first."""
        return float(getattr(self.episode, "reused_s", 0.0) or 0.0)

    # ------------------------------------------------------------------ scoring
    def _over_quota(self) -> str | None:
        quota = self.bundle.limits.disk_mb * 1024 * 1024
        try:
            used = self.episode.disk_usage()
        except OSError:
            return None
        if used > quota:
            return (f"disk quota exceeded: the worktree holds {used / 2**20:.1f} MiB, over "
                    f"limits.disk_mb={self.bundle.limits.disk_mb}")
        return None

    def finish(self, explanation: str, failure: str | None = None):
        """Verify the submission on pristine tests and compose the reward (see module doc)."""
        from sandboxes.verifiers import compose_reward

        b = self.bundle
        self.explanation = explanation
        t0 = time.monotonic()
        infra = self.infra_errors[0] if self.infra_errors else None
        before = after = None
        notes: tuple[str, ...] = ()
        self.final_outcomes = None
        failure = failure or self._over_quota()
        if failure is None and infra is None:
            try:
                self.patch = self.episode.diff()
            except Exception as e:  # noqa: BLE001 - a broken worktree is the harness's failure
                infra, self.patch = f"diff failed: {e}", ""
            if infra is None and len(self.patch.encode()) > b.limits.max_patch_kb * 1024:
                failure = (f"patch too large: {len(self.patch.encode()) // 1024} KiB, over "
                           f"limits.max_patch_kb={b.limits.max_patch_kb}")
        if failure is None and infra is None:
            from sandboxes.verify import verify
            ver = verify(self.runtime, b, self.episode, timeout=b.limits.verify_s)
            self.verification = ver
            infra = ver.infra_error
            self.final_outcomes = ver.outcomes
            notes = tuple(f"not in effect for verification: {p} ({why})" for p, why in ver.dropped)
            if ver.agent_fault:
                notes += (f"the verification run crashed on the submitted code: {ver.agent_fault[:300]}",)
            if infra is None:
                before, after = self._touched_files()
        self.sandbox_s += time.monotonic() - t0 + (self.verification.reused_s if self.verification else 0.0)
        self.reward = compose_reward(b, outcomes=self.final_outcomes, diff=self.patch,
                                     explanation=explanation, infra_error=infra, judge=self.judge,
                                     weights=self.weights, before=before, after=after,
                                     failure=failure, notes=notes)
        self.done = True
        return self.reward

    def _touched_files(self) -> tuple[dict, dict]:
        """Touched (and reference-fix) files at the pinned commit and as submitted, as text."""
        from sandboxes.verifiers.diffs import DiffError, touched_paths
        from sandboxes.verifiers.hygiene import reference_diff

        ep = self.episode
        changed = set(ep.changed_paths())
        ref = reference_diff(self.bundle)
        try:
            ref_paths = set(touched_paths(ref)) if ref else set()
        except DiffError:
            ref_paths = set()
        before, after = {}, {}
        for p in sorted(changed | ref_paths):
            old = ep.pristine_bytes(p)
            if old is not None:
                before[p] = old.decode("utf-8", "replace")
            if p not in changed:
                if old is not None:
                    after[p] = before[p]
                continue
            try:
                after[p] = ep.read_bytes(p).decode("utf-8", "replace")
            except (OSError, ValueError):
                pass                              # deleted, or a link out of the tree
        return before, after

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
