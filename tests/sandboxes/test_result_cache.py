"""The test-result cache (sandboxes.result_cache): a result is reused only for an exact repeat
(same task, same history of files and runs, same request), never for a run that left state
behind, timed out or ended the history with an arbitrary command; verification reuses by the
carried files; a broken cache file never fails an episode."""
import sqlite3

import pytest

from sandboxes.runtime import LocalRuntime
from sandboxes.verify import verify
from tests.sandboxes.test_runtime import FIX, bundle

pytestmark = pytest.mark.security

IDS = ["test_solution.py::test_add", "test_solution.py::test_zero"]


@pytest.fixture()
def rt(tmp_path):
    return LocalRuntime(tmp_path / "rt", test_cache=tmp_path / "cache.sqlite")


def _same(a, b) -> bool:
    return (a.outcomes, a.coverage, a.exit_code, a.timed_out, a.infra_error) == \
        (b.outcomes, b.coverage, b.exit_code, b.timed_out, b.infra_error)


def test_an_exact_repeat_is_reused_without_a_sandbox(rt):
    b = bundle()
    with rt.episode(b) as ep:
        first = [ep.run_tests(coverage=True)]
        ep.write_file("solution.py", FIX)
        first.append(ep.run_tests(IDS))
    assert rt.test_cache.stats() == {"test_cache_hits": 0, "test_cache_misses": 2, "test_cache_stored": 2}
    with rt.episode(b) as ep:
        again = [ep.run_tests(coverage=True)]
        ep.write_file("solution.py", FIX)
        again.append(ep.run_tests(IDS))
        assert not ep._spawned                   # no sandbox process was started at all
    assert rt.test_cache.hits == 2
    assert all(_same(x, y) for x, y in zip(first, again))
    assert first[0].outcomes["test_solution.py::test_add"] == "failed" and again[1].all_passed(IDS)


def test_other_files_or_another_request_are_run_for_real(rt):
    b = bundle()
    with rt.episode(b) as ep:
        ep.write_file("solution.py", FIX)
        assert ep.run_tests(IDS).all_passed(IDS)
    with rt.episode(b) as ep:                   # the stored pass never stands for a wrong fix
        ep.write_file("solution.py", FIX.replace("a + b", "a + b + 1"))
        rep = ep.run_tests(IDS)
        assert rep.outcomes == {IDS[0]: "failed", IDS[1]: "failed"}
    with rt.episode(b) as ep:                   # the same files, a different request
        ep.write_file("solution.py", FIX)
        assert ep.run_tests(IDS[:1]).outcomes == {IDS[0]: "passed"}
    with rt.episode(b) as ep:                   # the same final file, written in two steps
        ep.write_file("solution.py", "x = 1\n")
        ep.write_file("solution.py", FIX)
        assert ep.run_tests(IDS).all_passed(IDS)
    assert rt.test_cache.hits == 0


def test_a_run_that_leaves_state_behind_is_never_reused(rt):
    b = bundle()
    writes_worktree = FIX + "open('/repo/made_by_tests.txt', 'a').write('x')\n"
    writes_tmp = FIX + "import os\nopen(os.path.join(os.environ.get('TMPDIR', '/tmp'), 'flag'), 'a').write('x')\n"
    # rewrites a file in place with the same size and puts its mtime back: only the ctime shows it
    covers_tracks = FIX + ("import os\np = '/repo/notes.txt'\nst = os.stat(p)\n"
                           "old = open(p).read()\nopen(p, 'w').write('B' if old == 'A' else 'A')\n"
                           "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n")
    for code in (writes_worktree, writes_tmp, covers_tracks):
        for _ in range(2):
            with rt.episode(b) as ep:
                ep.write_file("notes.txt", "A")
                ep.write_file("solution.py", code)
                assert ep.run_tests(IDS).all_passed(IDS)
    assert rt.test_cache.hits == 0 and rt.test_cache.stored == 0


def test_timeouts_and_arbitrary_commands_end_reuse(rt):
    b = bundle()
    for _ in range(2):
        with rt.episode(b) as ep:
            ep.write_file("solution.py", "def add(a, b):\n    while True:\n        pass\n")
            assert ep.run_tests(IDS, timeout=2).timed_out
    assert rt.test_cache.stored == 0
    for _ in range(2):
        with rt.episode(b) as ep:
            ep.run("echo hi > note.txt")             # not declared deterministic: no reuse after it
            ep.run_tests(IDS)
            ep.run_tests(IDS)
    assert rt.test_cache.hits == 0 and rt.test_cache.stored == 0
    for _ in range(2):                              # a declared-deterministic command keeps it
        with rt.episode(b) as ep:
            assert ep.run(["grep", "-rn", "add", "."], deterministic=True).returncode == 0
            ep.run_tests(IDS)
    assert rt.test_cache.hits == 1


def test_verification_is_reused_by_the_carried_files(rt):
    b = bundle()
    results = []
    for code in (FIX, FIX, FIX.replace("+", "*")):
        with rt.episode(b) as ep:
            ep.write_file("solution.py", code)
            v = verify(rt, b, ep)
            results.append({t: v.outcomes[t] for t in IDS})
    assert results[0] == results[1] == {IDS[0]: "passed", IDS[1]: "passed"}
    assert results[2] == {IDS[0]: "failed", IDS[1]: "passed"}
    assert rt.test_cache.hits == 1


def test_a_broken_or_locked_cache_file_never_fails_an_episode(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.warns(UserWarning, match="going on in memory"):
        rt = LocalRuntime(tmp_path / "rt", test_cache=bad)
    with rt.episode(bundle()) as ep:
        ep.write_file("solution.py", FIX)
        assert ep.run_tests(IDS).all_passed(IDS)
    path = tmp_path / "locked.sqlite"
    LocalRuntime(tmp_path / "rt2", test_cache=path)            # creates it
    holder = sqlite3.connect(str(path))
    holder.execute("BEGIN EXCLUSIVE")
    rt = LocalRuntime(tmp_path / "rt3", test_cache=path)
    rt.test_cache._file.timeout = 0.2
    rt.test_cache._file._db.execute("PRAGMA busy_timeout = 200")
    with rt.episode(bundle()) as ep, pytest.warns(UserWarning, match="going on in memory"):
        ep.write_file("solution.py", FIX)
        assert ep.run_tests(IDS).all_passed(IDS)
    holder.rollback()
    holder.close()


def test_threads_share_one_cache_file_safely(tmp_path):
    """Episodes step in threads: concurrent reads and writes on one store neither fail nor crash
    (before the store's lock: SQLITE_LOCKED at once, and a segfault when one thread closed the
    connection after that error while another was inside execute)."""
    import threading
    import warnings

    from sandboxes.kvfile import KVFile

    kv = KVFile(tmp_path / "kv.sqlite")
    errors = []

    def work(t):
        try:
            for i in range(300):
                kv.put_many([(f"{t}-{i}".encode(), str(i))])
                assert kv.get(f"{t}-{i}".encode()) == str(i)
                kv.get(f"{(t + 1) % 8}-{i}".encode())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error")                # a fallback to memory would be a failure here
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors and kv.usable
    assert all(kv.get(f"{t}-299".encode()) == "299" for t in range(8))


def test_the_same_run_asked_at_once_by_threads_runs_once(rt):
    """The seeds of a task step together: the second asker waits for the first's run."""
    from concurrent.futures import ThreadPoolExecutor

    b = bundle()

    def episode(_):
        with rt.episode(b) as ep:
            ep.write_file("solution.py", FIX)
            return ep.run_tests(IDS, coverage=True)

    with ThreadPoolExecutor(3) as pool:
        reps = list(pool.map(episode, range(3)))
    assert all(r.all_passed(IDS) and _same(r, reps[0]) for r in reps)
    assert rt.test_cache.stats() == {"test_cache_hits": 2, "test_cache_misses": 1, "test_cache_stored": 1}


def test_the_health_probe_always_runs_for_real(rt):
    """Whose fault an infra error was is decided by a probe of the sandbox now: never a stored answer."""
    assert rt.health_probe() is None and rt.health_probe() is None
    assert rt.test_cache.hits == 0 and rt.test_cache.stored == 0


def test_a_reused_run_is_priced_at_what_it_took_when_made(rt):
    """sandbox_s (what economics prices) must not depend on which policy ran a task first: a reused
    run counts the seconds it took when it was made."""
    from sandboxes.env import RepairEnv

    def episode():
        with RepairEnv(bundle(), runtime=rt) as env:
            env.reset()
            env.step("localize", {})
            env.step("edit", {"path": "solution.py", "old": "a - b", "new": "a + b"})
            env.step("run_tests", {"tests": IDS})
            env.step("submit", {"explanation": "add subtracted: solution.py line 2 now adds"})
            return env.sandbox_s, env.reward.components["tests"]

    made, tests_made = episode()
    hits = rt.test_cache.hits
    reused, tests_reused = episode()
    assert rt.test_cache.hits - hits == 3 and tests_made == tests_reused == 1.0   # localize, run_tests, verify
    # the real parts (edits, worktrees) run again; a stopped worker's teardown is not re-counted
    assert reused >= 0.6 * made and made > 0.1


def test_read_only_mounts_in_scratch_are_listed_but_not_walked(tmp_path):
    """The worker's /tmp walk (`scratch_changed`) must not descend into what bwrap binds read-only
    there: a venv in a clone under /tmp (CI, a fresh checkout) sat inside the sandbox's /tmp and
    was walked twice per test run, ~10x slower evaluations. What a run can write is still seen:
    /tmp itself, a writable mount inside the read-only one (a tmpfs over a hidden path), and a
    writable mount on another device ($HOME's tmpfs under the read-only /home), and /dev/shm
    (writable when the sandbox runs as the caller's uid, as here: uid 0 in the spec)."""
    import json
    import os
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from sandboxes.isolation import Bwrap, SandboxSpec, bwrap_selftest

    if bwrap_selftest():
        pytest.skip(bwrap_selftest())
    ro = Path(tempfile.mkdtemp(dir="/tmp", prefix="ratchet-ro-"))   # under /tmp: so is its bind inside
    try:
        for i in range(50):
            (ro / f"d{i % 5}").mkdir(exist_ok=True)
            (ro / f"d{i % 5}" / f"f{i}.py").write_text("x = 1\n")
        work = tmp_path / "work"
        work.mkdir()
        os.chmod(work, 0o777)
        worker = str(Path(__file__).resolve().parents[2] / "sandboxes" / "pytest_worker.py")
        code = ("import json, os, sys; sys.path.insert(0, '/.ratchet'); from pytest_worker import file_states\n"
                "ro = sys.argv[1]\n"
                "def paths(tops): return [p for p, *_ in file_states(tops)]\n"
                "from pytest_worker import _scratch_state\n"
                "before, home0, scratch0 = paths(['/tmp']), paths(['/home']), _scratch_state('')\n"
                "for f in ('/tmp/left.txt', ro + '/d1/left.txt', os.environ['HOME'] + '/left.txt'):\n"
                "    try: open(f, 'w').write('x')\n"
                "    except OSError: pass\n"
                "after, home1, scratch1 = paths(['/tmp']), paths(['/home']), _scratch_state('')\n"
                "open('/dev/shm/left.txt', 'w').write('x')\n"
                "print(json.dumps([ro in before, sum(p.startswith(ro + '/d0/') for p in before),\n"
                "                  '/tmp/left.txt' in after, ro + '/d1/left.txt' in after,\n"
                "                  os.path.exists(ro + '/d1/left.txt'), home0 != home1,\n"
                "                  scratch0 != scratch1, scratch1 != _scratch_state('')]))")
        spec = SandboxSpec(workdir=str(work), ro_binds=(str(ro),), hide=(str(ro / "d1"),),
                           tool_files={"pytest_worker.py": worker})
        r = Bwrap(spec).run([sys.executable, "-c", code, str(ro)], timeout=60)
        assert r.returncode == 0, r.stderr
        listed, inside, tmp_seen, cover_seen, cover_written, home_seen, scratch_moved, shm_seen = \
            json.loads(r.stdout)
        assert scratch_moved and shm_seen       # the worker's own check sees /tmp, $HOME, /dev/shm
        assert listed and inside == 0           # the mount point is listed, nothing below it
        assert tmp_seen and home_seen           # a file left in /tmp or $HOME is seen
        assert cover_seen == cover_written      # a write into the writable cover is seen
        # the same tree, writable on the host: walked in full (only read-only mounts are skipped)
        from sandboxes.pytest_worker import file_states
        assert len(file_states([str(ro)])) == 55
    finally:
        shutil.rmtree(ro, ignore_errors=True)
