"""Environment-service bench: episodes/s through the HTTP service (`sandboxes.service`, a real
uvicorn server in its own process, driven by `sandboxes.service_client`) vs in-process `RepairEnv`
(threads of this process sharing one `LocalRuntime`), on the same tasks with the same scripted
action sequence, at 1 and at 16 concurrent clients.

Script per episode (a true fix, so every episode runs the pristine verification): read_file
solution.py, run_tests, apply_patch (the task's recorded fix), run_tests, submit. Both modes warm
up first (one episode per task: the snapshots, template checkouts and the zygote are built once
per runtime, outside the timing). The machine is shared, so the modes alternate, `--rounds` times
each, and the best round of each mode counts (the load it did not see is not its own cost).
`identical` says whether every episode's observations and reward matched the in-process ones.

    .venv/bin/python bench/envserver.py [--tasks 16] [--episodes 48] [--rounds 2] [--quick]

The final line is one JSON object; ratio = service episodes/s / in-process episodes/s at 16
concurrent clients (`ratio_1` at one).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def script(bundle) -> list[tuple[str, dict]]:
    m = bundle.metadata
    return [("read_file", {"path": "solution.py"}), ("run_tests", {}), ("apply_patch", {"patch": m["fix_diff"]}),
            ("run_tests", {}), ("submit", {"explanation": f"{m['entry_point']} line {m['fix']['line']}: "
                                                          f"{m['fix']['old']} should be {m['fix']['new']}"})]


def local_episode(bundle, runtime) -> tuple[list[str], dict]:
    from sandboxes.env import RepairEnv

    with RepairEnv(bundle, runtime=runtime) as env:
        env.reset()
        obs = [env.step(t, a) for t, a in script(bundle)]
        r = env.reward.to_dict()
    return obs, {k: r[k] for k in ("value", "status", "components")}


def remote_episode(bundle, client) -> tuple[list[str], dict]:
    with client.episode(bundle.task_id) as ep:
        obs = [ep.step(t, a) for t, a in script(bundle)]
        r = ep.reward()
    return obs, {"value": r["reward"], "status": r["status"], "components": r["components"]}


def timed(fn, jobs, concurrency: int) -> tuple[float, list]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        out = list(pool.map(fn, jobs))
    return time.monotonic() - t0, out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tasks_dir: Path, root: Path, max_episodes: int) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandboxes.service", "--tasks", str(tasks_dir), "--port", str(port),
                             "--max-episodes", str(max_episodes), "--idle-timeout", "120", "--sandbox-root", str(root),
                             "--log-level", "warning"], cwd=Path(__file__).resolve().parents[1],
                            stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode}")
        try:
            httpx.get(url + "/health", timeout=1).raise_for_status()
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the service did not answer within 60 s")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=16, help="HumanEval-derived tasks (one mutant per problem)")
    ap.add_argument("--episodes", type=int, default=48, help="episodes per measured run (the tasks cycled)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per mode; the best counts")
    ap.add_argument("--quick", action="store_true", help="8 tasks, 16 episodes, one round: the plumbing")
    a = ap.parse_args(argv)
    if a.quick:
        a.tasks, a.episodes, a.rounds = 8, 16, 1

    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime
    from sandboxes.service_client import EnvClient

    suite = build_suite(seed=0, limit=a.tasks, per_problem=1).tasks
    by_problem = {}
    for b in suite:
        by_problem.setdefault((b.metadata or {}).get("problem_id", b.repo), b)
    bundles = sorted(by_problem.values(), key=lambda b: b.task_id)[:a.tasks]
    jobs = [bundles[i % len(bundles)] for i in range(a.episodes)]
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ratchet-envserver-") as tmp:
        tmp = Path(tmp)
        (tmp / "tasks").mkdir()
        for b in bundles:
            b.save(tmp / "tasks" / f"{b.task_id}.json")
        rt = LocalRuntime(tmp / "rt-local")
        server, url = start_server(tmp / "tasks", tmp / "rt-service", max(a.concurrency))
        try:
            with EnvClient(url, max_connections=2 * max(a.concurrency)) as client:
                want = {b.task_id: local_episode(b, rt) for b in bundles}          # warm-up, both modes
                got = {b.task_id: remote_episode(b, client) for b in bundles}
                identical = want == got
                best: dict = {}
                for _ in range(a.rounds):
                    for c in a.concurrency:
                        for mode, fn in (("in_process", lambda b: local_episode(b, rt)),
                                         ("service", lambda b: remote_episode(b, client))):
                            wall, outs = timed(fn, jobs, c)
                            identical &= all(o == want[b.task_id] for b, o in zip(jobs, outs))
                            best[(mode, c)] = min(wall, best.get((mode, c), float("inf")))
                health = client.health()
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    assert health["open_episodes"] == 0, health

    n = len(jobs)
    eps = {k: n / v for k, v in best.items()}
    print(f"envserver bench: {len(bundles)} tasks, {n} episodes per run x {len(script(bundles[0]))} steps, "
          f"best of {a.rounds} round(s), {os.cpu_count()} cores")
    print(f"{'clients':>8s} {'in-process eps/s':>18s} {'service eps/s':>15s} {'ratio':>7s}")
    for c in a.concurrency:
        print(f"{c:8d} {eps[('in_process', c)]:18.2f} {eps[('service', c)]:15.2f} "
              f"{eps[('service', c)] / eps[('in_process', c)]:7.2f}")
    out = {"bench": "envserver", "cores": os.cpu_count(), "tasks": len(bundles), "episodes": n,
           "steps_per_episode": len(script(bundles[0])), "rounds": a.rounds, "quick": a.quick,
           "identical": identical, "baseline": "in-process RepairEnv (threads, one LocalRuntime)",
           "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    for c in a.concurrency:
        out[f"in_process_eps_per_s_{c}"] = round(eps[("in_process", c)], 3)
        out[f"service_eps_per_s_{c}"] = round(eps[("service", c)], 3)
        out[f"ratio_{c}"] = round(eps[("service", c)] / eps[("in_process", c)], 3)
    top = max(a.concurrency)
    out["ratio"] = out[f"ratio_{top}"]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
