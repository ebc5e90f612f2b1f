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
import sqlite3
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
    def __init__(self, size: int, path: str | Path | None = None):
        self.size, self.path = size, Path(path) if path else None
        self._mem: OrderedDict = OrderedDict()
        self._db = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS memo (key BLOB PRIMARY KEY, value TEXT NOT NULL)")
            self._db.commit()

    def get(self, key: bytes):
        if key in self._mem:
            self._mem.move_to_end(key)
            return self._mem[key]
        if self._db is None:
            return None
        row = self._db.execute("SELECT value FROM memo WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        value = tuple(json.loads(row[0]))
        self._remember(key, value)
        return value

    def put_many(self, items: list[tuple[bytes, tuple]]) -> None:
        for key, value in items:
            self._remember(key, value)
        if self._db is not None and items:
            with self._db:
                self._db.executemany("INSERT OR IGNORE INTO memo VALUES (?, ?)",
                                     [(k, json.dumps(list(v))) for k, v in items])

    def _remember(self, key: bytes, value: tuple) -> None:
        self._mem[key] = value
        while len(self._mem) > self.size:
            self._mem.popitem(last=False)

    def __getstate__(self):             # a policy pickled to a worker reopens the file there
        return {"size": self.size, "path": self.path}

    def __setstate__(self, state):
        self.__init__(state["size"], state["path"])
