"""Finding input files and opening them safely: only regular files are opened, always with
O_NONBLOCK after a stat (a FIFO named `x.jsonl` must never block the ingest that holds the lock);
every other folder entry becomes a `Skipped` with one reason. Also the batch sidecar
(`_batch.yaml`) that attributes a folder's files to a tenant and consent, and may state their
acceptance (`accepted: true` for a folder of reviewed, accepted runs) and when they ended
(`ended_at:` for logs without timestamps, whose consent retention cannot be proven otherwise)."""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import yaml

SIDECAR = "_batch.yaml"
HIDDEN = "a hidden {} (its name starts with a dot) is not read in a folder: give its path to ingest it"


@dataclass(slots=True, frozen=True)
class Skipped:
    """A folder entry that is not read: one reason per entry, recorded in `ingest_files`."""
    path: Path
    code: str                   # symlink_loop | dangling_symlink | not_regular_file | unreadable_file | unreadable_folder
                                # | vanished | hidden_file | hidden_folder
    detail: str


class SkipFile(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _stat_error(path: Path, e: OSError) -> SkipFile:
    if e.errno == errno.ELOOP:
        return SkipFile("symlink_loop", f"symbolic link loop: {e.strerror}")
    if e.errno == errno.ENOENT:
        if os.path.islink(path):
            return SkipFile("dangling_symlink", f"symbolic link to a missing target ({os.readlink(path)})")
        return SkipFile("vanished", "the file disappeared before it was read")
    if e.errno in (errno.EACCES, errno.EPERM):
        return SkipFile("unreadable_file", f"permission denied: {e.strerror}")
    if e.errno == errno.ENXIO:
        return SkipFile("not_regular_file", "a socket or a device without a reader")
    return SkipFile("unreadable_file", f"{errno.errorcode.get(e.errno, e.errno)}: {e.strerror}")


def check_regular(path: Path) -> os.stat_result:
    """stat (following links) and require a regular file; raises SkipFile with the reason."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _stat_error(path, e) from None
    if not stat.S_ISREG(st.st_mode):
        raise SkipFile("not_regular_file", f"{_kind(st.st_mode)}, not a regular file")
    return st


def open_regular(path: Path) -> BinaryIO:
    """Open a file for reading only if it is a regular file. O_NONBLOCK: if the entry was swapped
    for a FIFO after it was found, opening it returns at once and fstat refuses it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise _stat_error(path, e) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SkipFile("not_regular_file", f"{_kind(st.st_mode)}, not a regular file")
    return os.fdopen(fd, "rb")


def discover(paths: list[str | os.PathLike]) -> tuple[list[tuple[Path, Path]], list[Skipped]]:
    """Regular files under the given paths as (file, root it was found under), sorted, without
    batch sidecars; and every other entry (link loop, dangling link, FIFO, socket, device,
    unreadable file or folder, a hidden file or folder found in a folder) as a `Skipped` with its
    reason. A hidden folder is not entered (`.git` is one row); a hidden path given by name is
    read. Symlinked folders are followed once (a folder already visited is a loop). A missing
    input path raises: silently ingesting nothing hides typos."""
    out: list[tuple[Path, Path]] = []
    skipped: list[Skipped] = []

    def add(f: Path, root: Path) -> None:
        try:
            check_regular(f)
        except SkipFile as s:
            skipped.append(Skipped(f, s.code, s.detail))
            return
        out.append((f, root))

    for p in map(Path, paths):
        if not os.path.lexists(p):
            raise FileNotFoundError(f"input path does not exist: {p}")
        try:
            is_dir = p.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            f = Path(os.path.abspath(p))
            f = f.resolve() if f.exists() else f  # (a link loop or dangling link is reported as it is)
            add(f, f.parent)
            continue
        root = p.resolve()
        visited: set[tuple[int, int]] = set()

        def onerror(e: OSError) -> None:  # os.walk below calls it within this iteration only
            skipped.append(Skipped(Path(e.filename or root), "unreadable_folder",  # noqa: B023
                                   f"cannot list the folder: {e.strerror}"))

        for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=True):
            st = os.stat(dirpath)
            if (st.st_dev, st.st_ino) in visited:  # reached again through a symlink: a loop
                skipped.append(Skipped(Path(dirpath), "symlink_loop", "a symlinked folder that leads back to a visited folder"))
                dirnames[:] = []
                continue
            visited.add((st.st_dev, st.st_ino))
            keep = []
            for d in sorted(dirnames):
                if d.startswith("."):
                    skipped.append(Skipped(Path(dirpath) / d, "hidden_folder", HIDDEN.format("folder")))
                    continue
                full = Path(dirpath) / d
                try:
                    os.stat(full)
                    keep.append(d)
                except OSError as e:
                    s = _stat_error(full, e)
                    skipped.append(Skipped(full, s.code, s.detail))
            dirnames[:] = keep
            for f in sorted(filenames):
                if f.startswith("."):
                    skipped.append(Skipped(Path(dirpath) / f, "hidden_file", HIDDEN.format("file")))
                elif f != SIDECAR:
                    add(Path(dirpath) / f, root)
    seen, unique = set(), []
    for f, r in out:
        if f not in seen:
            seen.add(f)
            unique.append((f, r))
    return unique, skipped


def sidecar_for(file: Path, root: Path) -> dict:
    """Attribution from the nearest `_batch.yaml` between the file's folder and the input root:
    tenant_id, consent_id, accepted and ended_at (None where the sidecar says nothing). Foreign logs
    (SWE-agent `.traj`, ATIF) carry no acceptance, and SFT trains only on accepted work: a curated
    folder says so; SWE-agent files carry no timestamps either, and consent counts a record with
    none as expired (its retention cannot be proven): the folder can say when its runs ended."""
    d = file.parent
    while True:
        s = d / SIDECAR
        if s.is_file():
            try:
                with open_regular(s) as fh:
                    data = yaml.safe_load(fh.read(1 << 20).decode("utf-8-sig")) or {}
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                raise ValueError(f"{s}: invalid YAML: {e}") from e
            except SkipFile as e:
                raise ValueError(f"{s}: cannot read the sidecar: {e.detail}") from None
            if not isinstance(data, dict):
                raise ValueError(f"{s}: must be a mapping like 'tenant_id: acme'")
            out = {k: _text(s, k, data.get(k) or data.get(k.removesuffix("_id"))) for k in ("tenant_id", "consent_id")}
            accepted = data.get("accepted")
            if accepted is not None and not isinstance(accepted, bool):
                raise ValueError(f"{s}: accepted must be true or false, got {accepted!r:.40}")
            return out | {"accepted": accepted, "ended_at": _when(s, data.get("ended_at"))}
        if d == root or d.parent == d:
            return {}
        d = d.parent


def _when(sidecar: Path, v) -> str | None:
    """`ended_at: 2026-12-04` (midnight UTC) or a full timestamp, as ISO 8601 text."""
    import datetime

    if v is None:
        return None
    if isinstance(v, datetime.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=datetime.timezone.utc)).isoformat()
    if isinstance(v, datetime.date):
        return datetime.datetime(v.year, v.month, v.day, tzinfo=datetime.timezone.utc).isoformat()
    if isinstance(v, str):
        try:
            return _when(sidecar, datetime.datetime.fromisoformat(v.replace("Z", "+00:00")))
        except ValueError:
            pass
    raise ValueError(f"{sidecar}: ended_at must be a date or an ISO 8601 timestamp, got {v!r:.40}")


def _text(sidecar: Path, key: str, v) -> str | None:
    """YAML reads `tenant_id: 12345` as an int and `consent_id: 2026-09-01` as a date: ids are text."""
    import datetime

    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float, datetime.date)):
        raise ValueError(f"{sidecar}: {key} must be a string, got {type(v).__name__} {v!r:.40}")  # noqa: TRY004 (callers catch ValueError)
    return v.isoformat() if isinstance(v, datetime.date) else str(v)
