"""Ingest's worker processes: started only for an input large enough to pay for them (a spawned
worker costs ~0.5 s), and all gone when `ingest` returns (joined, not left to exit later)."""
import concurrent.futures
import os

import pytest

import ratchet.ingest as ing
import ratchet.ingest_ranges as rg
from ratchet.ingest import IngestOptions, ingest
from ratchet.synth import write_jsonl

from .test_no_orphans import _descendants


def _workers_alive(before: set[int]) -> list[int]:
    """Processes started under this one since `before`, but multiprocessing's resource tracker
    (one a process, kept for its life on purpose)."""
    alive = []
    for pid in _descendants(os.getpid()) - before:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"resource_tracker" in f.read():
                    continue
        except OSError:
            continue
        alive.append(pid)
    return alive


def test_a_small_input_starts_no_worker_pool(wh, tmp_path, monkeypatch):
    started = []

    class Recording(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, *a, **kw):
            started.append(a)
            super().__init__(*a, **kw)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Recording)
    write_jsonl(tmp_path / "small.jsonl", 20)
    s = ingest([tmp_path / "small.jsonl"], wh, IngestOptions(workers=4))
    assert s.accepted == 20 and started == []
    monkeypatch.setattr(ing, "PARALLEL_MIN_BYTES", 1)              # now "large": a pool of 4
    write_jsonl(tmp_path / "large.jsonl", 20)
    ingest([tmp_path / "large.jsonl"], wh, IngestOptions(workers=4))
    assert [a[0] for a in started] == [4]


def test_every_worker_has_ended_when_ingest_returns(wh, tmp_path, monkeypatch):
    monkeypatch.setattr(ing, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(rg, "RANGE_BYTES", 16 << 10)
    write_jsonl(tmp_path / "a.jsonl", 300)
    before = _descendants(os.getpid())
    s = ingest([tmp_path / "a.jsonl"], wh, IngestOptions(workers=2))
    assert s.accepted == 300
    assert _workers_alive(before) == []


# A pool like ingest's (spawned, `worker_init` first): each worker reports the signal the kernel
# sends it when its parent ends, and whether it can import pandas.
WORKER_SCRIPT = r"""
import concurrent.futures, ctypes, multiprocessing as mp

def probe():
    sig = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # 2 = PR_GET_PDEATHSIG
    try:
        import pandas  # noqa: F401
        blocked = False
    except ImportError:
        blocked = True
    return sig.value, blocked

if __name__ == "__main__":
    from ratchet.ingest_ranges import worker_init
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=worker_init) as pool:
        print(*pool.submit(probe).result())
"""


def test_a_worker_is_armed_to_die_with_its_parent_and_cannot_import_pandas(tmp_path):
    """The kernel SIGKILLs an ingest worker the moment its parent ends (PR_SET_PDEATHSIG; the
    polling thread is only the fallback, up to a second later), and pandas is unimportable in it
    (pyarrow's 0.3 s pandas check skipped), while every other name imports as usual."""
    import importlib.util
    import signal
    import subprocess
    import sys

    assert importlib.util.find_spec("pandas") is not None  # installed: only the worker's finder can refuse it
    script = tmp_path / "pool.py"
    script.write_text(WORKER_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [str(int(signal.SIGKILL)), "True"]
    for name in ("pandas", "pandas.core.frame"):
        with pytest.raises(ImportError, match="not imported in ingest workers"):
            rg.NoPandas.find_spec(name)
    assert rg.NoPandas.find_spec("pandasql") is None and rg.NoPandas.find_spec("numpy") is None
