"""Symlink-safe file access inside an episode worktree (used by the runtime's file helpers).

Paths are relative to the worktree (`/repo/...`, the in-sandbox spelling, is accepted too).
In-tree symlinks are followed by hand; any path that leaves the worktree -- `..` above the
root, an absolute symlink, a symlink chain pointing outside -- raises `PathEscape`. The final
open walks directory fds with O_NOFOLLOW, so a component swapped for a symlink after the check
cannot redirect the access either.
"""
from __future__ import annotations

import os
import stat

from sandboxes.isolation import SANDBOX_WORKDIR

_MAX_HOPS = 40


class PathEscape(PermissionError):
    """The path would leave the episode worktree."""


def _split(rel: str) -> list[str]:
    rel = str(rel)
    if rel == SANDBOX_WORKDIR or rel.startswith(SANDBOX_WORKDIR + "/"):
        rel = rel[len(SANDBOX_WORKDIR):]
    elif rel.startswith("/"):
        raise PathEscape(f"absolute path outside the worktree: {rel!r}")
    if "\x00" in rel:
        raise PathEscape("NUL byte in path")
    return [p for p in rel.split("/") if p not in ("", ".")]


def resolve(root: str, rel: str) -> list[str]:
    """Components of `rel` inside `root` after resolving in-tree symlinks; raises PathEscape."""
    parts, out, hops = _split(rel), [], 0
    while parts:
        p = parts.pop(0)
        if p == "..":
            if not out:
                raise PathEscape(f"path escapes the worktree: {rel!r}")
            out.pop()
            continue
        cur = os.path.join(root, *out, p)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            out.append(p)
            continue
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_HOPS:
                raise PathEscape(f"too many symlinks: {rel!r}")
            target = os.readlink(cur)
            if target.startswith("/"):
                if not (target == SANDBOX_WORKDIR or target.startswith(SANDBOX_WORKDIR + "/")):
                    raise PathEscape(f"{rel!r} is a symlink to {target!r}, outside the worktree")
                out = []
            parts = _split(target) + parts
            continue
        out.append(p)
    return out


def _walk_open(root: str, comps: list[str], flags: int, mode: int = 0o644,
               mkdirs: bool = False, owner: tuple[int, int] | None = None) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for c in comps[:-1]:
            if mkdirs:
                try:
                    os.mkdir(c, 0o755, dir_fd=fd)
                    if owner:
                        os.chown(c, *owner, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                raise PathEscape(f"not a plain directory inside the worktree: {c!r} ({e})") from e
            os.close(fd)
            fd = nfd
        try:
            return os.open(comps[-1], flags | os.O_NOFOLLOW, mode, dir_fd=fd)
        except OSError as e:
            if e.errno == 40:  # ELOOP: the final component became a symlink
                raise PathEscape(f"refusing to follow a symlink: {comps[-1]!r}") from e
            raise
    finally:
        os.close(fd)


def read_bytes(root: str, rel: str, max_bytes: int | None = None) -> bytes:
    comps = resolve(root, rel)
    if not comps:
        raise IsADirectoryError(rel)
    fd = _walk_open(root, comps, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes if max_bytes is not None else -1)


def write_bytes(root: str, rel: str, data: bytes, owner: tuple[int, int] | None = None) -> str:
    comps = resolve(root, rel)
    if not comps or comps[0] == ".git":
        raise PathEscape(f"refusing to write {rel!r}")
    fd = _walk_open(root, comps, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, mkdirs=True,
                    owner=owner)
    with os.fdopen(fd, "wb") as f:
        if owner:
            os.fchown(f.fileno(), *owner)
        f.write(data)
    return "/".join(comps)


def delete(root: str, rel: str) -> None:
    comps = resolve(root, rel)
    if not comps or comps[0] == ".git":
        raise PathEscape(f"refusing to delete {rel!r}")
    parent = _walk_open(root, comps[:-1] + ["."], os.O_RDONLY | os.O_DIRECTORY) if len(comps) > 1 \
        else os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.unlink(comps[-1], dir_fd=parent)
    finally:
        os.close(parent)


def list_files(root: str, rel: str = ".", limit: int = 10000) -> list[str]:
    """Sorted relative paths of files (and symlinks, not followed) under `rel`; skips .git."""
    comps = resolve(root, rel)
    base = os.path.join(root, *comps)
    if os.path.islink(base) or not os.path.isdir(base):
        raise NotADirectoryError(rel)
    out: list[str] = []
    stack = [(base, "/".join(comps))]
    while stack and len(out) < limit:
        d, prefix = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                relp = f"{prefix}/{e.name}" if prefix else e.name
                if relp == ".git" or e.name == "__pycache__":
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append((e.path, relp))
                else:
                    out.append(relp)
    return sorted(out)[:limit]
