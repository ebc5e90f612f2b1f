"""Sandbox escape attempts. Each one must fail closed, and the test asserts that it did."""
import os
import socket
import subprocess
import textwrap
import threading
import time
from fnmatch import fnmatch
from pathlib import Path

import psutil
import pytest

import sandboxes
from sandboxes.bundle import Limits, TaskBundle
from sandboxes.runtime import LocalRuntime, PathEscape

pytestmark = pytest.mark.security

FILES = {"solution.py": "def f():\n    return 1\n",
         "tests/test_solution.py": "from solution import f\n\ndef test_f():\n    assert f() == 2\n"}


def bundle(files=FILES, **limits):
    return TaskBundle(task_id="sec", files=files, limits=Limits(**limits),
                      fail_to_pass=("tests/test_solution.py::test_f",))


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    return LocalRuntime(tmp_path_factory.mktemp("secrt"))


def uid_procs(uid):
    return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]


def test_no_network_egress_or_dns(rt):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    hits = []
    t = threading.Thread(target=lambda: hits.append(_accept(srv)), daemon=True)
    t.start()
    probe = textwrap.dedent(f"""
        import socket
        for target in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
            try:
                socket.create_connection(target, timeout=1); print("CONNECTED", target)
            except OSError as e: print("blocked", type(e).__name__)
        try:
            socket.getaddrinfo("example.com", 80); print("RESOLVED")
        except OSError as e: print("nodns", type(e).__name__)
        """)
    with rt.episode(bundle()) as ep:
        r = ep.run(["python", "-c", probe], timeout=10)
    t.join(2)
    srv.close()
    assert r.infra_error is None and r.returncode == 0, r.stderr
    assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout
    assert r.stdout.count("blocked") == 2 and "nodns" in r.stdout
    assert hits == [None]                       # the host listener never saw a connection


def _accept(srv):
    try:
        return srv.accept()
    except OSError:
        return None


def test_writes_outside_worktree_fail(rt, tmp_path):
    target = tmp_path / "host_file"
    with rt.episode(bundle()) as ep:
        r = ep.run(f"for p in /etc/pwned /usr/pwned {target} /work/pwned /.ratchet/x; do "
                   f"(echo x > $p) 2>/dev/null && echo WROTE $p; done; echo x > /tmp/scratch && echo tmp-ok")
        assert "WROTE" not in r.stdout and "tmp-ok" in r.stdout
    assert not target.exists() and not Path("/etc/pwned").exists() and not Path("/usr/pwned").exists()
    assert not Path("/tmp/scratch").exists()    # the sandbox /tmp is a private tmpfs


def test_host_secrets_are_invisible(tmp_path, monkeypatch):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text("TOPSECRET-file")
    home = tmp_path / "ratchet_home"
    home.mkdir()
    (home / "creds").write_text("TOPSECRET-home")
    monkeypatch.setenv("RATCHET_FAKE_SECRET", "TOPSECRET-env")
    monkeypatch.setenv("RATCHET_HOME", str(home))
    rt = LocalRuntime(tmp_path / "rt")
    project_file = Path(sandboxes.__file__).resolve()
    with rt.episode(bundle()) as ep:
        r = ep.run(f"env; cat {secret_file} {home}/creds {project_file} /etc/shadow; ls -A /root ~ /tmp; "
                   f"cat /proc/1/environ | tr '\\0' '\\n'")
    assert "TOPSECRET" not in r.stdout + r.stderr
    assert "RATCHET_FAKE_SECRET" not in r.stdout
    assert r.stderr.count("No such file") >= 4 and "/etc/shadow: No such file" in r.stderr
    assert r.stdout.count("\n") < 40                             # just the clean env, nothing listed


def test_fork_bomb_is_contained(rt):
    count = textwrap.dedent("""
        import subprocess
        ps = []
        try:
            for _ in range(200): ps.append(subprocess.Popen(["sleep", "30"]))
        except OSError: pass
        print(len(ps))
        """)
    with rt.episode(bundle(max_procs=32, wall_s=5)) as ep:
        r = ep.run(["python", "-c", count])
        assert r.returncode == 0 and int(r.stdout) < 32           # RLIMIT_NPROC binds
        t0 = time.monotonic()
        r = ep.run("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=3)
        assert time.monotonic() - t0 < 8 and r.infra_error is None
        assert uid_procs(ep.uid) == []                            # nothing left behind
    assert subprocess.run(["true"]).returncode == 0               # the host can still fork


def test_memory_bomb_is_contained(rt):
    with rt.episode(bundle(memory_mb=256)) as ep:
        r = ep.run(["python", "-c", "x = bytearray(2 * 1024**3); print('ALLOCATED')"], timeout=10)
    assert r.returncode != 0 and "ALLOCATED" not in r.stdout and "MemoryError" in r.stderr


def test_infinite_loop_and_escaped_daemon_are_killed(rt):
    with rt.episode(bundle(cpu_s=30)) as ep:
        t0 = time.monotonic()
        r = ep.run("setsid sleep 1000 & nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & "
                   "while :; do :; done", timeout=1)
        assert r.timed_out and time.monotonic() - t0 < 5
        assert uid_procs(ep.uid) == []
    with rt.episode(bundle(wall_s=2, cpu_s=2)) as ep:       # a busy loop times out, visibly
        r = ep.run(["python", "-c", "while True: pass"], timeout=20)
        assert r.timed_out and r.returncode is None and r.duration_s < 10
    with pytest.raises(ValueError, match="cpu_s .* is below wall_s"):
        Limits(wall_s=30, cpu_s=20)


def test_destructive_command_is_contained(rt, tmp_path):
    sentinel = tmp_path / "keep.txt"
    sentinel.write_text("keep")
    b = bundle()
    with rt.episode(b) as ep:
        snap = Path(ep.worktree.snapshot.gitdir)
        ep.run("rm -rf /repo/* /repo/.git .. ~ /tmp/* /etc /usr/bin /bin/sh "
               f"{ep.worktree.snapshot.gitdir} {sentinel} 2>/dev/null; true", timeout=20)
        assert ep.list_files() == []
    assert sentinel.read_text() == "keep" and (snap / "HEAD").exists()
    with rt.episode(b) as ep2:                                   # the next episode is clean
        assert ep2.list_files() == ["solution.py", "tests/test_solution.py"]
        assert ep2.changed_paths() == []


def test_editing_tests_is_visible_to_verifiers(rt):
    b = bundle()
    with rt.episode(b) as ep:
        ep.run("sed -i 's/== 2/== 1/' tests/test_solution.py")
        assert ep.run_tests(list(b.fail_to_pass)).outcomes == {"tests/test_solution.py::test_f": "passed"}
        changed = ep.changed_paths()
        assert changed == ["tests/test_solution.py"]
        assert any(fnmatch(p, pat) for p in changed for pat in b.forbidden_paths)
        assert "-    assert f() == 2" in ep.diff()


def _git(path, *a):
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    return subprocess.run(["git", "-C", str(path), *a], check=True, capture_output=True, text=True, env=env).stdout.strip()


def test_future_fix_is_unreachable_through_git(rt, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _git(src, "init", "-q")
    (src / "solution.py").write_text("def f():\n    return 1\n")
    _git(src, "add", ".")
    _git(src, "commit", "-qm", "bug")
    base = _git(src, "rev-parse", "HEAD")
    (src / "solution.py").write_text("def f():\n    return 2  # THE-FIX\n")
    _git(src, "commit", "-qam", "fix")
    _git(src, "tag", "v-fix")
    _git(src, "gc", "-q")                                        # packed objects too
    fix_commit = _git(src, "rev-parse", "HEAD")
    fix_blob = _git(src, "rev-parse", "HEAD:solution.py")
    b = TaskBundle(task_id="hist", repo_path=str(src), commit=base)
    with rt.episode(b) as ep:
        r = ep.run(f"git log --all --format=%H; git reflog; git tag; git cat-file -p {fix_blob}; "
                   f"git cat-file -t {fix_commit}; git rev-list --all --objects; ls {src}; "
                   f"grep -rl THE-FIX /repo {ep.worktree.snapshot.gitdir} /tmp /home /root 2>/dev/null", timeout=20)
        assert "THE-FIX" not in r.stdout
        assert r.stdout.split()[0] == ep.commit and fix_commit not in r.stdout and base not in r.stdout
        assert fix_blob not in r.stdout and "v-fix" not in r.stdout
        assert "Not a valid object name" in r.stderr or "fatal" in r.stderr
        host = subprocess.run(["git", f"--git-dir={ep.worktree.snapshot.gitdir}", "cat-file", "-e", fix_blob],
                              capture_output=True)
        assert host.returncode != 0                               # not in the snapshot store at all


def test_symlink_escapes_are_refused(rt, tmp_path):
    secret = tmp_path / "hostsecret"
    secret.write_text("TOPSECRET")
    with rt.episode(bundle()) as ep:
        ep.run(f"ln -s / rootlink; ln -s ../.. up; ln -s {secret} s; ln -s /etc/passwd pw; "
               "mkdir d; ln -s ../solution.py d/ok")
        for bad in ("rootlink/etc/passwd", "up/x", "s", "pw", "../solution.py"):
            with pytest.raises(PathEscape):
                ep.read_file(bad)
        with pytest.raises(PathEscape):
            ep.write_file("up/evil.txt", "x")
        with pytest.raises(PathEscape):
            ep.write_file("rootlink/tmp/evil.txt", "x")
        assert ep.read_file("d/ok") == FILES["solution.py"]       # in-tree links still work
        assert "rootlink" in ep.list_files() and not any(p.startswith("rootlink/") for p in ep.list_files())
    assert not (Path(ep.workdir).parent.parent / "evil.txt").exists() and not Path("/tmp/evil.txt").exists()


def test_planted_git_config_never_runs_on_host(rt, tmp_path):
    marker = tmp_path / "pwned"
    with rt.episode(bundle()) as ep:
        ep.run(f"mkdir evil && git init -q --bare evil 2>/dev/null; "
               f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n\\thooksPath = .\\n' >> evil/config; "
               f"printf 'gitdir: evil\\n' > .git; printf '#!/bin/sh\\ntouch {marker}\\n' > post-index-change; "
               f"chmod +x post-index-change")
        ep.write_file("solution.py", "def f():\n    return 2\n")
        assert "solution.py" in ep.changed_paths() and "+    return 2" in ep.diff()
    assert not marker.exists()
