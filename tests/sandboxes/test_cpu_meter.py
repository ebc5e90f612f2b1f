"""sandboxes.cpu_meter: the CPU a test burns inside a sandbox is counted by `tree_cpu_s`, with and
without the zygote. Before it, training's CPU seconds came from getrusage alone, which never saw
a test run's process: it dies with the sandbox unwaited-for (or is reaped by the zygote)."""
import resource

import pytest

from sandboxes import zygote
from sandboxes.bundle import Limits, TaskBundle
from sandboxes.cpu_meter import descendants_s, tree_cpu_s

pytestmark = pytest.mark.security

BURN_S = 0.8
BURN = ("import time\n\n\ndef test_burn():\n    t = time.process_time()\n"
        f"    while time.process_time() - t < {BURN_S}:\n        pass\n")
ID = "test_burn.py::test_burn"


def _bundle() -> TaskBundle:
    return TaskBundle(task_id="t-burn", files={"solution.py": "X = 1\n", "test_burn.py": BURN},
                      pass_to_pass=(ID,), limits=Limits(wall_s=30.0, cpu_s=30, test_cpu_s=10))


def _rusage_s() -> float:
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.mark.parametrize("use_zygote", [True, False], ids=["zygote", "started"])
def test_cpu_burnt_by_a_sandboxed_test_is_counted(runtime, monkeypatch, use_zygote):
    monkeypatch.setenv("RATCHET_ZYGOTE", "1" if use_zygote else "0")
    if use_zygote and not zygote.enabled(runtime.isolation):
        pytest.skip("the zygote needs bwrap as root")
    runs = 2
    c0, r0 = tree_cpu_s(), _rusage_s()
    for _ in range(runs):               # a fresh sandbox each time: each one torn down with its worker
        with runtime.episode(_bundle()) as ep:
            rep = ep.run_tests()
            assert rep.infra_error is None and rep.outcomes == {ID: "passed"}, rep.output[-2000:]
    spent, seen_by_rusage = tree_cpu_s() - c0, _rusage_s() - r0
    assert spent >= runs * BURN_S, (spent, seen_by_rusage)
    # what the old measure (getrusage alone) saw: the burn went missing
    assert seen_by_rusage < runs * BURN_S, seen_by_rusage


def test_descendants_count_the_processes_under_a_pid_only():
    import subprocess

    p = subprocess.Popen(["sleep", "5"])
    busy = subprocess.Popen(["sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5"])
    try:
        assert descendants_s(p.pid) == 0.0             # no children
        import time
        time.sleep(1.0)
        assert descendants_s(busy.pid) == 0.0          # its own loop is not under it
    finally:
        busy.kill()
        busy.wait()
        p.kill()
        p.wait()
