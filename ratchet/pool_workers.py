"""Spawn-pool workers (the evaluation's, the GRPO rollouts'): they exit when the process that
started them dies, and `terminate_pool` stops them mid-job.

The evaluation's and the GRPO rollouts' spawn pools run jobs of minutes (a chunk of episodes). If
the parent is killed (SIGKILL, an OOM kill, a Dagster run worker torn down), a worker finished its
job before it noticed, and went on stepping sandboxes meanwhile (seen with `ratchet demo --full`).
PR_SET_PDEATHSIG is no fix here: it fires when the *thread* that forked the worker
ends, and the executors start workers from whichever thread submits first. A daemon thread that
polls the parent pid is cheap (one getppid a second) and exact: when it changes, the parent is gone,
and the worker exits at once (its sandboxes go with it: bwrap's --die-with-parent, and the
zygote exits on EOF of its socket).
"""
from __future__ import annotations

import os
import threading
import time


def exit_with_parent(interval: float = 1.0) -> None:
    """Call in a worker process (a pool initializer): exit when its parent dies. The parent's pid
    comes from multiprocessing's spawn data, not getppid(): a worker whose parent died before its
    initializer ran (spawn and imports take seconds) has already been re-parented."""
    import multiprocessing as mp

    proc = mp.parent_process()
    parent = proc.pid if proc is not None else os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(70)                    # EX_SOFTWARE: no cleanup that could block on the dead parent

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def terminate_pool(pool) -> None:
    """SIGKILL a ProcessPoolExecutor's workers and drop its queued jobs, without waiting for the
    running ones (`shutdown(wait=True)` lets each finish its chunk of episodes first: minutes, which
    is how Ctrl-C on `ratchet demo --full` seemed ignored). `_processes` is the executor's private
    map of its workers: the stdlib has no public way to stop a running job."""
    procs = list((getattr(pool, "_processes", None) or {}).values())    # shutdown() drops the map
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        try:
            # SIGKILL: a worker inherits an ignored SIGTERM through exec (a host process that set
            # SIG_IGN, as the full test suite's process had by then), and SIGTERM ran no cleanup
            # anyway; its sandboxes die with it (bwrap --die-with-parent, the zygote on EOF)
            p.kill()
        except (OSError, AttributeError):
            pass
