"""Build-time test runner for the HumanEval suite.

This is NOT the hermetic episode runtime (that is `sandboxes.runtime`). It runs *our own
canonical code and its planted mutants* while the suite is built, so speed matters more than
isolation: each program runs in a forked child (fresh module state, a per-test alarm, an address
space limit, stdout muted), which costs ~1 ms instead of a pytest start per mutant. The outcomes
are the same as pytest's for these files: every test is a plain function in one module.

Wall-clock limits alone make the build nondeterministic (a slow mutant passes or times out
depending on machine load), so `line_budget` gives a deterministic limit: it counts line events
executed in `solution.py` frames (sys.settrace, ~7x slower) and stops past the budget. The
builder uses the fast untraced run when it finishes well under the budget's wall-clock
equivalent and decides everything else with the budget, a timed-out untraced run included. Every
time limit counts the child's CPU seconds, not wall-clock: with wall-clock ones a loaded machine
timed out HumanEval/75's slower mutants (3 of them in 1 build of 3 beside a training run: another
seed-0 suite, another sha). CPU seconds still vary with the CPU, so a time limit is only a
backstop set far past any run that ends within the budget. Only a wall-clock backstop of
WALL_FACTOR x the CPU limit remains, for a child that waits.
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import sys
import time
import types

MEMORY_LIMIT = 1 << 30
# The wall-clock deadline is this many times the CPU limit: only a machine starving the child for
# 10x longer than its allowed work can still turn a result into a timeout.
WALL_FACTOR = 10


class _Timeout(BaseException):
    """BaseException so that a bare `except Exception` in a mutant cannot swallow it."""


def _alarm(signum, frame):  # SIGPROF (a test's CPU limit) or SIGXCPU (the run's)
    raise _Timeout()


def _install_budget(budget: int) -> None:
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] > budget:
                raise _Timeout()
        return local

    def on_call(frame, event, arg):
        return local if frame.f_code.co_filename == "solution.py" else None

    sys.settrace(on_call)


def _run_in_child(solution: str, tests: str, names: list[str], examples: dict, per_test_s: float,
                  line_budget: int | None, total_s: float) -> dict:
    import faulthandler
    import resource

    faulthandler.disable()  # a crash is reported as status "crash", not as a traceback on stderr
    # The cap is on top of what the parent already maps: an absolute RLIMIT_AS made the stack of a
    # deeply recursive mutant unable to grow inside a large parent (pytest with torch loaded), so
    # the same mutant segfaulted there but raised RecursionError from the CLI, and the suite
    # depended on who built it.
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY_LIMIT, mapped + MEMORY_LIMIT))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    # per-test and total limits in CPU seconds of this child, whatever the machine's load
    # (SIGPROF; RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL past the hard one)
    timer = signal.ITIMER_PROF
    signal.signal(signal.SIGPROF, _alarm)
    signal.signal(signal.SIGXCPU, _alarm)
    soft = math.ceil(total_s)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    sys.setrecursionlimit(3000)
    mod = types.ModuleType("solution")
    mod.__file__ = "solution.py"
    sys.modules["solution"] = mod
    exec(compile(solution, "solution.py", "exec"), mod.__dict__)
    ns: dict = {"__name__": "test_solution"}
    exec(compile(tests, "test_solution.py", "exec"), ns)
    if line_budget:
        _install_budget(line_budget)
    outcomes, errors, actual = {}, {}, None
    for name in names:
        signal.setitimer(timer, per_test_s)
        try:
            ns[name]()
            outcomes[name] = "passed"
        except _Timeout:
            outcomes[name] = "timeout"
            return {"outcomes": outcomes, "errors": errors, "actual": actual}
        except BaseException as exc:  # noqa: BLE001 - a mutant may raise anything
            outcomes[name] = "failed"
            errors[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            signal.setitimer(timer, 0)
        if outcomes[name] == "failed" and actual is None and name in examples:
            actual = _observe(ns, examples[name], per_test_s, name, timer)
    return {"outcomes": outcomes, "errors": errors, "actual": actual}


def _observe(ns: dict, example: list, per_test_s: float, name: str, timer: int) -> dict | None:
    """What the buggy function returns for the failing example (quoted in the issue)."""
    signal.setitimer(timer, per_test_s)
    try:
        value = eval(example[0], dict(ns))  # noqa: S307 - our own generated call text
        got = repr(value)[:300]
    except _Timeout:
        return None
    except BaseException as exc:  # noqa: BLE001
        got = f"raises {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(timer, 0)
    return {"test": name, "call": example[0], "expected": example[1], "got": got}


def run_program(solution: str, tests: str, names: list[str], *, examples: dict | None = None,
                per_test_s: float = 1.0, total_s: float = 20.0, line_budget: int | None = None) -> dict:
    """Run every test of `tests` against `solution` in a forked child.

    Returns {"status": "ok" | "timeout" | "crash", "outcomes": {name: "passed"|"failed"|"timeout"},
    "errors": {...}, "actual": {...} | None, "seconds": float (wall-clock)}. `per_test_s` and
    `total_s` are CPU seconds of the child (`total_s` rounded up to whole seconds: RLIMIT_CPU);
    a child still running after WALL_FACTOR x `total_s` of wall-clock is killed as a timeout.
    """
    r, w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            result = _run_in_child(solution, tests, names, examples or {}, per_test_s, line_budget, total_s)
            payload = json.dumps(result).encode()
        except _Timeout:  # a CPU limit hit outside a test (module code): the run timed out
            payload = json.dumps({"outcomes": {"<module>": "timeout"}, "errors": {}, "actual": None}).encode()
        except BaseException as exc:  # noqa: BLE001 - a broken module still reports
            payload = json.dumps({"outcomes": {}, "errors": {"<module>": repr(exc)[:300]},
                                  "actual": None}).encode()
        try:
            with os.fdopen(w, "wb") as fh:
                fh.write(payload)
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(w)
    chunks, deadline = [], start + total_s * WALL_FACTOR
    with os.fdopen(r, "rb") as fh:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fh], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"status": "timeout", "outcomes": {}, "errors": {}, "actual": None,
                        "seconds": time.monotonic() - start}
            chunk = os.read(fh.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, wstatus = os.waitpid(pid, 0)
    seconds = time.monotonic() - start
    try:
        result = json.loads(b"".join(chunks))
    except ValueError:
        # killed past RLIMIT_CPU's hard limit (a mutant that swallowed SIGXCPU's exception)
        killed = os.WIFSIGNALED(wstatus) and os.WTERMSIG(wstatus) in (signal.SIGKILL, signal.SIGXCPU)
        return {"status": "timeout" if killed else "crash", "outcomes": {}, "errors": {}, "actual": None, "seconds": seconds}
    timed_out = "timeout" in result["outcomes"].values()
    result["status"] = "timeout" if timed_out else "ok"
    result["seconds"] = seconds
    return result
