"""The data verdict: the built-in tasks' tests judged in a process the agent's code never ran in.

For a HumanEval repair task (`plan_for` recognises one) the pristine verification does not run
pytest in the sandbox. It starts a sandbox whose tree is the task's without its test file (so
neither the worktree nor the snapshot's git history holds it), carries the agent's Python
sources into it, and runs two processes (`sandboxes.verdict_worker`):

* the callee, in that sandbox, imports the agent's module and answers each call with data;
* the judge, an isolated interpreter on the host (`python -I -S`, rlimits), runs the task's test
  functions against a module built from the task's own file whose functions under test are
  proxies to the callee, decodes every answer strictly (builtin types only) and returns the
  outcomes.

So a pass can only come from values that equal the expected ones as builtin data: an object
whose `__eq__` lies fails (it is not data), code that reads its caller's stack or the assert's
text finds no test (the callee never sees one), and patching pytest or forging its reports
changes nothing (no pytest runs). The outcomes have the same shape as a pytest run's
(`test_solution.py::test_check_03` -> passed / failed / error), so the reward is composed as
before. Per-test CPU (`limits.test_cpu_s`) is enforced in the callee per call; the run's wall
clock (`verify_s`) by the judge; a callee that dies is the agent's failure unless the runtime's
health probe fails too.

    plan = plan_for(bundle)            # None: the task's tests run under pytest (`sandboxes.verify`)
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

_SCRIPT = str(Path(__file__).with_name("verdict_worker.py"))
JUDGE_MEMORY_MB = 2048


@dataclass(frozen=True)
class DataPlan:
    module: str                     # the module under test, as the tests import it ("solution")
    source_path: str                # its file ("solution.py")
    functions: tuple[str, ...]      # the functions under test (the task's entry point)
    test_path: str                  # the test file ("test_solution.py")
    test_names: tuple[str, ...]     # the required tests, in file order

    def node_id(self, name: str) -> str:
        return f"{self.test_path}::{name}"


def plan_for(bundle) -> DataPlan | None:
    """The data-verdict plan of a HumanEval repair task (inline `solution.py` + generated
    `test_solution.py`, no test_patch, every required id a test function of that file), else None."""
    from sandboxes.humaneval.build import ENVIRONMENT_ID
    from sandboxes.humaneval.testgen import SOLUTION_FILE, TEST_FILE
    meta = bundle.metadata or {}
    fn = meta.get("entry_point")
    files = bundle.files or {}
    if (bundle.environment_id != ENVIRONMENT_ID or bundle.test_patch or not fn
            or SOLUTION_FILE not in files or TEST_FILE not in files):
        return None
    ids = (*bundle.fail_to_pass, *bundle.pass_to_pass)
    names = {i.split("::", 1)[1] for i in ids if i.startswith(TEST_FILE + "::")}
    if not ids or len(names) != len(set(ids)) or any("::" in n or "[" in n for n in names):
        return None
    try:
        tree = ast.parse(files[TEST_FILE])
    except SyntaxError:
        return None
    order = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    if set(order) != names:
        return None
    return DataPlan(SOLUTION_FILE[:-3], SOLUTION_FILE, (fn,), TEST_FILE, tuple(order))


def sandbox_bundle(bundle, plan: DataPlan):
    """The task without its test file: the tree the callee's sandbox is made from."""
    return replace(bundle, files={p: t for p, t in bundle.files.items() if p != plan.test_path})


def carried(path: str) -> str | None:
    """Why an agent change is not carried into the callee's sandbox (None: it is): only Python
    sources are code under test; a data file could only hold answers."""
    return None if path.endswith(".py") else "not a source file of this task"


@dataclass
class DataReport:
    outcomes: dict[str, str]
    infra_error: str | None = None
    agent_fault: str | None = None
    timed_out: bool = False
    output: str = ""
    duration_s: float = 0.0


def judge_script(runtime) -> str:
    """The judge's copy of `verdict_worker.py`: the runtime's frozen one when it has one."""
    return getattr(runtime, "verdict_worker", None) or _SCRIPT


def _limits(timeout: float):
    import resource

    def fn():
        resource.setrlimit(resource.RLIMIT_AS, (JUDGE_MEMORY_MB << 20, JUDGE_MEMORY_MB << 20))
        cpu = int(timeout) + 30
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return fn


def _start_callee(episode, plan: DataPlan, start_timeout: float = 30.0):
    """(the callee process, None) once it says it started, or (None, why not)."""
    from sandboxes.attribution import stop_process
    from sandboxes.worker_client import read_json_line
    last = None
    for attempt in (0, 1):
        if attempt:
            clear = getattr(episode, "_clear_uid", None)
            if clear:
                clear()
        try:
            proc = episode.spawn_callee(plan.module)
        except OSError as e:
            last = f"spawn failed: {e}"
            continue
        first, rest = read_json_line(proc.stdout.fileno(), b"", start_timeout)
        if first and first.get("started") and not rest:
            return proc, None
        stop_process(proc)
        last = f"it did not start ({first})"
    return None, f"the sandbox for the data verdict did not start: {last}"


def callee_probe(runtime) -> str | None:
    """None when a fresh sandbox of this runtime runs a callee on a harness-owned module and it
    answers a call correctly; otherwise why not (`sandboxes.attribution`'s rule, for the callee)."""
    from sandboxes.attribution import stop_process
    from sandboxes.bundle import TaskBundle
    from sandboxes.worker_client import read_json_line
    b = TaskBundle(task_id="ratchet-callee-probe", files={"ratchet_probe.py": "def f(x):\n    return x + 1\n"})
    plan = DataPlan("ratchet_probe", "ratchet_probe.py", ("f",), "", ())
    try:
        with runtime.episode(b) as ep:
            proc, err = _start_callee(ep, plan)
            if proc is None:
                return err
            try:
                proc.stdin.write(b'{"op": "call", "fn": "f", "args": [41], "kwargs": {"$d": []}}\n')
                proc.stdin.flush()
                reply, _ = read_json_line(proc.stdout.fileno(), b"", 30.0)
            finally:
                stop_process(proc)
            if not reply or reply.get("value") != 42:
                return f"the probe callee answered {reply!r}"
    except Exception as e:  # noqa: BLE001 - any failure to build a sandbox is the harness's
        return f"the probe could not start a sandbox: {type(e).__name__}: {e}"
    return None


def judge(runtime, episode, bundle, plan: DataPlan, timeout: float) -> DataReport:
    """Run the plan's tests: the callee in `episode` (a sandbox of `sandbox_bundle`), the judge here."""
    from sandboxes.attribution import stop_process
    t0 = time.monotonic()
    ids = [plan.node_id(n) for n in plan.test_names]
    proc, err = _start_callee(episode, plan)
    if proc is None:
        return DataReport({}, infra_error=err, duration_s=time.monotonic() - t0)
    job = {"solution": {"module": plan.module, "path": plan.source_path,
                        "source": bundle.files[plan.source_path]},
           "functions": list(plan.functions),
           "tests": {"module": plan.test_path[:-3].replace("/", "."), "path": plan.test_path,
                     "source": bundle.files[plan.test_path], "names": list(plan.test_names)},
           "test_cpu_s": bundle.limits.test_cpu_s, "timeout": timeout}
    to_fd, from_fd = proc.stdin.fileno(), proc.stdout.fileno()
    with tempfile.TemporaryDirectory(prefix="ratchet-judge-") as tmp:
        err_path = os.path.join(tmp, "judge.stderr")
        try:
            with open(err_path, "wb") as err_file:
                j = subprocess.Popen(
                    [sys.executable, "-I", "-S", judge_script(runtime), "--judge", "--to", str(to_fd),
                     "--from", str(from_fd)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err_file, cwd=tmp,
                    env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"},
                    pass_fds=(to_fd, from_fd), preexec_fn=_limits(timeout), start_new_session=True)
                try:
                    out, _ = j.communicate((json.dumps(job) + "\n").encode(), timeout=timeout + 20)
                except subprocess.TimeoutExpired:
                    stop_process(j)
                    out = b""
        finally:
            stop_process(proc)
        try:
            res = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            with open(err_path, "rb") as f:
                tail = f.read()[-1500:].decode("utf-8", "replace").strip()
            if j.returncode is not None and j.returncode < 0:
                # killed by its own limits: the values the code returned made the tests run away
                return DataReport({i: "error" for i in ids}, agent_fault=(
                    f"the judge ran out of time or memory on the values the code returned "
                    f"(signal {-j.returncode})"), duration_s=time.monotonic() - t0)
            return DataReport({}, infra_error=f"the data-verdict judge failed: {tail or j.returncode}",
                              duration_s=time.monotonic() - t0)
    outcomes = {plan.node_id(n): o for n, o in res["outcomes"].items()}
    msgs = [f"{plan.node_id(n)}: {m}" for n, m in res.get("messages", {}).items()]
    rep = DataReport(outcomes, timed_out=bool(res.get("timed_out")), output="\n".join(msgs)[-8000:],
                     duration_s=time.monotonic() - t0)
    fault = res.get("fault")
    if fault:
        rep.agent_fault = fault
        if fault.startswith("the process under test"):
            bad = callee_probe(runtime)         # a dead callee: the code's doing, unless the harness is broken
            if bad is not None:
                return DataReport({}, infra_error=f"the data-verdict callee died ({fault}); health probe: {bad}",
                                  duration_s=time.monotonic() - t0)
    return rep
