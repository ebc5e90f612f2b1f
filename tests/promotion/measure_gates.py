"""Operating characteristics of the default gates on synthetic evaluations (400 tasks x 3 seeds):
how often an identical policy (shift 0) or a better one (per-seed pass probability +shift) gets
each gate and the verdict. Run: .venv/bin/python -m tests.promotion.measure_gates [CASES]
Ends with one JSON line of the figures."""
import json
import sys
import time

from ratchet.promotion.config import GatePolicy
from ratchet.promotion.gates import evaluate_gates
from tests.promotion.synthetic import GOOD_EVIDENCE, episodes, tasks

N, CASES = 400, int(sys.argv[1]) if len(sys.argv) > 1 else 60
out = {}
t0 = time.perf_counter()
for shift in (0.0, 0.05, 0.10, 0.15):
    for name, pol in (("default", GatePolicy()), ("slice_only", GatePolicy(slice_columns=("slice",)))):
        beats = passes = slice_fail = 0
        for case in range(CASES):
            T = tasks(N, seed=case)
            champ = episodes(T, "a", seed=case, violation_rate=0.02)
            cand = episodes(T, "b", seed=case + 99_999, p_shift=shift, violation_rate=0.01)
            rep = evaluate_gates(cand, champ, GOOD_EVIDENCE, pol)
            beats += rep.gate("beats_champion").passed
            passes += rep.verdict == "pass"
            slice_fail += not rep.gate("slice_regression").passed
        out[f"shift={shift}/{name}"] = {"beats_champion": beats / CASES, "verdict_pass": passes / CASES,
                                        "slice_regression_failed": slice_fail / CASES}
        print(f"shift {shift:+.2f} {name:10s} beats {beats/CASES:.2f} pass {passes/CASES:.2f} slice-fail {slice_fail/CASES:.2f}", flush=True)
T = tasks(N, seed=0)
a, b = episodes(T, "a"), episodes(T, "b", p_shift=0.1)
t = time.perf_counter(); evaluate_gates(b, a, GOOD_EVIDENCE); per = time.perf_counter() - t
print(json.dumps({"bench": "promotion_gates", "tasks": N, "seeds": 3, "cases": CASES, "evaluate_gates_s": round(per, 3),
                  "results": out, "total_s": round(time.perf_counter() - t0, 1)}))
