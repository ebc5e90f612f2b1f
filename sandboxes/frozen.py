"""Content-addressed copies of the files a sandbox runs (the pytest worker, Docker's ops script).

A runtime binds its own frozen copy, made when the runtime is created, never the source file in
the checkout: an evaluation keeps running the worker it started with when someone edits
`sandboxes/pytest_worker.py` mid-run (before this, each sandbox start read the file anew, so a long
run could mix two workers), and the test-result cache keys each run on the code that actually ran
(the copy's name is its digest, so a digest cached by path cannot go stale).

    path, digest = freeze(".../pytest_worker.py", runtime.root / "tools")
"""
from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path


def freeze(src: str | Path, into: str | Path) -> tuple[str, str]:
    """(path of a read-only copy of `src` named by its sha256, that digest). Idempotent; a copy
    that is missing or does not match its name is (re)written atomically."""
    src, into = Path(src), Path(into)
    data = src.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    dest = into / f"{src.stem}-{digest[:16]}{src.suffix}"
    try:
        ok = hashlib.sha256(dest.read_bytes()).hexdigest() == digest
    except OSError:
        ok = False
    if not ok:
        into.mkdir(parents=True, exist_ok=True)
        tmp = into / f".{dest.name}.{uuid.uuid4().hex[:8]}"
        tmp.write_bytes(data)
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)              # concurrent runtimes write the same bytes
    return str(dest), digest
