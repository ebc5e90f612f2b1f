"""Greedy completions kept by key: in memory (LRU), and optionally in a SQLite file that every
process evaluating the same weights shares.

    memo = CompletionMemo(4096, path=memo_file(home, checkpoint))
    memo.get(key) -> tuple | None;  memo.put(key, value)

Why a file: the holdout evaluation runs one seed per Dagster partition, each in its own run and
pool of spawned workers, so an in-memory memo never sees the other seeds of a task. A greedy turn
is a function of the weights, the prompt ids, the grammar and the limits (the key, built by the
engine; the file is per weights), so seed 1 of a deterministic episode reads seed 0's turns
wherever it ran. SQLite (stdlib) in WAL mode: several workers read and write one file at once.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path


def weights_digest(folder) -> str:
    """sha256 over a checkpoint folder's weight files (safetensors / bin, by name): the memo file
    of one set of weights, never shared with another."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(folder).iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors, *.bin) in {folder}")
    for p in files:
        h.update(p.name.encode())
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def memo_file(home, checkpoint) -> Path:
    return Path(home) / "cache" / "completions" / f"{weights_digest(checkpoint)[:24]}.sqlite"


class CompletionMemo:
    """In memory (LRU) in front of an optional shared file (`sandboxes.kvfile.KVFile`: an
    optimisation, never a dependency; on any file error it warns and this goes on in memory)."""

    def __init__(self, size: int, path: str | Path | None = None, *, timeout: float = 60.0):
        from sandboxes.kvfile import KVFile

        self.size, self.path, self.timeout = size, Path(path) if path else None, timeout
        self._mem: OrderedDict = OrderedDict()
        self._file = KVFile(self.path, timeout=timeout, what="completion memo") if self.path else None

    def get(self, key: bytes):
        if key in self._mem:
            self._mem.move_to_end(key)
            return self._mem[key]
        raw = self._file.get(key) if self._file is not None else None
        if raw is None:
            return None
        value = tuple(json.loads(raw))
        self._remember(key, value)
        return value

    def put_many(self, items: list[tuple[bytes, tuple]]) -> None:
        for key, value in items:
            self._remember(key, value)
        if self._file is not None:
            self._file.put_many([(k, json.dumps(list(v))) for k, v in items])

    def _remember(self, key: bytes, value: tuple) -> None:
        self._mem[key] = value
        while len(self._mem) > self.size:
            self._mem.popitem(last=False)
