"""Demo bench: `ratchet demo` end to end in a fresh RATCHET_HOME, timed against its budget.

What a new user runs first: the agents' logs generated in the sandbox, the lifecycle graph, the
holdout evaluation of the demo policies, one improvement cycle (a candidate trained SFT then RL,
evaluated and gated). The suite cache is shared with the caller's home when one is built
(`RATCHET_SUITE_CACHE`), as on a second run of `make demo`; `--cold-suite` builds it too.

    .venv/bin/python bench/demo.py [--full] [--quick] [--home DIR] [--cold-suite]

Budget (the named baseline): 15 minutes for the default demo, 2 hours for `--full` (the reference
workload, 400 locked holdout tasks x 3 seeds), 5 minutes for `--quick`. The final line is one JSON
object: the demo's own summary (scorecard rows, the promotion decision), `wall_s`, and
ratio = wall_s / budget_s (target: <= 1).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = {"default": 900, "full": 7200, "quick": 300}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="the reference workload (ratchet demo --full)")
    ap.add_argument("--quick", action="store_true", help="the smoke configuration (ratchet demo --quick)")
    ap.add_argument("--home", help="RATCHET_HOME for the run (default: a fresh temporary folder)")
    ap.add_argument("--cold-suite", action="store_true", help="build the task suite too (no shared cache)")
    a = ap.parse_args()
    mode = "full" if a.full else "quick" if a.quick else "default"
    home = Path(a.home) if a.home else Path(tempfile.mkdtemp(prefix="ratchet-demo-bench-"))
    env = {**os.environ, "RATCHET_HOME": str(home)}
    shared = Path(os.environ.get("RATCHET_HOME", REPO / ".ratchet")) / "cache" / "humaneval-suite"
    if not a.cold_suite and "RATCHET_SUITE_CACHE" not in env and shared.exists():
        env["RATCHET_SUITE_CACHE"] = str(shared)
    cmd = [str(Path(sys.executable).parent / "ratchet"), "demo"] + (["--full"] if a.full else []) \
        + (["--quick"] if a.quick else [])
    print(f"demo bench ({mode}): {' '.join(cmd[1:])} in {home}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    sys.stdout.write(proc.stdout)
    summary = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                summary = json.loads(line)
                break
            except ValueError:
                continue
    if proc.returncode != 0 or summary is None:
        print(f"demo bench: the demo failed (exit {proc.returncode})", file=sys.stderr)
        return proc.returncode or 1
    budget = BUDGET_S[mode]
    out = {"bench": "demo", "mode": mode, "wall_s": round(wall, 1), "budget_s": budget,
           "suite_cache": "cold" if a.cold_suite else "shared" if "RATCHET_SUITE_CACHE" in env else "built",
           "baseline": f"the {mode} demo's budget ({budget} s)", "ratio": round(wall / budget, 3),
           "summary": summary}
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
