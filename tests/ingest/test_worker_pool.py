"""Ingest's worker processes: started only for an input large enough to pay for them (a spawned
worker costs ~0.5 s), and all gone when `ingest` returns (joined, not left to exit later)."""
import concurrent.futures
import os

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
