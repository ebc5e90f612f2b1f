"""Landing-folder scanning for the ingest sensor: which files are new.

The warehouse is the record of what was ingested (`ingest_files`: path, size, mtime), so a file
an in-process run (`make demo`, `ratchet ingest`) already ingested is never requested again, and
the sensor starts where they left off. A file is known by its path relative to the landing
folder (`ingest_files.landing_file`), not by its absolute path, so a RATCHET_HOME moved or copied
elsewhere recognises the files it already read: a copy that keeps modification times (`cp -a`,
`rsync -a`, shutil.copytree, a move) requests nothing; one that does not asks for each file once,
and reading it adds nothing (ingest's ids are content hashes; quarantine ids name the file by the
same relative path). The cursor only holds what the sensor requested and the
warehouse has not recorded yet (`pending`, by path relative to the landing folder), so it stays
a few lines however many files have landed. A file that changes (appended) is requested again;
ingest's content ids keep that idempotent. Files modified in the last `settle_s` seconds are
left for the next tick: they may still be written."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Iterable

from ratchet.readers import SIDECAR

INGESTED_SQL = ("SELECT DISTINCT source_file, landing_file, size_bytes, mtime_ns FROM ingest_files "
                "WHERE source_file IS NOT NULL")


def landing_key(path: str | os.PathLike, landing: str | os.PathLike) -> str | None:
    """`path` relative to the landing folder (POSIX separators), or None for a file outside it:
    how the landing bookkeeping (and the quarantine id) names a file, wherever the home lies."""
    p, base = Path(os.path.abspath(path)), Path(os.path.abspath(landing))
    try:
        return p.relative_to(base).as_posix()
    except ValueError:
        pass
    try:
        return Path(path).resolve().relative_to(Path(landing).resolve()).as_posix()
    except (ValueError, OSError, RuntimeError):      # RuntimeError: a symlink loop (skipped entries)
        return None


def scan(landing: Path, cursor: str | None, ingested: Iterable[tuple] = (), settle_s: float = 2.0
         ) -> tuple[list[str], str, str]:
    """(new files, new cursor, run key). `ingested`: (source_file, landing_file, size_bytes,
    mtime_ns) rows from `ingest_files` (INGESTED_SQL). A row without `landing_file` (written before
    it was recorded) counts when its absolute path lies in this landing folder."""
    done = {(r, f"{size}:{mtime}") for path, rel, size, mtime in ingested
            if (r := rel or landing_key(path, landing)) is not None}
    state = json.loads(cursor) if cursor else {}
    pending = {k: v for k, v in (state.get("pending") or {}).items() if (k, v) not in done}
    now = time.time()
    new = []
    if landing.exists():
        for f in sorted(landing.rglob("*")):
            rel = f.relative_to(landing)
            if not f.is_file() or f.name == SIDECAR or any(p.startswith(".") for p in rel.parts):
                continue
            st = f.stat()
            if now - st.st_mtime < settle_s:
                continue
            fp, name = f"{st.st_size}:{st.st_mtime_ns}", rel.as_posix()
            if (name, fp) in done or pending.get(name) == fp:
                continue
            pending[name] = fp
            new.append(str(f))
    key = hashlib.sha256(json.dumps([(f, pending[landing_key(f, landing)]) for f in new]).encode()).hexdigest()[:16]
    return new, json.dumps({"pending": dict(sorted(pending.items())), "ingested_files": len(done)}), key
