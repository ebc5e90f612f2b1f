"""Pinned, history-free git worktrees for episodes.

A *snapshot* is a bare repository holding exactly one commit whose tree is the task's tree:
for `repo_path` + `commit` bundles the tree's objects are packed over from the source repo
(nothing else: no parents, no other refs, no reflog, no future fix); for inline `files` bundles
the commit is written with `git fast-import`. Snapshots are cached by content (tree sha or
files digest), so every task on the same tree shares one. The commit has a fixed author and
date, so the same tree always gives the same snapshot sha.

Each episode gets `git worktree add --detach` of that commit. Host-side git commands on a
worktree never trust anything the sandbox could write: they pass --git-dir/--work-tree
explicitly (a planted `.git` is ignored), run with no system/global config, no hooks, no
fsmonitor, no external diff or textconv, and stage into a scratch index + object directory so
episodes never see each other's blobs.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

SNAPSHOT_REF = "refs/heads/snapshot"
_JUNK = (":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc",
         ":(exclude,glob)**/.pytest_cache/**")
_FIXED_ID = {"GIT_AUTHOR_NAME": "ratchet", "GIT_AUTHOR_EMAIL": "sandbox@ratchet.local",
             "GIT_COMMITTER_NAME": "ratchet", "GIT_COMMITTER_EMAIL": "sandbox@ratchet.local",
             "GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000"}


class GitError(RuntimeError):
    pass


def git(*args: str, env: dict | None = None, input: bytes | None = None, text: bool = True):
    """Run host git hardened against repository-controlled configuration."""
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
                "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C",
                "GIT_TERMINAL_PROMPT": "0"}
    base_env.update(env or {})
    cmd = ["git", "-c", "safe.directory=*", "-c", "core.fsmonitor=false",
           "-c", "core.hooksPath=/dev/null", "-c", "protocol.file.allow=never", *args]
    r = subprocess.run(cmd, env=base_env, input=input, capture_output=True)
    if r.returncode != 0:
        raise GitError(f"git {' '.join(args[:4])}... failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout.decode("utf-8", "replace") if text else r.stdout


@dataclass(frozen=True)
class Snapshot:
    gitdir: str        # bare repo with one commit
    commit: str        # the pinned (snapshot) commit episodes start from
    source: str        # where it came from: "<repo>@<sha>" or "inline:<digest>"


class SnapshotStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._memo: dict[tuple, Snapshot] = {}

    def for_bundle(self, bundle) -> Snapshot:
        if bundle.files and bundle.repo_path:
            raise ValueError(f"{bundle.task_id}: bundle has both inline files and repo_path")
        if bundle.files:
            return self.from_files(bundle.files)
        if bundle.repo_path and bundle.commit:
            return self.from_repo(bundle.repo_path, bundle.commit)
        raise ValueError(f"{bundle.task_id}: bundle has neither files nor repo_path+commit")

    def from_repo(self, repo_path: str, commit: str) -> Snapshot:
        key = ("repo", str(Path(repo_path).resolve()), commit)
        if key in self._memo:
            return self._memo[key]
        src = str(Path(repo_path).resolve())
        sha = git("-C", src, "rev-parse", "--verify", f"{commit}^{{commit}}").strip()
        tree = git("-C", src, "rev-parse", f"{sha}^{{tree}}").strip()

        def fill(tmp: Path):
            objs = git("-C", src, "rev-list", "--objects", tree, text=False)
            pack = git("-C", src, "pack-objects", "-q", "--stdout", input=objs, text=False)
            git("-C", str(tmp), "index-pack", "--stdin", input=pack)
            return tree

        snap = self._build(f"t-{tree}", fill, f"{src}@{sha}")
        self._memo[key] = snap
        return snap

    def from_files(self, files: dict[str, str]) -> Snapshot:
        digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
        key = ("files", digest)
        if key in self._memo:
            return self._memo[key]

        def fill(tmp: Path):
            stream = bytearray(f"commit {SNAPSHOT_REF}\ncommitter ratchet <sandbox@ratchet.local> 0 +0000\n"
                               "data 0\n".encode())
            for path in sorted(files):
                parts = path.split("/")
                if path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts):
                    raise ValueError(f"unsafe path in inline files: {path!r}")
                data = files[path].encode()
                stream += f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n"
            git("-C", str(tmp), "fast-import", "--quiet", input=bytes(stream))
            return git("-C", str(tmp), "rev-parse", f"{SNAPSHOT_REF}^{{tree}}").strip()

        snap = self._build(f"f-{digest}", fill, f"inline:{digest[:16]}")
        self._memo[key] = snap
        return snap

    def _build(self, name: str, fill, source: str) -> Snapshot:
        final = self.root / f"{name}.git"
        if not (final / "HEAD").exists():
            tmp = self.root / f".tmp-{uuid.uuid4().hex}"
            try:
                git("init", "-q", "--bare", str(tmp))
                tree = fill(tmp)
                commit = git("-C", str(tmp), "commit-tree", tree, "-m", "ratchet snapshot",
                             env=_FIXED_ID).strip()
                git("-C", str(tmp), "update-ref", SNAPSHOT_REF, commit)
                git("-C", str(tmp), "symbolic-ref", "HEAD", SNAPSHOT_REF)
                (tmp / "info").mkdir(exist_ok=True)
                (tmp / "info" / "exclude").write_text("__pycache__/\n*.pyc\n.pytest_cache/\n")
                for hook in (tmp / "hooks").glob("*"):
                    hook.unlink()
                try:
                    os.rename(tmp, final)          # atomic publish; a concurrent builder may win
                except OSError:
                    pass
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        commit = git("-C", str(final), "rev-parse", SNAPSHOT_REF).strip()
        return Snapshot(str(final), commit, source)


@dataclass
class Worktree:
    path: str          # the checkout (host path)
    admin: str         # its per-worktree git dir inside the snapshot repo
    snapshot: Snapshot

    @classmethod
    def add(cls, snap: Snapshot, dest: str | Path) -> "Worktree":
        """Equivalent of `git worktree add --detach dest <commit>`, without spawning git.

        Files and index come from a per-snapshot template checkout (made once with git); the
        per-worktree admin dir gets the same HEAD/commondir/gitdir files git writes. The copied
        index has stale inode/ctime stat data, so git re-hashes those files: still exact.
        """
        dest = Path(dest)
        tpl = template_checkout(snap)
        admin = Path(snap.gitdir) / "worktrees" / f"{dest.parent.name}-{uuid.uuid4().hex[:8]}"
        admin.mkdir(parents=True)
        (admin / "HEAD").write_text(snap.commit + "\n")
        (admin / "commondir").write_text("../..\n")
        (admin / "gitdir").write_text(f"{dest / '.git'}\n")
        try:
            shutil.copyfile(tpl / ".." / "template.index", admin / "index")
            # dest may exist already: the runtime mounts the episode's quota tmpfs on it first
            shutil.copytree(tpl, dest, symlinks=True, dirs_exist_ok=True)
            (dest / ".git").write_text(f"gitdir: {admin}\n")
        except BaseException:
            shutil.rmtree(admin, ignore_errors=True)
            raise
        return cls(str(dest), str(admin), snap)

    def remove(self) -> None:
        """What `git worktree remove --force` does, minus two process spawns."""
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.admin, ignore_errors=True)

    def _staged_env(self, scratch: Path) -> dict:
        """Stage the whole worktree into a scratch index/object dir (never the shared store)."""
        scratch.mkdir(parents=True, exist_ok=True)
        idx, objs = scratch / "index", scratch / "objects"
        objs.mkdir(exist_ok=True)
        src_idx = Path(self.admin) / "index"
        if src_idx.exists():
            shutil.copyfile(src_idx, idx)      # keeps stat info: only touched files get rehashed
        env = {"GIT_INDEX_FILE": str(idx), "GIT_OBJECT_DIRECTORY": str(objs),
               "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(Path(self.snapshot.gitdir) / "objects")}
        git(*self._gd(), "add", "--all", "--force", "--", ".", *_JUNK, env=env)
        return env

    def _gd(self) -> list[str]:
        return [f"--git-dir={self.admin}", f"--work-tree={self.path}"]

    def diff(self, scratch: Path) -> str:
        env = self._staged_env(scratch)
        try:
            return git(*self._gd(), "diff", "--cached", "--no-color", "--no-ext-diff",
                       "--no-textconv", "--no-renames", "--binary", self.snapshot.commit, env=env)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def changed_paths(self, scratch: Path) -> list[str]:
        env = self._staged_env(scratch)
        try:
            out = git(*self._gd(), "diff", "--cached", "--name-only", "--no-renames", "-z",
                      self.snapshot.commit, env=env)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return sorted(p for p in out.split("\0") if p)


def template_checkout(snap: Snapshot) -> Path:
    """A pristine checkout of the snapshot (+ its index), built once and shared read-only.
    `Worktree.add` builds it on first use; call it ahead to keep that one-off cost out of a
    measurement (bench/rollout.py)."""
    base = Path(snap.gitdir) / "ratchet-template"
    tpl = base / "tree"
    if tpl.is_dir():
        return tpl
    tmp = Path(snap.gitdir) / f".tpl-{uuid.uuid4().hex}"
    (tmp / "tree").mkdir(parents=True)
    try:
        git(f"--git-dir={snap.gitdir}", f"--work-tree={tmp / 'tree'}", "read-tree", "-u", "--reset",
            snap.commit, env={"GIT_INDEX_FILE": str(tmp / "template.index")})
        try:
            os.rename(tmp, base)
        except OSError:
            pass                                   # a concurrent builder won
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tpl


def chown_tree(path: str, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)
    for d, dirs, files in os.walk(path):
        for n in dirs + files:
            os.lchown(os.path.join(d, n), uid, gid)
