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
equivalent and decides everything else with the budget.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import types

MEMORY_LIMIT = 1 << 30


class _Timeout(BaseException):
    """BaseException so that a bare `except Exception` in a mutant cannot swallow it."""


def _alarm(signum, frame):
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
                  line_budget: int | None) -> dict:
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
    signal.signal(signal.SIGALRM, _alarm)
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
        signal.setitimer(signal.ITIMER_REAL, per_test_s)
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
            signal.setitimer(signal.ITIMER_REAL, 0)
        if outcomes[name] == "failed" and actual is None and name in examples:
            actual = _observe(ns, examples[name], per_test_s, name)
    return {"outcomes": outcomes, "errors": errors, "actual": actual}


def _observe(ns: dict, example: list, per_test_s: float, name: str) -> dict | None:
    """What the buggy function returns for the failing example (quoted in the issue)."""
    signal.setitimer(signal.ITIMER_REAL, per_test_s)
    try:
        value = eval(example[0], dict(ns))  # noqa: S307 - our own generated call text
        got = repr(value)[:300]
    except _Timeout:
        return None
    except BaseException as exc:  # noqa: BLE001
        got = f"raises {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {"test": name, "call": example[0], "expected": example[1], "got": got}


def run_program(solution: str, tests: str, names: list[str], *, examples: dict | None = None,
                per_test_s: float = 1.0, total_s: float = 20.0, line_budget: int | None = None) -> dict:
    """Run every test of `tests` against `solution` in a forked child.

    Returns {"status": "ok" | "timeout" | "crash", "outcomes": {name: "passed"|"failed"|"timeout"},
    "errors": {...}, "actual": {...} | None, "seconds": float}.
    """
    r, w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            result = _run_in_child(solution, tests, names, examples or {}, per_test_s, line_budget)
            payload = json.dumps(result).encode()
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
    chunks, deadline = [], start + total_s
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
    os.waitpid(pid, 0)
    seconds = time.monotonic() - start
    try:
        result = json.loads(b"".join(chunks))
    except ValueError:
        return {"status": "crash", "outcomes": {}, "errors": {}, "actual": None, "seconds": seconds}
    timed_out = "timeout" in result["outcomes"].values()
    result["status"] = "timeout" if timed_out else "ok"
    result["seconds"] = seconds
    return result
