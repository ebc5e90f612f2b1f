"""Landing-folder scanning for the ingest sensor: which files are new.

The warehouse is the record of what was ingested (`ingest_files`: path, size, mtime), so a file
an in-process run (`make demo`, `ratchet ingest`) already ingested is never requested again, and
the sensor starts where they left off. The cursor only holds what the sensor requested and the
warehouse has not recorded yet (`pending`, by path relative to the landing folder), so it stays
a few lines however many files have landed. A file that changes (appended) is requested again;
ingest's content ids keep that idempotent. Files modified in the last `settle_s` seconds are
left for the next tick: they may still be written."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Iterable

from ratchet.readers import SIDECAR

INGESTED_SQL = "SELECT DISTINCT source_file, size_bytes, mtime_ns FROM ingest_files WHERE source_file IS NOT NULL"


def _rel(landing: Path, path: str) -> str | None:
    try:
        return str(Path(path).relative_to(landing))
    except ValueError:
        return None


def scan(landing: Path, cursor: str | None, ingested: Iterable[tuple] = (), settle_s: float = 2.0
         ) -> tuple[list[str], str, str]:
    """(new files, new cursor, run key). `ingested`: (source_file, size_bytes, mtime_ns) rows
    from `ingest_files`."""
    done = {(r, f"{size}:{mtime}") for path, size, mtime in ingested if (r := _rel(landing, path)) is not None}
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
            fp = f"{st.st_size}:{st.st_mtime_ns}"
            if (str(rel), fp) in done or pending.get(str(rel)) == fp:
                continue
            pending[str(rel)] = fp
            new.append(str(f))
    key = hashlib.sha256(json.dumps([(f, pending[_rel(landing, f)]) for f in new]).encode()).hexdigest()[:16]
    return new, json.dumps({"pending": dict(sorted(pending.items())), "ingested_files": len(done)}), key
