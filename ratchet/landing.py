"""Landing-folder scanning for the ingest sensor: which files are new since the cursor.

The cursor maps each file to its (size, mtime) fingerprint, so a file is requested once; a file
that changes (appended) is requested again and ingest's content ids keep that idempotent. Files
modified in the last `settle_s` seconds are left for the next tick: they may still be written."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from ratchet.readers import SIDECAR


def scan(landing: Path, cursor: str | None, settle_s: float = 2.0) -> tuple[list[str], str, str]:
    """(new files, new cursor, run key) for the landing folder."""
    seen: dict[str, str] = json.loads(cursor) if cursor else {}
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
            if seen.get(str(f)) != fp:
                seen[str(f)] = fp
                new.append(str(f))
    key = hashlib.sha256(json.dumps([(f, seen[f]) for f in new]).encode()).hexdigest()[:16]
    return new, json.dumps(seen, sort_keys=True), key
