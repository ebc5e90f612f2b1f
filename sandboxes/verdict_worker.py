"""The data verdict's two processes: the callee (in the sandbox) and the judge (on the host).

The built-in HumanEval tasks are not judged by pytest running in the agent's process. Instead
(`sandboxes.verdict` starts both):

* the **callee** (`--callee`, inside the verification sandbox, whose tree holds the agent's code
  and no test file, not even in its git history) imports the task's module and, for each request
  `{"op": "call", "fn": name, "args": [...], "kwargs": {...}, "cpu_s": 2.0}`, calls the function
  and answers with DATA: `{"value": ...}` (the return value, serialised), `{"raised": {"type",
  "msg"}}`, `{"timeout": true}` (the per-test CPU limit, ITIMER_PROF) or `{"import_error": ...}`;
* the **judge** (`--judge`, a separate interpreter on the host, started isolated with `-I -S`, in
  which the agent's code never runs) executes the task's own tests: the test module as written,
  with the module under test replaced by one built from the task's own file in which each
  function under test is a proxy that sends the call's arguments to the callee and decodes the
  answer. Decoding is strict: only None, bool, int, float, complex, str, bytes, list, tuple,
  dict, set and frozenset of exactly those types cross, so `==` in a test compares builtin
  values. An object the callee cannot serialise (an `__eq__` that lies, a generator, a custom
  class) fails the test that received it. Nothing the callee sends is ever executed.

The callee never sees an expected value (only the arguments of each call), so code that reads its
caller's stack, frame locals or assert text finds no test there, and code that patches a test
framework has none to patch. Names of the module other than the functions under test (helpers
the tests call, such as `poly` or `encode_cyclic`) come from the task's own file, not the agent's.

One file, standard library only: the sandbox mounts it alone (bwrap: /.ratchet; Docker: the same
path) and the image's own interpreter runs it. Protocol: one JSON object per line both ways; the
callee's first line is `{"started": true}`, written before it imports anything of the task.
"""
from __future__ import annotations

import base64
import json
import math
import os
import select
import signal
import sys
import time

MAX_REPLY = 16 * 1024 * 1024      # bytes of one answer; more is not a value the tests can use
MAX_DEPTH = 200


class NotData(Exception):
    """A value that is not plain data (or an answer that does not decode to any)."""


# ----------------------------------------------------------------------------- codec
def encode(v, depth: int = 0):
    """A JSON-able tagged form of plain data; NotData for anything else (exact types only: a
    subclass of int is not an int)."""
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if -(1 << 53) < v < (1 << 53) else {"$i": hex(v)}
    if t is float:
        return v if math.isfinite(v) else {"$f": repr(v)}
    if depth > MAX_DEPTH:
        raise NotData("nested too deep")
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"$t": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"$d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is set or t is frozenset:
        return {"$s" if t is set else "$S": [encode(x, depth + 1) for x in v]}
    if t is bytes:
        return {"$b": base64.b64encode(v).decode()}
    if t is complex:
        return {"$c": [encode(v.real), encode(v.imag)]}
    raise NotData(f"an object of type {t.__name__[:80]}")


def _float(x) -> float:
    if type(x) is float or type(x) is int:
        return float(x)
    if type(x) is dict and set(x) == {"$f"} and x["$f"] in ("nan", "inf", "-inf"):
        return float(x["$f"])
    raise NotData("not a float")


def decode(x, depth: int = 0):
    """The inverse of `encode`, strict: anything that is not exactly its output is NotData."""
    t = type(x)
    if x is None or t is bool or t is str or t is int or t is float:
        return x
    if depth > MAX_DEPTH:
        raise NotData("nested too deep")
    if t is list:
        return [decode(e, depth + 1) for e in x]
    if t is not dict or len(x) != 1:
        raise NotData("not an encoded value")
    (tag, val), = x.items()
    if tag == "$i" and type(val) is str:
        return int(val, 16)
    if tag == "$f":
        return _float(x)
    if tag in ("$t", "$s", "$S") and type(val) is list:
        items = [decode(e, depth + 1) for e in val]
        return tuple(items) if tag == "$t" else set(items) if tag == "$s" else frozenset(items)
    if tag == "$d" and type(val) is list and all(type(p) is list and len(p) == 2 for p in val):
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in val}
    if tag == "$b" and type(val) is str:
        return base64.b64decode(val, validate=True)
    if tag == "$c" and type(val) is list and len(val) == 2:
        return complex(_float(val[0]), _float(val[1]))
    raise NotData(f"unknown tag {str(tag)[:20]!r}")


def _strict_json(line: bytes):
    def no_constant(name):
        raise NotData(f"bare {name}")
    return json.loads(line, parse_constant=no_constant)


# ----------------------------------------------------------------------------- callee (sandbox)
class _CallTimeout(BaseException):
    """The call used its CPU seconds. A BaseException: `except Exception` cannot swallow it, and
    the timer repeats for code that catches it anyway."""


def _callee(root: str, module: str, sites=()) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                      # the code's prints never reach the protocol stream
    proto.write(json.dumps({"started": True}) + "\n")
    sys.dont_write_bytecode = True
    os.chdir(root)
    sys.path.insert(0, root)
    sys.path.extend(p for p in sites if p not in sys.path)     # started with -S: packages by hand
    armed = [False]

    def fire(signum, frame):
        if armed[0]:
            raise _CallTimeout()
    signal.signal(signal.SIGPROF, fire)
    mod, import_error = None, None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            cpu = req.get("cpu_s")
        except ValueError:
            continue
        t0 = time.process_time()
        reply: dict = {}
        try:
            if cpu:
                armed[0] = True
                signal.setitimer(signal.ITIMER_PROF, max(float(cpu), 1e-3), 0.05)
            try:
                if mod is None and import_error is None:
                    try:
                        import importlib
                        mod = importlib.import_module(module)
                    except _CallTimeout:
                        raise
                    except BaseException as e:  # noqa: BLE001 - a module that fails to import
                        import_error = f"{type(e).__name__}: {str(e)[:500]}"
                if import_error is not None:
                    reply = {"import_error": import_error}
                else:
                    fn = getattr(mod, str(req.get("fn")))
                    value = fn(*decode(req.get("args") or []), **decode(req.get("kwargs") or {"$d": []}))
                    armed[0] = False
                    signal.setitimer(signal.ITIMER_PROF, 0)
                    try:
                        reply = {"value": encode(value)}
                    except NotData as e:
                        reply = {"not_data": str(e)}
                    except RecursionError:
                        reply = {"not_data": "nested too deep"}
            finally:
                armed[0] = False
                signal.setitimer(signal.ITIMER_PROF, 0)
        except _CallTimeout:
            reply = {"timeout": True}
        except BaseException as e:  # noqa: BLE001 - what the code raised is its answer
            reply = {"raised": {"type": type(e).__name__[:80], "msg": str(e)[:500]}}
        reply["cpu"] = time.process_time() - t0
        proto.write(json.dumps(reply, allow_nan=False) + "\n")


# ----------------------------------------------------------------------------- judge (host)
class RemoteError(Exception):
    """The function under test raised (its type and message, as text)."""


class CallTimeout(Exception):
    """The function under test used more than the per-test CPU limit."""


class CalleeGone(Exception):
    """The callee died, hung past the run's deadline or answered garbage: the run stops."""


class _Channel:
    def __init__(self, to_fd: int, from_fd: int, deadline: float):
        self.to, self.fr, self.deadline, self.buf = to_fd, from_fd, deadline, b""
        self.cpu_left: float | None = None
        self.dead: str | None = None

    def _line(self) -> bytes:
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise CalleeGone("timed out")
            if not select.select([self.fr], [], [], left)[0]:
                continue
            chunk = os.read(self.fr, 1 << 20)
            if not chunk:
                raise CalleeGone("the process under test ended")
            self.buf += chunk
            if len(self.buf) > MAX_REPLY and b"\n" not in self.buf:
                raise CalleeGone(f"an answer longer than {MAX_REPLY} bytes")
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def call(self, fn: str, args, kwargs):
        if self.dead:
            raise CalleeGone(self.dead)
        try:
            req = {"op": "call", "fn": fn, "args": encode(list(args)), "kwargs": encode(dict(kwargs)),
                   "cpu_s": self.cpu_left}
        except NotData as e:
            raise NotData(f"the test passed {e}, which cannot cross to the code under test") from None
        data = (json.dumps(req, allow_nan=False) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.to, data):]
            line = self._line()
        except OSError as e:
            self.dead = f"the process under test ended ({e.strerror})"
            raise CalleeGone(self.dead) from None
        except CalleeGone as e:
            self.dead = str(e)
            raise
        try:
            reply = _strict_json(line)
        except (ValueError, NotData, RecursionError):
            self.dead = "the process under test answered something that is not a reply"
            raise CalleeGone(self.dead) from None
        if type(reply) is not dict:
            self.dead = "the process under test answered something that is not a reply"
            raise CalleeGone(self.dead)
        if self.cpu_left is not None and type(reply.get("cpu")) in (int, float):
            self.cpu_left = max(self.cpu_left - max(float(reply["cpu"]), 0.0), 1e-3)
        if reply.get("timeout"):
            raise CallTimeout("the function used more than the per-test CPU limit (it may loop forever)")
        if "import_error" in reply:
            raise RemoteError(f"the module does not import: {str(reply['import_error'])[:500]}")
        if "raised" in reply:
            r = reply["raised"] if type(reply["raised"]) is dict else {}
            raise RemoteError(f"{str(r.get('type'))[:80]}: {str(r.get('msg'))[:500]}")
        if "not_data" in reply:
            raise NotData(f"{fn} returned {str(reply['not_data'])[:200]}, which is not plain data")
        if "value" not in reply:
            raise NotData(f"{fn}: an answer without a value")
        try:
            return decode(reply["value"])
        except (NotData, ValueError, TypeError, OverflowError, RecursionError) as e:
            raise NotData(f"{fn} returned something that does not decode to plain data ({e})") from None


def _remote(channel: _Channel, fn: str):
    def call(*args, **kwargs):
        return channel.call(fn, args, kwargs)
    call.__name__ = call.__qualname__ = fn
    return call


def _judge(job: dict, to_fd: int, from_fd: int) -> dict:
    import types
    deadline = time.monotonic() + float(job["timeout"])
    ch = _Channel(to_fd, from_fd, deadline)
    sol, tests = job["solution"], job["tests"]
    mod = types.ModuleType(sol["module"])
    mod.__file__ = sol["path"]
    exec(compile(sol["source"], sol["path"], "exec"), mod.__dict__)   # noqa: S102 - the task's own file
    for fn in job["functions"]:
        setattr(mod, fn, _remote(ch, fn))
    sys.modules[sol["module"]] = mod
    tmod = types.ModuleType(tests["module"])
    tmod.__file__ = tests["path"]
    sys.modules[tests["module"]] = tmod
    exec(compile(tests["source"], tests["path"], "exec"), tmod.__dict__)  # noqa: S102 - the task's tests
    outcomes, messages, fault, timed_out = {}, {}, None, False
    for name in tests["names"]:
        if fault is not None:
            outcomes[name] = "error"
            continue
        ch.cpu_left = float(job["test_cpu_s"]) if job.get("test_cpu_s") else None
        try:
            getattr(tmod, name)()
            outcomes[name] = "passed"
        except CalleeGone as e:
            outcomes[name], fault = "failed", str(e)
            timed_out = str(e) == "timed out"
        except CallTimeout as e:
            outcomes[name], fault = "failed", f"{name} ran past the per-test CPU limit"
            messages[name] = str(e)
        except Exception as e:  # noqa: BLE001 - an assertion or any error is this test's failure
            outcomes[name] = "failed"
            messages[name] = f"{type(e).__name__}: {str(e)[:300]}"
    return {"outcomes": outcomes, "messages": messages, "fault": fault, "timed_out": timed_out}


def _judge_main(to_fd: int, from_fd: int) -> None:
    job = json.loads(sys.stdin.readline())
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                       # the tests' prints never reach the result stream
    res = _judge(job, to_fd, from_fd)
    out.write(json.dumps(res) + "\n")
    out.flush()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--callee", action="store_true")
    ap.add_argument("--judge", action="store_true")
    ap.add_argument("--root")
    ap.add_argument("--module")
    ap.add_argument("--to", type=int)
    ap.add_argument("--from", dest="from_fd", type=int)
    ap.add_argument("--site", action="append", default=[], help="a site-packages folder (with -S)")
    a = ap.parse_args()
    if a.callee:
        _callee(a.root, a.module, a.site)
    elif a.judge:
        _judge_main(a.to, a.from_fd)
    else:
        ap.error("--callee or --judge")
