"""Episode leases and the reaper that cleans up after callers that died without closing.

Every live episode owns `<root>/episodes/<id>/lock`, held with an exclusive flock for the
episode's lifetime, and `owner.json` (pid, uid, worktree admin dir). The kernel drops the flock
when the owner dies, however it dies, so "can I take the lock?" is an exact staleness test that
does not suffer from pid reuse. `reap(root)` kills leftover processes running as a stale
episode's sandbox uid, then deletes its worktree and git metadata.

Run by hand: `python -m sandboxes.reaper [ROOT]`.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path


class Lease:
    def __init__(self, root: Path, episode_id: str, info: dict):
        self.dir = Path(root) / "episodes" / episode_id
        self.dir.mkdir(parents=True, exist_ok=False)
        os.chmod(self.dir, 0o711)
        self._fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.info = dict(info, pid=os.getpid(), created=time.time())
        self.write()

    def write(self) -> None:
        tmp = self.dir / "owner.json.tmp"
        tmp.write_text(json.dumps(self.info))
        os.replace(tmp, self.dir / "owner.json")

    def release(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def pids_of_uid(uid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    out.append(int(name))
            except FileNotFoundError:
                pass
    return out


def kill_uid(uid: int) -> int:
    """SIGKILL every process running as a (never-zero) sandbox uid."""
    if not uid or uid == os.getuid():
        return 0
    pids = pids_of_uid(uid)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(pids)


def _is_stale(ep_dir: Path) -> bool:
    try:
        fd = os.open(ep_dir / "lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        # no lock yet: a lease being created right now, or debris; give it a minute
        return time.time() - ep_dir.stat().st_mtime > 60
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def reap(root: str | Path) -> list[str]:
    """Remove every episode under `root` whose owner is gone. Returns the reaped episode ids."""
    eps = Path(root) / "episodes"
    if not eps.is_dir():
        return []
    reaped = []
    for ep in sorted(eps.iterdir()):
        if not ep.is_dir() or not _is_stale(ep):
            continue
        try:
            info = json.loads((ep / "owner.json").read_text())
        except (OSError, ValueError):
            info = {}
        kill_uid(int(info.get("uid") or 0))
        for pgid in info.get("pgids", []):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        from sandboxes.quota import is_mount, unmount
        for m in info.get("mounts", []) + [str(ep / "repo")]:
            if is_mount(m):
                unmount(m)              # the episode's quota tmpfs
        if info.get("admin"):
            shutil.rmtree(info["admin"], ignore_errors=True)
        shutil.rmtree(ep, ignore_errors=True)
        reaped.append(ep.name)
    return reaped


if __name__ == "__main__":
    from sandboxes.runtime import default_root
    print(json.dumps({"reaped": reap(sys.argv[1] if len(sys.argv) > 1 else default_root())}))
