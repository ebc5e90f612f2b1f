"""kill -9 of an ingest leaves no process behind: its spawned workers (and through them the
multiprocessing resource tracker) end with it, instead of living on parented to PID 1."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ratchet.synth import write_jsonl

# An ingest that takes the parallel path on a small file and, once its workers have returned a
# first range, stops in the parent: killed there, its workers are idle on their queue, the case
# that used to outlive the ingest indefinitely.
CHILD = r"""
import sys, time
from pathlib import Path
import ratchet.ingest as ing
import ratchet.ingest_ranges as rg
from ratchet.warehouse import Warehouse
ing.PARALLEL_MIN_BYTES = 1
rg.RANGE_BYTES = 32 << 10
real = ing.parallel_ranges
def held(*args, **kwargs):
    it = real(*args, **kwargs)
    first = next(it)
    print("READY", flush=True)
    time.sleep(300)
    yield first
    yield from it
ing.parallel_ranges = held
ing.ingest([sys.argv[2]], Warehouse(Path(sys.argv[1]) / "warehouse.duckdb"), ing.IngestOptions(workers=2))
"""


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process, None once it is gone (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(rest[1]), rest[0]) if rest[0] not in ("Z", "X") else None


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            children.setdefault(st[0], []).append(int(name))
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def test_kill_9_of_an_ingest_leaves_no_worker_running(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", 400)
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "home"), str(tmp_path / "a.jsonl")],
                         stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    kids: set[int] = set()
    try:
        assert p.stdout.readline().strip() == "READY"
        kids = _descendants(p.pid)
        assert len(kids) >= 2, kids                     # the two workers (and the resource tracker)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_stat(k) for k in kids):
            time.sleep(0.2)
        alive = {k: open(f"/proc/{k}/cmdline").read().replace("\0", " ")[:120] for k in kids if _stat(k)}
        assert not alive, f"processes outlived the killed ingest: {alive}"
    finally:
        p.kill()
        for k in kids:                                  # never leave them behind, even when the test fails
            if _stat(k):
                os.kill(k, signal.SIGKILL)
