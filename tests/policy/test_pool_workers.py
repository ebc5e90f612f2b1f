"""Pool workers exit when the process that started them is killed (ratchet.pool_workers): a
SIGKILLed trainer or evaluation leaves no worker running its chunk of episodes."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.training

PARENT = textwrap.dedent("""\
    import multiprocessing as mp, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from INIT_MODULE import INIT_NAME as init

    def pid(_):
        return os.getpid()

    if __name__ == "__main__":
        pool = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"), initializer=init, initargs=INIT_ARGS)
        pids = sorted(set(pool.map(pid, range(8), chunksize=1)))
        print(" ".join(map(str, pids)), flush=True)
        time.sleep(600)
    """)


@pytest.mark.parametrize("module,name,args", [
    ("ratchet.policy.rollout_pool", "_init", "({},)"),
    ("ratchet.evaluation.runner", "_init_pool_worker", "(None,)"),
], ids=["rollout_pool", "evaluation"])
def test_pool_workers_exit_when_their_parent_is_killed(tmp_path, runtime, module, name, args):
    # `runtime`: skips where the sandbox is unavailable (the evaluation worker starts one)
    script = tmp_path / "parent.py"
    script.write_text(PARENT.replace("INIT_MODULE", module).replace("INIT_NAME", name).replace("INIT_ARGS", args))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    marker = f"pool-workers-test-{os.getpid()}-{time.monotonic_ns()}"
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": root, "RATCHET_TEST_MARKER": marker})
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    # every process the parent started, also one still in its initializer when the parent died
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _marked(marker):
        time.sleep(0.2)
    assert not _marked(marker), "pool workers outlived their killed parent"


def _marked(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and _alive(int(d)) and f"RATCHET_TEST_MARKER={marker}".encode() in \
                    open(f"/proc/{d}/environ", "rb").read().split(b"\0"):
                out.append(int(d))
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_interrupt_stops_the_evaluation_pool_without_waiting_for_running_jobs():
    """KeyboardInterrupt in the evaluating process (here: raised by the sink on the first row)
    ends `_each` at once and kills the workers that were still in their jobs; before, the
    executor's shutdown(wait=True) first let every running job (minutes of episodes) finish."""
    from ratchet.evaluation.runner import _each

    seen, before, kids = [], set(_children(os.getpid())), []

    def take(result):
        seen.append(result)
        kids.extend(set(_children(os.getpid())) - before)     # this pool's workers (other tests' stay)
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _each(time.sleep, [0.1, 60, 60, 60], 2, take)
    assert time.monotonic() - t0 < 30 and seen == [None] and kids
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in kids):
        time.sleep(0.2)
    left = [p for p in kids if _alive(p)]
    assert not left, [(p, open(f"/proc/{p}/cmdline").read()[:200], _env(p, "PYTEST_CURRENT_TEST")) for p in left]


def _env(pid: int, key: str) -> str:
    try:
        for kv in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
            if kv.startswith(key.encode() + b"="):
                return kv.decode(errors="replace")
    except OSError:
        pass
    return ""


def _children(pid: int) -> list[int]:
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/children") as f:
            out += [int(x) for x in f.read().split()]
    return [p for p in out if "spawn_main" in open(f"/proc/{p}/cmdline").read()]   # not the resource tracker
