"""The Docker runtime, for real: conformance to the Episode protocol and escape attempts.

Every test runs in a real container (the session-scoped `docker_runtime` fixture starts the engine
and builds the base image offline when needed, or skips with the exact reason). Each escape
probe asserts that the attack failed, not only that a command returned.
"""
import dataclasses
import os
import socket
import subprocess
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from sandboxes import docker_engine
from sandboxes.bundle import Limits, TaskBundle
from sandboxes.protocol import Episode
from sandboxes.runtime import PathEscape

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = ("from solution import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
         "def test_zero():\n    assert add(0, 0) == 0\n")
FILES = {"solution.py": BUGGY, "tests/test_solution.py": TESTS}
F2P = "tests/test_solution.py::test_add"
P2P = "tests/test_solution.py::test_zero"
HARNESS = ("docker_ops.py", "pytest_worker.py", "verdict_worker.py")


def limits(**kw) -> Limits:
    """Limits with `disk_mb` when this Limits has the field (otherwise the runtime's 256)."""
    names = {f.name for f in dataclasses.fields(Limits)}
    return Limits(**{k: v for k, v in kw.items() if k in names})


def bundle(files=FILES, **kw) -> TaskBundle:
    return TaskBundle(task_id="docker", files=files, limits=limits(**kw),
                      fail_to_pass=(F2P,), pass_to_pass=(P2P,))


def strays(ep) -> list[str]:
    """Processes in the container other than pid 1 and the harness's helpers."""
    return [p for p in ep.processes()[1:] if not any(h in p for h in HARNESS)]


def test_fail_fix_pass_and_the_protocol(docker_runtime):
    rt = docker_runtime
    b = bundle()
    with rt.episode(b) as ep:
        assert isinstance(ep, Episode) and rt.name == "docker"
        assert ep.commit == rt.snapshots.for_bundle(b).commit and ep.environment_digest.startswith("sha256:")
        assert ep.bundle is b and ep.limits is b.limits and ep.id
        rep = ep.run_tests([F2P, P2P])
        assert rep.infra_error is None and rep.outcomes == {F2P: "failed", P2P: "passed"}
        assert ep.diff() == "" and ep.changed_paths() == []
        assert ep.write_file("/repo/sub/../solution.py", FIXED) == "solution.py"
        rep = ep.run_tests([F2P, P2P], coverage=True)
        assert rep.outcomes == {F2P: "passed", P2P: "passed"} and rep.duration_s < 5
        assert 2 in rep.coverage[F2P]["solution.py"]
        assert rep.all_passed(b.fail_to_pass)
        assert ep.run_tests().outcomes == {F2P: "passed", P2P: "passed"}      # all tests
        # files, diff and the pristine copy
        ep.write_bytes("data/blob.bin", bytes(range(256)))
        assert ep.read_bytes("data/blob.bin") == bytes(range(256))
        ep.delete_file("tests/test_solution.py")
        assert ep.list_files() == ["data/blob.bin", "solution.py"]
        assert ep.changed_paths() == ["data/blob.bin", "solution.py", "tests/test_solution.py"]
        d = ep.diff()
        assert "-    return a - b\n+    return a + b" in d and "GIT binary patch" in d
        assert ep.pristine_bytes("solution.py") == BUGGY.encode()
        assert ep.pristine_bytes("tests/test_solution.py") == TESTS.encode()
        assert ep.pristine_bytes("data/blob.bin") is None
        assert ep.read_file("solution.py", max_chars=5) == "def a"
        with pytest.raises(FileNotFoundError):
            ep.read_file("tests/test_solution.py")
        # apply_patch, the agent's own git, a shell with stdin and env
        patch = ("--- a/solution.py\n+++ b/solution.py\n@@ -1,2 +1,3 @@\n def add(a, b):\n"
                 "     return a + b\n+# patched\n")
        r = ep.apply_patch(patch)
        assert r.ok, r.stderr
        assert ep.read_file("solution.py").endswith("# patched\n")
        assert ep.apply_patch("--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n").returncode != 0
        r = ep.run("git status --short; git log --all --oneline | wc -l")
        assert " M solution.py" in r.stdout and r.stdout.split()[-1] == "1"
        r = ep.run(["sh", "-c", "cat; echo $FOO; pwd"], stdin="in\n", env={"FOO": "bar"})
        assert r.stdout == "in\nbar\n/repo\n" and r.ok
        assert ep.disk_usage() > 0
        cid = ep.container.id
    assert ep.closed and not [c for c in rt.client.containers.list(all=True) if c.id == cid]
    with pytest.raises(RuntimeError):
        ep.run("true")


def test_path_helpers_refuse_escapes(docker_runtime):
    with docker_runtime.episode(bundle()) as ep:
        assert ep.run("ln -s /etc/passwd pw && ln -s ../../etc up && mkdir d && ln -s ../solution.py d/ok").ok
        for bad in ("../x", "/etc/passwd", "a/../../x", "pw", "up/passwd"):
            with pytest.raises(PathEscape):
                ep.read_file(bad)
        for bad in (".git/config", "pw", "../x"):
            with pytest.raises(PathEscape):
                ep.write_file(bad, "x")
        assert ep.read_file("d/ok") == BUGGY                 # an in-tree symlink is fine
        assert ep.run("head -1 /etc/passwd").stdout.startswith("root:")   # the container's own file


def test_repo_path_bundle_is_history_free(docker_runtime, tmp_path):
    up = tmp_path / "upstream"
    up.mkdir()

    def g(*a):
        return subprocess.run(["git", "-C", str(up), "-c", "user.name=t", "-c", "user.email=t@t", *a],
                              check=True, capture_output=True, text=True).stdout.strip()
    g("init", "-q")
    (up / "solution.py").write_text(BUGGY)
    (up / "tests").mkdir()
    (up / "tests" / "test_solution.py").write_text(TESTS)
    (up / "run.sh").write_text("#!/bin/sh\necho run\n")
    (up / "run.sh").chmod(0o755)
    g("add", "-A")
    g("commit", "-qm", "buggy")
    base = g("rev-parse", "HEAD")
    (up / "solution.py").write_text(FIXED)
    g("commit", "-qam", "the future fix")
    future = g("rev-parse", "HEAD")
    fix_patch = g("diff", base, future) + "\n"
    b = TaskBundle(task_id="repo", repo_path=str(up), commit=base, fail_to_pass=(F2P,))
    with docker_runtime.episode(b) as ep:
        assert ep.read_file("solution.py") == BUGGY
        r = ep.run(f"git log --all --oneline | wc -l; ./run.sh; "
                   f"git cat-file -e {future} && echo REACHABLE; "
                   f"git --git-dir=/.ratchet/git cat-file -e {future} && echo REACHABLE; "
                   f"git --git-dir=/.ratchet/git log --all --oneline | wc -l")
        assert r.stdout.split() == ["1", "run", "1"], r.stdout + r.stderr
        assert ep.run_tests([F2P]).outcomes == {F2P: "failed"}
        assert ep.apply_patch(fix_patch).ok
        assert ep.run_tests([F2P]).outcomes == {F2P: "passed"}
        assert ep.changed_paths() == ["solution.py"]
        assert "+    return a + b" in ep.diff()


def test_image_that_holds_the_repo_at_testbed(docker_runtime):
    """A SWE-bench-style image: the repository is already in /testbed (with its full history,
    future fix included); the bundle has no files. The episode sees the tree, not the history."""
    client = docker_runtime.client
    tag = f"ratchet-test-swebench:{uuid.uuid4().hex[:8]}"
    script = textwrap.dedent(f"""\
        set -e; mkdir -p /testbed/tests; cd /testbed
        printf '%s' '{BUGGY}' > solution.py
        printf '%s' '{TESTS}' > tests/test_solution.py
        G="git -c user.name=t -c user.email=t@t"
        $G init -q; $G add -A; $G commit -qm buggy
        printf '%s' '{FIXED}' > solution.py; $G commit -qam fix; $G checkout -q HEAD~1
        """)
    c = client.containers.create(docker_engine.BASE_IMAGE, ["sh", "-c", script], user="0",
                                 network_mode="none", labels={docker_engine.LABEL: "1"})
    try:
        c.start()
        assert c.wait(timeout=60)["StatusCode"] == 0, c.logs()
        repo, t = tag.split(":")
        c.commit(repository=repo, tag=t)
    finally:
        c.remove(force=True)
    try:
        b = TaskBundle(task_id="img", fail_to_pass=(F2P,))
        with docker_runtime.episode(b, image=tag) as ep:
            assert ep.workdir == "/testbed" and ep.read_file("solution.py") == BUGGY
            r = ep.run("pwd; git log --all --oneline | wc -l; git log -p --all | grep -c 'a + b'")
            assert r.stdout.split() == ["/testbed", "1", "0"], r.stdout + r.stderr
            assert ep.run_tests([F2P]).outcomes == {F2P: "failed"}
            ep.write_file("solution.py", FIXED)
            assert ep.run_tests([F2P]).outcomes == {F2P: "passed"}
            assert ep.changed_paths() == ["solution.py"] and ep.pristine_bytes("solution.py") == BUGGY.encode()
    finally:
        client.images.remove(tag, force=True)


def test_stale_containers_are_removed_at_start(docker_runtime, tmp_path):
    from sandboxes.docker_runtime import DockerRuntime
    c = docker_runtime.client.containers.create(
        docker_engine.BASE_IMAGE, ["true"], network_mode="none",
        labels={docker_engine.LABEL: "1", "ratchet.owner": f"{socket.gethostname()}:999999999:1",
                "ratchet.episode": "stale"})
    DockerRuntime(root=tmp_path)
    assert c.id not in {x.id for x in docker_runtime.client.containers.list(all=True)}


# ---------------------------------------------------------------------------- escape probes
@pytest.mark.security
def test_no_network_egress_or_dns(docker_runtime):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    hits, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                hits.append(srv.accept()[1])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    targets = ["127.0.0.1", "172.17.0.1"]
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            targets.append(ip)
    except OSError:
        pass
    probe = textwrap.dedent(f"""
        import os, socket
        for ip in {targets!r}:
            try:
                socket.create_connection((ip, {port}), timeout=1); print("CONNECTED", ip)
            except OSError as e: print("blocked", ip, type(e).__name__)
        try:
            socket.getaddrinfo("deb.debian.org", 80); print("RESOLVED")
        except OSError as e: print("nodns", type(e).__name__)
        print("ifaces", sorted(os.listdir("/sys/class/net")))
        """)
    try:
        with docker_runtime.episode(bundle()) as ep:
            r = ep.run(["python3", "-c", probe], timeout=20)
    finally:
        stop.set()
        t.join(2)
        srv.close()
    assert r.ok, r.stderr
    assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout and "nodns" in r.stdout
    assert r.stdout.count("blocked") == len(targets) and "ifaces ['lo']" in r.stdout
    assert hits == []


@pytest.mark.security
def test_writes_outside_the_workdir_fail(docker_runtime):
    targets = ["/x", "/etc/passwd", "/usr/bin/python3", "/usr/lib/x", "/var/tmp/x", "/root/x",
               "/home/x", "/opt/x", "/.ratchet/x", "/.ratchet/git/HEAD", "/.ratchet/pytest_worker.py",
               "/.ratchet/docker_ops.py", "/proc/sys/kernel/hostname", "/sys/kernel/x"]
    probe = textwrap.dedent(f"""
        import os
        for t in {targets!r}:
            try:
                with open(t, "a") as f:
                    f.write("x")
                print("WROTE", t)
            except OSError as e:
                print("blocked", t, e.errno)
        with open("/repo/ok.txt", "w") as f:
            f.write("fine")
        print("uid", os.getuid(), "caps", [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")],
              "nnp", [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")])
        """)
    with docker_runtime.episode(bundle()) as ep:
        r = ep.run(["python3", "-c", probe])
        assert "WROTE" not in r.stdout and r.stdout.count("blocked") == len(targets), r.stdout + r.stderr
        assert f"uid {docker_engine.SANDBOX_UID} caps ['0000000000000000'] nnp ['1']" in r.stdout
        assert ep.read_file("ok.txt") == "fine"
        assert ep.run("su -c true root </dev/null 2>&1; echo rc=$?").stdout.strip().endswith("rc=1")
    assert Path(docker_runtime.snapshots.for_bundle(bundle()).gitdir, "HEAD").exists()


@pytest.mark.security
def test_host_files_and_env_are_invisible(docker_runtime, tmp_path, monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"           # the content: must never show up
    name = f"ratchet-planted-{uuid.uuid4().hex}"     # the file name (error messages repeat it)
    planted = [tmp_path / name]
    for d in ("/srv", "/opt"):
        if os.access(d, os.W_OK):
            planted.append(Path(d) / name)
    for p in planted:
        p.write_text(secret)
    monkeypatch.setenv("RATCHET_TEST_SECRET", secret)
    project = Path(__file__).resolve().parents[2]
    try:
        with docker_runtime.episode(bundle()) as ep:
            paths = " ".join(str(p) for p in planted)
            r = ep.run(f"env; tr '\\0' '\\n' </proc/1/environ; for p in {paths}; do cat $p; done; "
                       f"find / -name '{name}*' -not -path '/proc/*' 2>/dev/null; "
                       f"ls {project} /work /root 2>&1; cat /proc/1/cmdline; echo END")
            assert r.stdout.rstrip().endswith("END"), r.stderr
            assert secret not in r.stdout and secret not in r.stderr and name not in r.stdout
            assert "RATCHET_TEST_SECRET" not in r.stdout and "No such file" in r.stdout
            # the only host paths mounted: the three helper scripts, the host's pytest (the same
            # for both runtimes) and the snapshot, read-only (plus the engine's
            # resolv.conf/hosts/hostname); mountinfo names their sources
            binds = {}
            for line in ep.run("cat /proc/self/mountinfo").stdout.splitlines():
                f = line.split()
                if f[3] != "/" and not f[4].startswith(("/proc", "/sys", "/dev")):
                    binds[f[4]] = f[5].split(",")[0]
            assert set(binds) == {"/.ratchet/pytest_worker.py", "/.ratchet/docker_ops.py", "/.ratchet/git",
                                  "/.ratchet/verdict_worker.py", "/.ratchet/site",
                                  "/etc/resolv.conf", "/etc/hostname", "/etc/hosts"}, binds
            assert {binds[p] for p in binds if p.startswith("/.ratchet")} == {"ro"}
            rep = ep.run_tests([F2P])       # the test worker's environment is the container's too
            assert rep.infra_error is None
            ep.write_file("tests/test_solution.py",
                          "import os\n\ndef test_add():\n    assert 'RATCHET_TEST_SECRET' not in os.environ\n")
            assert ep.run_tests([F2P]).outcomes == {F2P: "passed"}
    finally:
        for p in planted:
            p.unlink(missing_ok=True)


@pytest.mark.security
def test_fork_bomb_is_contained_and_cleaned_up(docker_runtime):
    with docker_runtime.episode(bundle(max_procs=32, wall_s=4)) as ep:
        assert ep.container.attrs["HostConfig"]["PidsLimit"] == 32
        assert ep.run_tests([P2P]).outcomes == {P2P: "passed"}           # a warm worker to keep
        # a shell bomb that returns at once: everything it left running is killed afterwards
        r = ep.run("bomb() { bomb | bomb & }; bomb; sleep 1")
        assert r.infra_error is None
        assert strays(ep) == []
        # a bomb that holds every pid until the wall timeout
        t0 = time.monotonic()
        r = ep.run(["python3", "-c", "import os, time\nwhile True:\n    try:\n        os.fork()\n"
                                      "    except OSError:\n        time.sleep(0.01)\n"])
        assert r.timed_out and r.infra_error is None and time.monotonic() - t0 < 15
        assert strays(ep) == []
        r = ep.run("echo alive")
        assert r.ok and r.stdout == "alive\n"
        assert ep.run_tests([P2P]).outcomes == {P2P: "passed"}


@pytest.mark.security
def test_memory_bomb_is_contained(docker_runtime):
    with docker_runtime.episode(bundle(memory_mb=256, wall_s=20)) as ep:
        r = ep.run(["python3", "-c", "x = b'a' * (1 << 30)\nprint('ALLOCATED', len(x))"])
        assert "ALLOCATED" not in r.stdout and r.returncode not in (0, None) and r.infra_error is None
        ep.write_file("tests/test_solution.py",
                      "def test_add():\n    x = b'a' * (1 << 30)\n    assert len(x) == 0\n")
        rep = ep.run_tests([F2P])
        assert rep.infra_error is None and rep.outcomes == {F2P: "error"}    # the agent's failure
        assert ep.health() is None and ep.run("echo ok").stdout == "ok\n"
        ep.write_file("tests/test_solution.py", TESTS)
        ep.write_file("solution.py", FIXED)
        assert ep.run_tests([F2P]).outcomes == {F2P: "passed"}             # later steps still count


@pytest.mark.security
def test_infinite_loops_time_out_and_leave_nothing_behind(docker_runtime):
    with docker_runtime.episode(bundle(wall_s=2)) as ep:
        t0 = time.monotonic()
        r = ep.run("while :; do :; done")
        assert r.timed_out and r.returncode is None and r.infra_error is None
        assert 1.9 < time.monotonic() - t0 < 6
        r = ep.run("setsid sh -c 'while :; do :; done' & sleep 60")
        assert r.timed_out
        assert strays(ep) == []
        assert ep.run("nohup sleep 600 >/dev/null 2>&1 &").ok          # returns, leaves a daemon
        assert strays(ep) == []
        ep.write_file("tests/test_solution.py", "def test_add():\n    while True:\n        pass\n")
        rep = ep.run_tests([F2P])
        assert rep.timed_out and rep.outcomes == {F2P: "error"} and rep.infra_error is None
        assert strays(ep) == []
        # the worker itself killed by the code under test: the agent's failure, not infra
        ep.write_file("tests/test_solution.py",
                      "import os, signal\n\ndef test_add():\n    os.kill(os.getppid(), signal.SIGKILL)\n")
        rep = ep.run_tests([F2P])
        assert rep.infra_error is None and rep.outcomes == {F2P: "error"}
        ep.write_file("tests/test_solution.py", TESTS)
        ep.write_file("solution.py", FIXED)
        assert ep.run_tests([F2P]).outcomes == {F2P: "passed"}


@pytest.mark.security
def test_destructive_command_is_contained_and_the_next_episode_is_clean(docker_runtime, tmp_path):
    canary = tmp_path / "canary"
    canary.write_text("still here")
    with docker_runtime.episode(bundle()) as ep:
        r = ep.run("rm -rf --no-preserve-root / 2>/dev/null; ls /usr/bin | wc -l; ls -A /repo | wc -l")
        system, left = (int(x) for x in r.stdout.split())
        assert system > 50 and left == 0                  # only the agent's own files went
        assert ep.run("python3 -c 'print(1)'").stdout == "1\n"
    assert canary.read_text() == "still here"
    assert Path(docker_runtime.snapshots.for_bundle(bundle()).gitdir, "HEAD").exists()
    assert Path(__file__).exists()
    with docker_runtime.episode(bundle()) as ep:
        assert ep.read_file("solution.py") == BUGGY and ep.changed_paths() == []
        assert ep.run_tests([F2P, P2P]).outcomes == {F2P: "failed", P2P: "passed"}


@pytest.mark.security
def test_disk_quota(docker_runtime):
    b = bundle(disk_mb=32)
    quota = getattr(b.limits, "disk_mb", 256) * 2**20
    probe = textwrap.dedent("""
        import errno
        total, i = 0, 0
        try:
            while True:
                with open(f"/repo/junk{i}.bin", "wb") as f:
                    for _ in range(4):
                        f.write(b"x" * (1 << 20)); f.flush(); total += 1 << 20
                i += 1
        except OSError as e:
            print("ERRNO", errno.errorcode.get(e.errno), total)
        """)
    with docker_runtime.episode(b) as ep:
        r = ep.run(["python3", "-c", probe], timeout=30)
        err, total = r.stdout.split()[1], int(r.stdout.split()[2])
        assert err in ("ENOSPC", "EDQUOT") and quota - 2**20 * 2 <= total <= quota, r.stdout + r.stderr
        assert ep.disk_usage() >= quota - 2**20 * 2
        with pytest.raises(OSError) as ei:
            ep.write_bytes("more.bin", b"x" * 2**20)
        assert ei.value.errno == 28
        r = ep.run("for i in 1 2 3 4 5 6 7 8; do head -c 10M /dev/zero > /tmp/big$i || break; done; "
                   "du -sm /tmp | cut -f1")                       # /tmp: its own 64 MiB tmpfs
        assert "No space left" in r.stderr and int(r.stdout) <= 64, r.stdout + r.stderr
        assert ep.run("rm -f junk*.bin /tmp/big*").ok
        assert ep.write_file("small.txt", "ok") == "small.txt" and ep.read_file("small.txt") == "ok"


@pytest.mark.security
def test_the_agents_git_metadata_is_never_trusted(docker_runtime):
    """The agent owns the workdir's .git: committing its change, planting an fsmonitor or a
    hook there, must neither hide the change from diff/changed_paths nor run anything."""
    with docker_runtime.episode(bundle()) as ep:
        ep.write_file("solution.py", FIXED)
        r = ep.run("git -c user.name=a -c user.email=a@a commit -qam 'nothing to see' && "
                   "git status --short | wc -l && "
                   "git config core.fsmonitor 'touch /repo/PWNED; false' && "
                   "printf '#!/bin/sh\\ntouch /repo/PWNED\\n' > .git/hooks/pre-commit && "
                   "chmod +x .git/hooks/pre-commit")
        assert r.ok and r.stdout.strip() == "0", r.stdout + r.stderr    # clean in its own eyes
        assert ep.changed_paths() == ["solution.py"]
        assert "+    return a + b" in ep.diff() and ".git/" not in ep.diff()
        assert "PWNED" not in ep.list_files()
        assert ep.pristine_bytes("solution.py") == BUGGY.encode()
        # an empty nested repository and unreadable files cannot break (and so void) the diff
        assert ep.run("mkdir -p tests/inner && git -C tests/inner init -q && chmod 000 solution.py tests").ok
        assert ep.changed_paths() == ["solution.py"]
        assert ep.run("chmod 000 solution.py tests").ok
        assert ep.read_file("solution.py") == FIXED and "tests/test_solution.py" in ep.list_files()


def test_the_cpu_limit_covers_the_final_test_run():
    """RLIMIT_CPU is max(cpu_s, wall_s, verify_s), as under bwrap: a correct fix whose final test
    run needs more CPU than cpu_s is not killed by SIGXCPU (it was, and scored 0)."""
    from sandboxes.docker_io import _ulimits
    cpu = {u["Name"]: u for u in _ulimits(Limits(wall_s=30, cpu_s=40, verify_s=120))}["cpu"]
    assert cpu["Soft"] == 120


def test_a_final_test_run_longer_than_cpu_s_completes(docker_runtime):
    burn = ("import time\n\n\ndef test_burn():\n    t = time.process_time()\n"
            "    while time.process_time() - t < 3.0:\n        pass\n")
    b = TaskBundle(task_id="docker-cpu", files={"test_burn.py": burn}, fail_to_pass=("test_burn.py::test_burn",),
                   limits=limits(wall_s=2, cpu_s=2, verify_s=15))
    with docker_runtime.episode(b) as ep:
        rep = ep.run_tests(list(b.fail_to_pass), timeout=b.limits.verify_s)
        assert rep.outcomes == {"test_burn.py::test_burn": "passed"}, (rep.agent_fault, rep.output[-500:])
