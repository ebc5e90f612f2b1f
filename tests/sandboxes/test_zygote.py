"""Workers forked from the zygote (`sandboxes.zygote`) must be indistinguishable, to the code under
test, from workers started inside the sandbox by bwrap: the same uid, groups, capabilities,
limits, filesystem, hostname, network, environment and descriptors, nothing of the host's
processes, and gone with their sandbox."""
import json
import os
import textwrap
import time

import psutil
import pytest

from sandboxes.bundle import TaskBundle
from sandboxes.runtime import LocalRuntime

pytestmark = [pytest.mark.security,
              pytest.mark.skipif(os.geteuid() != 0, reason="the zygote needs root (setns); without it "
                                                            "every worker starts inside the sandbox")]

PROBE = textwrap.dedent('''
    import json, os, re, socket, sys

    def test_probe():
        keys = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
        status = {k: v.strip() for k, _, v in (l.partition(":") for l in open("/proc/self/status")) if k in keys}
        procs = {}
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    procs[int(p)] = (open(f"/proc/{p}/comm").read().strip(),
                                     int(open(f"/proc/{p}/status").read().split("Uid:")[1].split()[0]))
                except OSError:
                    pass
        try:
            socket.create_connection(("10.255.255.1", 80), timeout=1)
            net = "connected"
        except OSError as e:
            net = type(e).__name__ + str(e.errno)
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds.append(re.sub(r"[0-9]+", "N", os.readlink(f"/proc/self/fd/{fd}")))
            except OSError:
                pass                        # the listing's own descriptor
        fds.sort()
        mounts = sorted(l.split()[4] for l in open("/proc/self/mountinfo"))
        umask = os.umask(0o22); os.umask(umask)
        facts = {"status": status, "limits": open("/proc/self/limits").read(), "env": dict(os.environ),
                 "root": sorted(os.listdir("/")), "cwd": os.getcwd(), "host": socket.gethostname(), "net": net,
                 "fds": fds, "mounts": mounts, "umask": umask, "path": sys.path, "hash": hash("ratchet"),
                 "procs": sorted(procs.values()), "home": sorted(os.listdir(os.environ["HOME"])),
                 "tmp": sorted(re.sub(r"[0-9]+", "N", n) for n in os.listdir("/tmp"))}   # the worker's pid
        open("/repo/facts.json", "w").write(json.dumps(facts))
''')


def bundle():
    return TaskBundle(task_id="zygote", files={"solution.py": "X = 1\n", "test_probe.py": PROBE},
                      fail_to_pass=("test_probe.py::test_probe",))


def facts(rt) -> tuple[dict, int]:
    with rt.episode(bundle()) as ep:
        rep = ep.run_tests(["test_probe.py::test_probe"])
        assert rep.outcomes == {"test_probe.py::test_probe": "passed"}, rep.output
        return json.loads(ep.read_bytes("facts.json")), ep.uid


def test_a_forked_worker_sees_what_a_worker_started_in_the_sandbox_sees(tmp_path, monkeypatch):
    rt = LocalRuntime(tmp_path / "rt")
    z = rt.zygote()
    before = z.spawned, z.failed
    forked, uid = facts(rt)
    assert (z.spawned, z.failed) == (before[0] + 1, before[1]), z.last_error     # it really was used
    monkeypatch.setenv("RATCHET_ZYGOTE", "0")
    assert rt.zygote() is None
    started, uid2 = facts(rt)
    assert z.spawned == before[0] + 1
    assert forked["status"]["Uid"].split() == [str(uid)] * 4 and forked["status"]["CapEff"] == "0" * 16
    assert forked["status"]["NoNewPrivs"] == "1" and forked["status"]["Groups"] == ""
    # the per-episode uid differs by design; everything else must be equal
    for f, u in ((forked, uid), (started, uid2)):
        f["status"]["Uid"] = f["status"]["Uid"].replace(str(u), "UID")
        f["procs"] = sorted([c, "UID" if pu == u else pu] for c, pu in f["procs"])
    # the one visible difference: the placeholder that holds the zygote worker's namespace
    placeholder = ["sleep", "UID"]
    assert placeholder in forked["procs"] and placeholder not in started["procs"]
    forked["procs"].remove(placeholder)
    for key in started:
        assert forked[key] == started[key], key
    assert forked["net"].startswith("OSError") and forked["host"] == "sandbox"


def test_a_forked_worker_dies_with_its_sandbox_and_leaves_nothing(tmp_path):
    rt = LocalRuntime(tmp_path / "rt")
    daemon = textwrap.dedent('''
        import subprocess
        def test_daemon():
            subprocess.Popen(["setsid", "sleep", "300"])
    ''')
    b = TaskBundle(task_id="zygote-daemon", files={"solution.py": "X = 1\n", "test_d.py": daemon},
                   fail_to_pass=("test_d.py::test_daemon",))
    with rt.episode(b) as ep:
        assert ep.run_tests(["test_d.py::test_daemon"]).outcomes == {"test_d.py::test_daemon": "passed"}
        worker = ep._worker.proc
        assert type(worker).__name__ == "ZygoteProc"
        # the daemon was killed after the run (the worker keeps only its namespace's init and placeholder)
        left = [p.info["cmdline"] for p in psutil.process_iter(["uids", "cmdline"])
                if p.info["uids"] and p.info["uids"].real == ep.uid]
        assert ["sleep", "infinity"] in left and ["sleep", "300"] not in left, left
        assert ep.run_tests(["test_d.py::test_daemon"]).outcomes == {"test_d.py::test_daemon": "passed"}
        uid, pid = ep.uid, worker.worker_pid
    def left():
        return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    deadline = time.monotonic() + 2         # the namespace dies asynchronously; the zygote reaps on SIGCHLD
    while left() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert left() == [] and not psutil.pid_exists(pid)


def test_the_zygote_cannot_be_reached_from_a_sandbox(tmp_path):
    """The zygote runs as root on the host: no descriptor, process or signal of it reaches a worker."""
    rt = LocalRuntime(tmp_path / "rt")
    facts(rt)                               # starts the zygote
    zpid = rt.zygote()._proc.pid
    probe = textwrap.dedent(f'''
        import os
        def test_reach():
            assert not os.path.exists("/proc/{zpid}/cmdline") or "zygote" not in open("/proc/{zpid}/cmdline").read()
            try:
                os.kill({zpid}, 9)
                raise AssertionError("signalled the zygote")
            except (ProcessLookupError, PermissionError):
                pass
    ''')
    b = TaskBundle(task_id="zygote-reach", files={"solution.py": "X = 1\n", "test_r.py": probe},
                   fail_to_pass=("test_r.py::test_reach",))
    with rt.episode(b) as ep:
        rep = ep.run_tests(["test_r.py::test_reach"])
    assert rep.outcomes == {"test_r.py::test_reach": "passed"}, rep.output
    assert rt.zygote()._proc.poll() is None


def test_the_zygote_outlives_the_thread_that_started_it(tmp_path):
    """The policy runner starts sandboxes from pool threads that end with each batch: the zygote
    must stay (one warm-up per process), not be restarted for every batch."""
    import threading
    rt = LocalRuntime(tmp_path / "rt")
    z = rt.zygote()
    z.close()                               # a zygote started below, from a thread that then ends
    t = threading.Thread(target=facts, args=(rt,))
    t.start()
    t.join()
    pid = z._proc.pid
    facts(rt)
    assert z._proc.pid == pid and z._proc.poll() is None
