"""CPU seconds of this process and of every sandbox process it started, including the ones that
`getrusage(RUSAGE_CHILDREN)` never sees.

The kernel adds a process's CPU time to its parent's "children" totals only when the parent
waits for it. A sandbox is torn down with SIGKILL to bwrap's process group: bwrap, the init of
the sandbox's pid namespace and the pytest worker all die at once and nobody waits for the
worker, so its time never reaches this process; with the zygote (`sandboxes.zygote`) the worker
is reaped by the zygote, whose totals reach this process only when the zygote exits, and the
worker's last test-run child (reaped after its answer) dies with the worker unwaited. Measured
on 2 GRPO steps (32 episodes each, from an SFT checkpoint): `getrusage` saw 79.9 of the
machine's 119.3 busy CPU-s without the zygote and 79.7 of 89.8 with it.

So: `before_kill(pid)` is called right before a sandbox's process group is killed and adds the
CPU time of the live processes under it (each one's own time plus that of the children it has
already waited for), and under a zygote worker; `tree_cpu_s()` is this process + its waited-for children + those samples +
the live zygotes' totals (their own time and that of the workers they reaped) + what worker
processes of ours (`ratchet.policy.rollout_pool`) measured for themselves. It is what
training reports as CPU seconds (the economics stage prices them). Docker sandboxes run under
the Docker daemon, outside this process tree: their CPU is not in it.
"""
from __future__ import annotations

import os
import resource
import threading

_LOCK = threading.Lock()
_KILLED_S = 0.0                  # sampled right before a kill: time that would otherwise be lost
_TICK = os.sysconf("SC_CLK_TCK")


def _times(pid: int) -> float | None:
    """utime + stime + cutime + cstime of a process, in seconds (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(x) for x in fields[11:15]) / _TICK


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:       # a kernel without CONFIG_PROC_CHILDREN: scan every ppid
            return [p for p in _pids() if _ppid(p) == pid]
        except (OSError, ValueError):
            pass
    return out


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def descendants_s(pid: int) -> float:
    """CPU seconds of the live (or not yet reaped) processes under `pid`, not `pid` itself."""
    total, todo, seen = 0.0, _children(pid), set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _times(p) or 0.0
        todo += _children(p)
    return total


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def before_kill(pid: int, parent: int | None = None) -> None:
    """Record the CPU time of the processes under `pid` (a sandbox's bwrap or a process-group
    leader this process will reap itself) before they are killed without being waited for.
    `parent`: only if `pid` is still that process's child (not a reused pid)."""
    global _KILLED_S
    if parent is not None and _ppid(pid) != parent:
        return
    s = descendants_s(pid)
    if s:
        with _LOCK:
            _KILLED_S += s


def killed_s() -> float:
    return _KILLED_S


_REMOTE_S = 0.0                  # reported by worker processes this process has not reaped yet


def add_remote(seconds: float) -> None:
    """CPU a worker process of ours measured for itself (its `tree_cpu_s`): counted here until the
    worker is reaped; then `reaped(...)` takes back what reaping added to RUSAGE_CHILDREN."""
    global _REMOTE_S
    with _LOCK:
        _REMOTE_S += seconds


def children_s() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def reaped(children_before: float) -> None:
    """Workers were just reaped: their own and their reaped children's time moved into
    RUSAGE_CHILDREN (the increase since `children_before`), so it leaves the remote total."""
    global _REMOTE_S
    with _LOCK:
        _REMOTE_S = max(0.0, _REMOTE_S - max(0.0, children_s() - children_before))


def zygotes_s() -> float:
    """Own and reaped-workers' CPU seconds of this process's live zygotes."""
    from sandboxes import zygote
    return sum(zygote.live_cpu_s())


def tree_cpu_s() -> float:
    """CPU seconds of this process, its waited-for children, and the sandbox processes above."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + killed_s() + zygotes_s() + _REMOTE_S
