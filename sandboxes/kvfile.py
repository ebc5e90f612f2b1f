"""A key -> text store in one SQLite file that several processes read and write at once (WAL).

Used for caches that are an optimisation, never a dependency: the test-result cache of the
sandboxes (`sandboxes.result_cache`) and the greedy completion memo of the transformers engine.
If the file cannot be opened, read or written (locked past `timeout`, disk full, corrupt), the
store warns once and answers "not found" from then on, so no episode fails because of it.
(Measured: two workers opening one file at once could fail the WAL switch with "database is
locked", which before this voided a 24-episode evaluation chunk.)

One connection per store, used under a lock: episodes step in threads, and two threads on one
connection at once get SQLITE_LOCKED at once (not a busy wait), and a thread that closed it after
an error while another was inside `execute` crashed the process (a segfault in sqlite3, seen in a
400 x 3 evaluation: the pool's worker died and its chunks ran in the parent).
"""
from __future__ import annotations

import sqlite3
import threading
import time
import warnings
from pathlib import Path


class KVFile:
    def __init__(self, path: str | Path, *, timeout: float = 60.0, what: str = "cache"):
        self.path, self.timeout, self.what = Path(path), timeout, what
        self._db = None
        self._lock = threading.RLock()
        self._guard(self._open)

    @property
    def usable(self) -> bool:
        return self._db is not None

    def _open(self) -> None:
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
        with self._lock:
            try:
                return fn(*args)
            except (sqlite3.Error, OSError) as e:
                warnings.warn(f"{self.what} {self.path}: {type(e).__name__}: {e}; going on in memory only",
                              stacklevel=3)
                self.close()
                return None

    def get(self, key: bytes) -> str | None:
        row = self._guard(self._read, key)
        return None if row is None else row[0]

    def _read(self, key: bytes):
        if self._db is None:                # closed after an error: not found
            return None
        return self._db.execute("SELECT value FROM memo WHERE key = ?", (key,)).fetchone()

    def put_many(self, rows: list[tuple[bytes, str]]) -> None:
        if rows:
            self._guard(self._write, rows)

    def _write(self, rows) -> None:
        if self._db is None:
            return
        with self._db:
            self._db.executemany("INSERT OR IGNORE INTO memo VALUES (?, ?)", rows)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                try:
                    self._db.close()
                except sqlite3.Error:
                    pass
            self._db = None
