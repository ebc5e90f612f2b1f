"""Local runtime: worktrees, commands, the warm pytest worker, diffs, cleanup."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from sandboxes.bundle import Limits, TaskBundle
from sandboxes.runtime import LocalRuntime, PathEscape

FILES = {
    "solution.py": "def add(a, b):\n    return a - b\n",
    "test_solution.py": textwrap.dedent("""\
        from solution import add

        def test_add():
            assert add(1, 2) == 3

        def test_zero():
            assert add(0, 0) == 0
        """),
}
FIX = "def add(a, b):\n    return a + b\n"


def bundle(**kw):
    kw.setdefault("files", FILES)
    return TaskBundle(task_id="t-add", fail_to_pass=("test_solution.py::test_add",),
                      pass_to_pass=("test_solution.py::test_zero",), **kw)


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    return LocalRuntime(tmp_path_factory.mktemp("rt"))


def test_episode_worktree_is_pinned_and_clean(rt):
    with rt.episode(bundle()) as ep:
        assert ep.list_files() == ["solution.py", "test_solution.py"]
        assert ep.read_file("solution.py") == FILES["solution.py"]
        r = ep.run("pwd; git log --all --format=%H; git status --porcelain; echo $PYTHONHASHSEED")
        assert r.ok and r.infra_error is None
        pwd, sha, seed = r.stdout.split()
        assert pwd == "/repo" and sha == ep.commit and seed == "0"
        assert ep.changed_paths() == [] and ep.diff() == ""
        wt = ep.workdir
        assert os.path.isdir(wt)
    assert not os.path.exists(wt)


def test_run_reports_exit_code_timeout_and_stdin(rt):
    with rt.episode(bundle()) as ep:
        r = ep.run("echo out; echo err >&2; exit 7")
        assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.infra_error) == (7, "out\n", "err\n", False, None)
        assert ep.run(["cat"], stdin="hello").stdout == "hello"
        t0 = time.monotonic()
        r = ep.run("sleep 30", timeout=0.5)
        assert r.timed_out and r.returncode is None and r.infra_error is None
        assert time.monotonic() - t0 < 5


def test_output_is_capped(rt):
    with rt.episode(bundle(limits=Limits(max_output_chars=100))) as ep:
        r = ep.run("yes | head -c 1000000")
        assert r.returncode == 0 and len(r.stdout) < 300 and "truncated" in r.stdout


def test_run_tests_outcomes_fix_and_coverage(rt):
    b = bundle()
    with rt.episode(b) as ep:
        rep = ep.run_tests()
        assert rep.infra_error is None
        assert rep.outcomes == {"test_solution.py::test_add": "failed", "test_solution.py::test_zero": "passed"}
        ep.write_file("solution.py", FIX)
        rep = ep.run_tests(list(b.fail_to_pass + b.pass_to_pass), coverage=True)
        assert rep.all_passed(b.fail_to_pass + b.pass_to_pass)
        assert rep.coverage["test_solution.py::test_add"]["solution.py"] == {1, 2}
        assert ep.run_tests(["test_solution.py::test_missing"]).outcomes["test_solution.py::test_missing"] == "error"


def test_run_tests_timeout_and_hash_seed(rt):
    files = dict(FILES, **{"test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(60)\n",
                           "test_seed.py": "import os\n\ndef test_seed():\n    assert hash('x') == %d\n"
                           % int(subprocess.run([sys.executable, "-c", "print(hash('x'))"],
                                                env={"PYTHONHASHSEED": "0"}, capture_output=True,
                                                text=True).stdout)})
    with rt.episode(bundle(files=files)) as ep:
        assert ep.run_tests(["test_seed.py::test_seed"]).outcomes == {"test_seed.py::test_seed": "passed"}
        rep = ep.run_tests(["test_slow.py::test_slow"], timeout=1)
        assert rep.timed_out and rep.outcomes == {"test_slow.py::test_slow": "error"} and rep.infra_error is None
        # the worker survives a killed run
        assert ep.run_tests(["test_solution.py::test_zero"]).outcomes == {"test_solution.py::test_zero": "passed"}


def test_worker_runs_see_conftest_edits_the_tasks_ini_only_and_keep_builtin_plugins(rt):
    """The worker pre-builds pytest's config and caches its plugin fixture scan: the task's ini
    file, conftests, builtin fixtures and nested pytest.main must still behave as in a cold
    pytest. An ini file the agent writes is never read (`-c` names the task's own)."""
    files = dict(FILES, **{"test_more.py": textwrap.dedent("""\
        import warnings

        import pytest

        def test_builtin_fixtures(tmp_path, tmpdir, capsys, monkeypatch, recwarn, caplog,
                                  record_property, pytestconfig, request):
            monkeypatch.setenv("X_RATCHET", "1")
            print("hi")
            assert capsys.readouterr().out == "hi\\n"
            warnings.warn("w", UserWarning)
            assert len(recwarn) == 1 and tmp_path.is_dir() and tmpdir.isdir()
            assert pytestconfig.rootpath == request.config.rootpath

        def check_renamed():
            assert True

        def test_conftest_fixture(answer):
            assert answer == 42

        def test_nested_session(tmp_path):
            (tmp_path / "test_inner.py").write_text("def test_i():\\n    assert 1 == 2\\n")
            assert pytest.main(["-q", "-p", "no:cacheprovider", str(tmp_path)]) == 1

        @pytest.mark.skip(reason="s")
        def test_skipped():
            pass
        """)})
    with rt.episode(bundle(files=files)) as ep:
        more = lambda rep: {k: v for k, v in rep.outcomes.items() if k.startswith("test_more")}  # noqa: E731
        rep = ep.run_tests()
        assert more(rep) == {"test_more.py::test_builtin_fixtures": "passed",
                             "test_more.py::test_conftest_fixture": "error",
                             "test_more.py::test_nested_session": "passed",
                             "test_more.py::test_skipped": "skipped"}, rep.output
        ep.write_file("conftest.py", "import pytest\n\n@pytest.fixture\ndef answer():\n    return 42\n")
        for name in ("pytest.ini", "pytest.toml", ".pytest.toml", "setup.cfg", "tox.ini"):
            ep.write_file(name, "[pytest]\npython_functions = check_* test_*\naddopts = --no-such-option\n")
        rep = ep.run_tests()
        assert more(rep) == {"test_more.py::test_builtin_fixtures": "passed",
                             "test_more.py::test_conftest_fixture": "passed",
                             "test_more.py::test_nested_session": "passed",
                             "test_more.py::test_skipped": "skipped"}, rep.output
        assert rep.exit_code == 1 and "no-such-option" not in rep.output
        for name in ("pytest.ini", "pytest.toml", ".pytest.toml", "setup.cfg", "tox.ini"):
            ep.delete_file(name)
        ep.write_file("test_exit.py", "import os\n\ndef test_exit():\n    os._exit(3)\n")
        rep = ep.run_tests(["test_exit.py::test_exit"])
        # the agent's own code killed the run: its failure (scored), not the harness's
        assert rep.infra_error is None and "without a result" in rep.agent_fault
        assert rep.outcomes == {"test_exit.py::test_exit": "error"}
        for _ in range(3):     # the spare children keep serving
            rep = ep.run_tests(list(bundle().fail_to_pass + bundle().pass_to_pass))
            assert rep.outcomes == {"test_solution.py::test_add": "failed",
                                    "test_solution.py::test_zero": "passed"}


def test_the_tasks_own_ini_is_the_one_read(rt):
    """A task's pytest configuration (here in setup.cfg, as pinned) is honoured; an agent's edit of
    it is not (the run reads the pinned copy, `sandboxes.pytest_config`)."""
    cfg = "[tool:pytest]\npython_functions = check_* test_*\n"
    files = dict(FILES, **{"setup.cfg": cfg, "test_more.py": "def check_renamed():\n    assert True\n"})
    with rt.episode(bundle(files=files)) as ep:
        assert ep.run_tests(["test_more.py"]).outcomes["test_more.py::check_renamed"] == "passed"
        ep.write_file("setup.cfg", "[tool:pytest]\naddopts = --no-such-option\n")
        rep = ep.run_tests(["test_more.py"])
        assert rep.outcomes["test_more.py::check_renamed"] == "passed", rep.output


def test_the_tasks_pythonpath_resolves_against_its_own_folder(rt):
    """pytest resolves `pythonpath` against the folder of the file it reads; the file it reads is
    a copy outside the repository, so the entries are passed resolved against the task's folder."""
    files = {"pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["src"]\n',
             "src/pkg_under_test.py": "VALUE = 3\n",
             "tests/test_pkg.py": "from pkg_under_test import VALUE\n\n\ndef test_value():\n    assert VALUE == 3\n"}
    with rt.episode(bundle(files=files)) as ep:
        rep = ep.run_tests(["tests/test_pkg.py::test_value"])
        assert rep.outcomes == {"tests/test_pkg.py::test_value": "passed"}, rep.output


def test_worker_crash_is_infra_and_recovers(rt):
    with rt.episode(bundle()) as ep:
        ep.run_tests(["test_solution.py::test_zero"])
        os.killpg(ep._worker.proc.pid, 9)
        ep._worker.proc.wait()
        rep = ep.run_tests(["test_solution.py::test_zero"])    # restarts transparently
        assert rep.infra_error is None and rep.outcomes["test_solution.py::test_zero"] == "passed"


def test_sandbox_start_failure_is_infra_not_policy(rt):
    """A sandbox that cannot come up (here: the bwrap binary vanished) is the harness's fault,
    after one retry; nothing of the agent's has run, so it is never scored."""
    with rt.episode(bundle()) as ep:
        ep._runner._prefix[0] = "/nonexistent/bwrap"
        r = ep.run("true")
        assert r.infra_error and "spawn failed" in r.infra_error
        rep = ep.run_tests()
        assert rep.infra_error and rep.agent_fault is None


def test_diff_and_changed_paths(rt):
    with rt.episode(bundle()) as ep:
        ep.write_file("solution.py", FIX)
        ep.write_file("pkg/new.py", "X = 1\n")
        ep.run("rm test_solution.py && python -c 'import solution'")   # would leave __pycache__
        assert ep.changed_paths() == ["pkg/new.py", "solution.py", "test_solution.py"]
        d = ep.diff()
        assert "+    return a + b" in d and "deleted file mode" in d and "+X = 1" in d


def make_repo(path):
    def g(*a):
        subprocess.run(["git", "-C", str(path), *a], check=True, capture_output=True,
                       env={**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
                            "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"})
    path.mkdir()
    g("init", "-q")
    (path / "calc.py").write_text("def mul(a, b):\n    return a + b\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text("from calc import mul\n\ndef test_mul():\n    assert mul(2, 3) == 6\n")
    g("add", ".")
    g("commit", "-qm", "buggy")
    base = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (path / "calc.py").write_text("def mul(a, b):\n    return a * b  # FIX-MARKER-7f3a\n")
    g("commit", "-qam", "fix")
    return base


def test_repo_bundle_pins_commit_and_caches_snapshot(rt, tmp_path):
    base = make_repo(tmp_path / "src")
    b = TaskBundle(task_id="calc", repo_path=str(tmp_path / "src"), commit=base,
                   fail_to_pass=("tests/test_calc.py::test_mul",))
    with rt.episode(b) as e1, rt.episode(b) as e2:
        assert e1.commit == e2.commit and e1.worktree.snapshot.gitdir == e2.worktree.snapshot.gitdir
        assert "a + b" in e1.read_file("calc.py")
        assert e1.run_tests(["tests/test_calc.py::test_mul"]).outcomes == {"tests/test_calc.py::test_mul": "failed"}
        e1.write_file("calc.py", "def mul(a, b):\n    return a * b\n")
        assert e1.changed_paths() == ["calc.py"] and e2.changed_paths() == []   # episodes are private


def test_reaper_cleans_up_after_killed_caller(rt):
    script = textwrap.dedent(f"""
        import os, sys
        from sandboxes.runtime import LocalRuntime
        from sandboxes.bundle import TaskBundle
        rt = LocalRuntime({str(rt.root)!r}, reap_stale=False)
        ep = rt.episode(TaskBundle(task_id="x", files={{"a.py": "x = 1\\n"}}))
        print(ep.workdir, flush=True)
        os.kill(os.getpid(), 9)
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=os.getcwd())
    wt = r.stdout.strip()
    assert r.returncode == -9 and os.path.isdir(wt), r.stderr
    with rt.episode(bundle()) as live:
        reaped = rt.reap()
        assert os.path.basename(os.path.dirname(wt)) in reaped
        assert not os.path.exists(wt)
        assert os.path.isdir(live.workdir)      # a live episode is never reaped


def test_fails_closed_without_bwrap(tmp_path):
    code = f"from sandboxes.runtime import LocalRuntime\nLocalRuntime({str(tmp_path)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PATH": str(tmp_path), "PYTHONPATH": os.getcwd()})
    assert r.returncode != 0 and "SandboxUnavailable" in r.stderr and "isolation='none'" in r.stderr


def test_isolation_none_is_explicit_and_loud(tmp_path):
    with pytest.warns(RuntimeWarning, match="DISABLED"):
        rt = LocalRuntime(tmp_path, isolation="none")
    with rt.episode(bundle()) as ep:
        r = ep.run("echo $HOME $PYTHONHASHSEED")
        home = r.stdout.split()[0]
        assert r.ok and r.stdout.split()[1] == "0" and home != os.environ.get("HOME")
        assert ep.run_tests().outcomes["test_solution.py::test_add"] == "failed"
        assert os.path.isdir(home)
    assert not os.path.exists(home)  # the episode's temporary home goes with it


def test_file_helpers_refuse_escapes(rt):
    with rt.episode(bundle()) as ep:
        for bad in ("../x", "/etc/passwd", "a/../../x"):
            with pytest.raises(PathEscape):
                ep.read_file(bad)
        with pytest.raises(PathEscape):
            ep.write_file(".git", "gitdir: /etc\n")
        assert ep.write_file("/repo/sub/../ok.py", "1\n") == "ok.py"


def test_runtimes_are_registered_by_name_and_conform_to_the_protocol(tmp_path):
    from sandboxes.protocol import Episode, Runtime, make_runtime
    rt = make_runtime("local", root=tmp_path / "rt")
    assert isinstance(rt, LocalRuntime) and isinstance(rt, Runtime)
    with rt.episode(bundle()) as ep:
        assert isinstance(ep, Episode)
        assert ep.pristine_bytes("solution.py") == FILES["solution.py"].encode()
        ep.write_bytes("solution.py", FIX.encode())
        assert ep.read_bytes("solution.py") == FIX.encode() and ep.disk_usage() > 0
        assert ep.pristine_bytes("solution.py") == FILES["solution.py"].encode()   # never the worktree
        assert ep.pristine_bytes("missing.py") is None
    with pytest.raises(ValueError, match="unknown sandbox runtime"):
        make_runtime("nonesuch")
