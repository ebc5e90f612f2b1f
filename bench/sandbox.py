"""Sandbox bench: episode setup+teardown and warm test runs vs the naive way.

Baselines, measured in the same run on the same tiny task:
* setup: `shutil.copytree` of the task + one cold `python -c pass` subprocess + rmtree;
* tests: a cold `python -m pytest` (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, -p no:cacheprovider).
Ours: `LocalRuntime.episode()` + `close()` (git worktree + lease, bwrap isolation), and
`Episode.run_tests(ids)` on the warm per-episode worker (fork per run, inside bwrap).

The machine is shared, so warm and cold test runs are interleaved (one cold run after every
few warm ones): both see the same load, and `ratio` (cold p50 / warm p50) does not depend on
when the load came and went. Warm-ups are excluded from the percentiles and reported on their
own: the first run of an episode (it starts the worker), the first few warm runs and the
first cold run (cold page cache). The final line is one JSON object.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes.bundle import TaskBundle  # noqa: E402
from sandboxes.runtime import LocalRuntime  # noqa: E402

FILES = {
    "solution.py": "def add(a, b):\n    return a - b\n",
    "test_solution.py": "from solution import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
                        "def test_zero():\n    assert add(0, 0) == 0\n",
}
IDS = ["test_solution.py::test_add", "test_solution.py::test_zero"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def ms(xs):
    return round(statistics.median(xs) * 1000, 1), round(pct(xs, 0.95) * 1000, 1)


def main(n_setup: int = 40, n_tests: int = 60, n_cold: int = 15, n_warmup: int = 3) -> dict:
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bench-"))
    try:
        src = tmp / "task"
        src.mkdir()
        for k, v in FILES.items():
            (src / k).write_text(v)
        rt = LocalRuntime(tmp / "rt")
        bundle = TaskBundle(task_id="bench-add", files=FILES, fail_to_pass=(IDS[0],), pass_to_pass=(IDS[1],))
        rt.episode(bundle).close()                       # build the snapshot once (cached after)

        ours = []
        for _ in range(n_setup):
            t0 = time.perf_counter()
            ep = rt.episode(bundle)
            ep.close()
            ours.append(time.perf_counter() - t0)

        base = []
        for i in range(max(n_setup // 4, 5)):
            t0 = time.perf_counter()
            dst = tmp / f"copy{i}"
            shutil.copytree(src, dst)
            subprocess.run([sys.executable, "-c", "pass"], cwd=dst, check=True)
            shutil.rmtree(dst)
            base.append(time.perf_counter() - t0)

        env = {"PATH": os.environ.get("PATH", ""), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
               "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp)}

        def cold_run() -> float:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *IDS],
                           cwd=src, env=env, capture_output=True)
            return time.perf_counter() - t0

        with rt.episode(bundle) as ep:
            t0 = time.perf_counter()
            first = ep.run_tests(IDS)
            first_s = time.perf_counter() - t0
            assert first.infra_error is None, first.infra_error
            warmup = []
            for _ in range(n_warmup):
                warmup.append(ep.run_tests(IDS).duration_s)
            cold_first = cold_run()
            runs, cold = [], []
            every = max(1, n_tests // n_cold)
            for i in range(n_tests):
                rep = ep.run_tests(IDS)
                assert rep.outcomes == {IDS[0]: "failed", IDS[1]: "passed"}, rep
                runs.append(rep.duration_s)
                if i % every == every - 1 and len(cold) < n_cold:
                    cold.append(cold_run())
            while len(cold) < n_cold:
                cold.append(cold_run())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    st50, st95 = ms(ours)
    b50, b95 = ms(base)
    tr50, tr95 = ms(runs)
    c50, c95 = ms(cold)
    rows = [("episode setup+teardown (worktree+bwrap)", st50, st95),
            ("baseline copytree + cold subprocess", b50, b95),
            ("test run, warm worker in bwrap", tr50, tr95),
            ("first test run (starts the worker)", round(first_s * 1000, 1), None),
            ("cold python -m pytest (interleaved)", c50, c95)]
    print(f"{'measure':<44}{'p50 ms':>10}{'p95 ms':>10}")
    for name, a, b in rows:
        print(f"{name:<44}{a:>10}{'' if b is None else b:>10}")
    out = {"bench": "sandbox", "cores": os.cpu_count(), "episodes": n_setup, "test_runs": n_tests,
           "setup_teardown_p50_ms": st50, "setup_teardown_p95_ms": st95,
           "baseline_setup_p50_ms": b50, "baseline_setup_p95_ms": b95,
           "test_run_p50_ms": tr50, "test_run_p95_ms": tr95,
           "test_run_min_ms": round(min(runs) * 1000, 1), "first_test_run_ms": round(first_s * 1000, 1),
           "warmup_runs_ms": [round(x * 1000, 1) for x in warmup],
           "cold_pytest_p50_ms": c50, "cold_pytest_p95_ms": c95, "cold_runs": len(cold),
           "cold_pytest_first_ms": round(cold_first * 1000, 1),
           "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
           "baseline": "cold python -m pytest", "ratio": round(c50 / tr50, 2),
           "setup_ratio_vs_copytree": round(b50 / st50, 2)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
