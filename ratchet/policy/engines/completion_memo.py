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
    """The file is an optimisation, never a dependency: if it cannot be opened, read or written
    (locked past `timeout`, disk full, corrupt), the memo warns once and goes on in memory, so no
    episode fails because of it. (Measured: two workers opening one file at once could fail the
    WAL switch with "database is locked", which before this voided a 24-episode chunk.)"""

    def __init__(self, size: int, path: str | Path | None = None, *, timeout: float = 60.0):
        self.size, self.path, self.timeout = size, Path(path) if path else None, timeout
        self._mem: OrderedDict = OrderedDict()
        self._db = None
        if self.path is not None:
            self._guard(self._open)

    def _open(self) -> None:
        import time

        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path), timeout=self.timeout, check_same_thread=False)
        deadline = time.monotonic() + self.timeout
        while True:
            try:                         # the journal-mode switch does not wait on a busy file
                if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    db.execute("PRAGMA journal_mode=WAL")
                db.execute("CREATE TABLE IF NOT EXISTS memo (key BLOB PRIMARY KEY, value TEXT NOT NULL)")
                db.commit()
                break
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    db.close()
                    raise
                time.sleep(0.05)
        self._db = db

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except (sqlite3.Error, OSError) as e:
            import warnings

            warnings.warn(f"completion memo {self.path}: {type(e).__name__}: {e}; going on in memory only")
            if self._db is not None:
                try:
                    self._db.close()
                except sqlite3.Error:
                    pass
            self._db = None
            return None

    def get(self, key: bytes):
        if key in self._mem:
            self._mem.move_to_end(key)
            return self._mem[key]
        if self._db is None:
            return None
        row = self._guard(lambda: self._db.execute("SELECT value FROM memo WHERE key = ?", (key,)).fetchone())
        if row is None:
            return None
        value = tuple(json.loads(row[0]))
        self._remember(key, value)
        return value

    def put_many(self, items: list[tuple[bytes, tuple]]) -> None:
        for key, value in items:
            self._remember(key, value)
        if self._db is not None and items:
            self._guard(self._write, [(k, json.dumps(list(v))) for k, v in items])

    def _write(self, rows) -> None:
        with self._db:
            self._db.executemany("INSERT OR IGNORE INTO memo VALUES (?, ?)", rows)

    def _remember(self, key: bytes, value: tuple) -> None:
        self._mem[key] = value
        while len(self._mem) > self.size:
            self._mem.popitem(last=False)
