"""Pristine verification: run the task's required tests on the agent's code, and only its code.

The agent's worktree is never where the final tests run. A fresh episode starts from the pinned
commit, receives the agent's changes to unprotected files, then the task's `test_patch` (if
any), and runs FAIL_TO_PASS + PASS_TO_PASS there, in a new namespace and a new pytest worker.
Protected paths keep the task's version whatever the agent did to them:

* the task's forbidden paths (tests, test data, test configuration, CI),
* pytest's own files in any folder (`pytest_owned`: pytest.ini, pytest.toml, .pytest.toml,
  conftest.py, pytest_*.py), forbidden by rule, and the other test configuration
  (`TEST_CONFIG`, `is_test_config`: setup.cfg, pyproject.toml, tox.ini, sitecustomize, .pth
  files, entry-point plugins in *.dist-info / *.egg-info),
* the files that hold the required tests and every path the task's `test_patch` touches,
* new top-level modules that would shadow the standard library or an installed package
  (`json.py`, `pytest.py`, `fractions.py`): they could replace what the tests import.

So nothing the agent writes changes which tests run or how; it can only change the code under
test. What was left out is reported (`Verification.dropped`) and shown in the reward reasons.

Who judges (`Verification.verdict`): for the built-in HumanEval tasks, the data verdict
(`sandboxes.verdict`): the sandbox holds no test, the agent's module answers calls with data and
a judge process on the host, which never ran the agent's code, runs the task's tests on those
values. Every other task runs its own suite under pytest, with the task's own configuration
passed by `-c` (`sandboxes.pytest_config`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from sandboxes.bundle import TEST_CONFIG, is_test_config, pytest_owned


@dataclass
class Verification:
    outcomes: dict[str, str] | None          # None when the harness failed (infra_error set)
    infra_error: str | None = None
    agent_fault: str | None = None           # the verification run crashed on the agent's code
    timed_out: bool = False
    carried: list[str] = field(default_factory=list)        # agent changes the tests ran against
    dropped: list[tuple[str, str]] = field(default_factory=list)   # (path, why it was left out)
    duration_s: float = 0.0
    output: str = ""
    reused_s: float = 0.0     # seconds its test run took when made, if a stored answer was reused
    verdict: str = "pytest"   # "data": judged out of the agent's process (`sandboxes.verdict`)


def test_files(bundle) -> set[str]:
    return {t.split("::", 1)[0] for t in (*bundle.fail_to_pass, *bundle.pass_to_pass)}


def protected_reason(path: str, bundle, patch_paths: set[str] = frozenset(),
                     in_task=lambda p: False) -> str | None:
    """Why `path` keeps the task's version during verification (None: the agent's counts).
    `in_task(path)` says whether the pinned commit has that file."""
    if any(fnmatchcase(path, g) for g in bundle.forbidden_paths):
        return "forbidden path"
    if pytest_owned(path):
        return "forbidden path"              # by rule, whatever the bundle's list says
    if any(fnmatchcase(path, g) for g in TEST_CONFIG) or is_test_config(path):
        return "test configuration"
    if path in test_files(bundle) or path in patch_paths:
        return "holds the task's tests"
    top, _, rest = path.partition("/")
    mod = (top[:-3] if top.endswith(".py") else None) if not rest else top
    if mod and mod in shadowable_modules():
        # only a module the agent added: the repository's own package of that name is its code
        own = in_task(path) or (rest and (in_task(f"{top}/__init__.py") or in_task(f"{top}.py")))
        if not own:
            return f"shadows the installed module {mod!r}"
    return None


_SHADOW: set[str] | None = None


def shadowable_modules() -> set[str]:
    """Top-level names the sandbox interpreter imports from outside the repository."""
    global _SHADOW
    if _SHADOW is None:
        from importlib.metadata import packages_distributions
        names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
        try:
            names |= {n for n in packages_distributions() if n.isidentifier()}
        except Exception:  # noqa: BLE001 - metadata of one broken dist must not stop verification
            pass
        names |= {"pytest", "_pytest", "py", "pluggy", "conftest"}
        _SHADOW = names
    return _SHADOW


def verify(runtime, bundle, episode, *, timeout: float | None = None) -> Verification:
    """Run the required tests on a pristine copy of the task plus the agent's allowed changes."""
    import time

    from sandboxes.runtime import PathEscape
    from sandboxes.verifiers.diffs import DiffError, touched_paths

    t0 = time.monotonic()
    try:
        patch_paths = set(touched_paths(bundle.test_patch)) if bundle.test_patch else set()
    except DiffError as e:
        return Verification(None, f"the task's test_patch is malformed: {e}")
    from sandboxes.verdict import carried, plan_for
    data = plan_for(bundle)
    if data is not None and not hasattr(episode, "spawn_callee"):
        data = None                 # a runtime of your own without a callee: pytest judges
    ver = Verification(None, verdict="data" if data else "pytest")
    try:
        changed = episode.changed_paths()
    except Exception as e:  # noqa: BLE001 - the host could not read the worktree: harness fault
        return Verification(None, f"could not list the episode's changes: {e}")
    plan: list[tuple[str, bytes | None]] = []
    for path in changed:
        why = protected_reason(path, bundle, patch_paths,
                               in_task=lambda p: episode.pristine_bytes(p) is not None)
        if not why and data is not None:
            why = carried(path)
        if why:
            ver.dropped.append((path, why))
            continue
        try:
            plan.append((path, episode.read_bytes(path)))
        except FileNotFoundError:
            plan.append((path, None))                       # the agent deleted it
        except (PathEscape, IsADirectoryError, NotADirectoryError) as e:
            ver.dropped.append((path, f"not a file inside the repository ({e})"))
    key = cache = None
    if data is not None:
        cache, key = _data_cache_key(runtime, bundle, episode, plan, timeout or bundle.limits.verify_s)
        if key is not None:
            resp = cache.get(key, wait_s=(timeout or bundle.limits.verify_s) + 30)
            if resp is not None:        # the same files judged before: no sandbox is started
                ver.carried = [p for p, _ in plan]
                ver.outcomes, ver.output = dict(resp["outcomes"]), resp.get("output", "")
                ver.reused_s, ver.duration_s = float(resp.get("made_s") or 0.0), time.monotonic() - t0
                return ver
    try:
        return _verify_in_sandbox(runtime, bundle, data, plan, ver, timeout, t0, cache, key)
    finally:
        if key is not None and ver.outcomes is None:
            cache.done(key, None)       # not stored: wake anyone waiting for it


def _data_cache_key(runtime, bundle, episode, plan, timeout):
    """(the runtime's test-result cache, the key of this data verdict) or (None, None). The key
    is a function of the task, the judge's code and exactly the files carried in: a fresh
    sandbox judges them, so the same files are the same verdict (`sandboxes.result_cache`)."""
    import hashlib
    cache = getattr(runtime, "test_cache", None)
    if cache is None or getattr(runtime, "isolation", None) != "bwrap":
        return None, None
    from sandboxes.result_cache import chain, start
    from sandboxes.verdict import judge_script
    files = [(p, None if c is None else hashlib.sha256(c).hexdigest()) for p, c in plan]
    return cache, chain(start(bundle, episode.commit, judge_script(runtime), "bwrap"), "data-verdict",
                        files, timeout)


def _verify_in_sandbox(runtime, bundle, data, plan, ver, timeout, t0, cache, key) -> Verification:
    import time

    from sandboxes.verdict import sandbox_bundle
    with runtime.episode(bundle if data is None else sandbox_bundle(bundle, data)) as v:
        for path, content in plan:
            try:
                if content is None:
                    v.delete_file(path)
                else:
                    v.write_bytes(path, content)
                ver.carried.append(path)
            except FileNotFoundError:
                ver.carried.append(path)
            except (OSError, ValueError) as e:
                ver.dropped.append((path, f"could not be carried over: {e}"))
        if data is not None:
            from sandboxes.verdict import judge
            rep = judge(runtime, v, bundle, data, timeout or bundle.limits.verify_s)
            ver.duration_s = time.monotonic() - t0
            ver.output, ver.timed_out, ver.agent_fault = rep.output, rep.timed_out, rep.agent_fault
            ver.infra_error = rep.infra_error
            ver.outcomes = None if rep.infra_error else dict(rep.outcomes)
            if key is not None:         # only a verdict that says nothing about timing or a crash
                keep = not (rep.infra_error or rep.timed_out or rep.agent_fault)
                cache.done(key, {"outcomes": ver.outcomes, "output": ver.output,
                                 "made_s": rep.duration_s} if keep else None)
            return ver
        if bundle.test_patch:
            r = v.apply_patch(bundle.test_patch)
            if r.infra_error or r.returncode != 0:
                ver.infra_error = (f"the task's test_patch does not apply to the pinned commit: "
                                   f"{r.infra_error or r.stderr.strip()[:300]}")
                return ver
        ids = list(bundle.fail_to_pass) + list(bundle.pass_to_pass)
        # one run in this sandbox: a runtime that can skip the worker's warm-up is told so
        import inspect
        once = {"warm": False} if "warm" in inspect.signature(v.run_tests).parameters else {}
        rep = v.run_tests(ids, timeout=timeout or bundle.limits.verify_s, **once)
        ver.reused_s = getattr(v, "reused_s", 0.0)
    ver.duration_s = time.monotonic() - t0
    ver.output, ver.timed_out, ver.agent_fault = rep.output, rep.timed_out, rep.agent_fault
    if rep.infra_error:
        ver.infra_error = rep.infra_error
    else:
        ver.outcomes = dict(rep.outcomes)
    return ver
