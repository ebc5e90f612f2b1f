"""QuixBugs bench: 40 Python programs we did not write (tests/fixtures/quixbugs, MIT, upstream
4257f44) as a SWE-bench-style task source, through the real sandbox and the real graph.

1. Every program, two episodes through the environment the policies use
   (`ratchet.task_sources.reference_episodes`): the buggy code submitted unchanged must fail its
   own tests and the reference fix must pass them, with no infrastructure failure (three buggy
   programs never return: their tests end on the task's per-test CPU limit, the agent's failure).
2. The graph, in a fresh RATCHET_HOME: `tasks` from the QuixBugs source beside a small HumanEval
   subset (its train split is what harness:prior fits its count prior on; QuixBugs records no fix
   kinds), dedup, splits sized so the QuixBugs repository (one cluster: every instance is
   jkoppel/QuixBugs) is the locked holdout, `holdout_eval` of the harness baselines, then
   `eval_summary`, `economics` and the scorecard. Each baseline's pass rate on the 40 QuixBugs
   tasks with its 95% bootstrap CI comes from `eval_summary`.

    .venv/bin/python bench/quixbugs.py [--seeds 1] [--workers 2] [--humaneval 4] [--lm]

`--lm` adds harness:lm (the pretrained base ranking candidate edits: minutes on CPU). The final
line is one JSON object; ratio = harness:sbfl pass rate / harness:random pass rate (baseline:
harness:random).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASELINES = ("harness:random", "harness:sbfl", "harness:prior")
# the HumanEval subset is built once per machine (mutant verification), then read from here
SUITE_CACHE = Path(tempfile.gettempdir()) / "ratchet-bench-quixbugs-humaneval"


def reference_check(tmp: Path) -> dict:
    from ratchet.task_sources import Rejection, parse_sources, reference_episodes, source_tasks
    from sandboxes.runtime import LocalRuntime
    from tests.fixtures import quixbugs as qb

    jsonl, repos = qb.materialize(tmp / "ref")
    spec, = parse_sources([{"kind": "swebench", "path": str(jsonl), "repos": str(repos), "limits": qb.LIMITS}])
    runtime = LocalRuntime(tmp / "rt")
    out = {"programs": 0, "buggy_fail": 0, "fixed_pass": 0, "infra": 0, "problems": []}
    for item in source_tasks(spec):
        out["programs"] += 1
        if isinstance(item, Rejection):
            out["problems"].append(f"{item.task}: {item.reason}: {item.detail}")
            continue
        bundle, _ = item
        r = reference_episodes(runtime, bundle)
        out["infra"] += sum(v.infra_failure for v in r.values())
        out["buggy_fail"] += not r["buggy"].infra_failure and not r["buggy"].details.get("resolved")
        out["fixed_pass"] += not r["fixed"].infra_failure and bool(r["fixed"].details.get("resolved"))
        if r["buggy"].details.get("resolved") or not r["fixed"].details.get("resolved"):
            out["problems"].append(f"{bundle.task_id}: buggy {r['buggy'].status} {r['buggy'].reasons[:1]}, "
                                   f"fixed {r['fixed'].status} {r['fixed'].reasons[:1]}")
        print(f"  {bundle.task_id}: buggy {r['buggy'].status}/{r['buggy'].details.get('resolved')}, "
              f"fixed {r['fixed'].status}/{r['fixed'].details.get('resolved')}", file=sys.stderr)
    return out


def graph(tmp: Path, *, policies, seeds: int, workers: int, humaneval: int) -> dict:
    """tasks -> splits -> holdout_eval per policy x seed -> eval_summary, economics, scorecard."""
    from dagster import DagsterInstance, MultiPartitionKey, materialize

    from assets.evaluation import economics, eval_summary, holdout_eval, register_policies, scorecard
    from assets.splits import contamination, dedup_clusters, holdout_manifest, split_assignments
    from assets.tasks import task_suite
    from ratchet.store import fetch
    from ratchet.warehouse import Warehouse
    from resources import MlflowTracking, WarehouseResource
    from tests.fixtures import quixbugs as qb

    home = tmp / "home"
    home.mkdir()
    os.environ["RATCHET_HOME"] = str(home)     # harness:prior reads the train split from here
    jsonl, repos = qb.materialize(tmp / "graph")
    n_qb = len(qb.instances())
    per = 2
    sources = [{"kind": "humaneval"},
               {"kind": "swebench", "name": "quixbugs", "path": str(jsonl), "repos": str(repos),
                "limits": qb.LIMITS}]
    # QuixBugs is one cluster of n_qb tasks; HumanEval problems are clusters of `per` mutants:
    # a holdout of exactly n_qb takes the QuixBugs cluster whole, the suite goes to train / val
    n_he = humaneval * per
    splits = {"train": n_he - per, "val": per, "holdout": n_qb}
    resources = {"warehouse": WarehouseResource(home=str(home)), "tracking": MlflowTracking(home=str(home))}
    instance = DagsterInstance.ephemeral()

    def run(assets, ops, **kw):
        names = {a.node_def.name for a in assets if hasattr(a, "node_def")}
        res = materialize(assets, instance=instance, resources=resources, raise_on_error=False,
                          run_config={"ops": {k: {"config": v} for k, v in ops.items() if k in names},
                                      "loggers": {"console": {"config": {"log_level": "WARNING"}}}}, **kw)
        if not res.success:
            errors = [e.event_specific_data.error.to_string() for e in res.all_events
                      if e.event_type_value == "STEP_FAILURE"]
            raise SystemExit(f"quixbugs bench: {sorted(names)} failed:\n" + "\n".join(errors)[-3000:])
        return res

    t0 = time.monotonic()
    res = run([task_suite, dedup_clusters, split_assignments, contamination, holdout_manifest],
              {"task_suite": {"limit": humaneval, "per_problem": per, "cache_dir": str(SUITE_CACHE),
                              "sources": sources},
               "split_assignments": splits})
    tasks_s = time.monotonic() - t0
    src = res.asset_materializations_for_node("task_suite")[0].metadata["sources"].value
    wh = Warehouse(home / "warehouse.duckdb")
    with wh.connect() as con:
        held = [r["task_id"] for r in fetch(con, "SELECT task_id FROM v_holdout ORDER BY 1")]
        rejected = fetch(con, "SELECT task, reason, detail FROM task_rejections WHERE source = 'quixbugs'")
    qb_held = [t for t in held if t.startswith("quixbugs__")]
    print(f"tasks: {src}; holdout {len(held)} tasks ({len(qb_held)} QuixBugs) in {tasks_s:.0f} s", file=sys.stderr)

    register_policies(instance, policies)
    eval_s = {}
    for p in policies:
        t = time.monotonic()
        for s in range(seeds):
            run([holdout_eval], {"holdout_eval": {"workers": workers}},
                partition_key=MultiPartitionKey({"policy": p, "seed": str(s)}))
        eval_s[p] = round(time.monotonic() - t, 1)
        print(f"holdout_eval {p}: {eval_s[p]} s", file=sys.stderr)
    run([eval_summary, economics, scorecard], {"eval_summary": {"baseline_policy_id": "harness:random"},
                                               "economics": {"baseline_policy_id": "harness:random"},
                                               "scorecard": {"order": list(policies), "mlflow": False}})
    with wh.connect() as con:
        rows = fetch(con, "SELECT * FROM eval_summary WHERE dimension = 'all' ORDER BY policy_id")
        infra = fetch(con, "SELECT count(*) AS n FROM eval_episodes WHERE outcome = 'infra_failure'")[0]["n"]
    card = (home / "scorecard.md").read_text() if (home / "scorecard.md").is_file() else ""
    return {"accepted": src.get("quixbugs", {}).get("accepted"), "rejected": [tuple(r.values()) for r in rejected],
            "holdout": len(held), "holdout_quixbugs": len(qb_held), "summary": rows, "eval_infra": infra,
            "eval_s": eval_s, "tasks_s": round(tasks_s, 1), "scorecard": card}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--humaneval", type=int, default=4, help="HumanEval problems beside QuixBugs (train side)")
    ap.add_argument("--lm", action="store_true", help="also harness:lm (slow on CPU)")
    a = ap.parse_args(argv)
    policies = BASELINES + (("harness:lm",) if a.lm else ())

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ratchet-quixbugs-") as tmp:
        print("reference episodes (buggy unchanged, reference fix) for every program:", file=sys.stderr)
        ref = reference_check(Path(tmp))
        ref_s = time.monotonic() - t0
        g = graph(Path(tmp), policies=policies, seeds=a.seeds, workers=a.workers, humaneval=a.humaneval)
    wall = time.monotonic() - t0

    n = ref["programs"]
    print(f"QuixBugs: buggy fails {ref['buggy_fail']}/{n}, fixed passes {ref['fixed_pass']}/{n}, "
          f"infra {ref['infra']} ({ref_s:.0f} s); tasks accepted {g['accepted']}/{n}, "
          f"{g['holdout_quixbugs']} in the locked holdout of {g['holdout']}")
    for p in ref["problems"] + [f"{t}: {r}: {d}" for t, r, d in g["rejected"]]:
        print(f"  problem: {p}")
    rates = {}
    print(f"{'policy':<16}{'pass rate':>10}{'95% CI':>18}{'passed':>9}{'infra':>7}{'eval s':>8}")
    for r in g["summary"]:
        rates[r["policy_id"]] = {"pass_rate": r["pass_rate"], "ci": [r["pass_rate_ci_lo"], r["pass_rate_ci_hi"]],
                                 "passed": r["tasks_passed"], "tasks": r["tasks"], "infra": r["tasks_infra"]}
        ci = f"[{r['pass_rate_ci_lo']:.3f}, {r['pass_rate_ci_hi']:.3f}]" if r["pass_rate_ci_lo"] is not None else "-"
        print(f"{r['policy_id']:<16}{r['pass_rate'] or 0:>10.3f}{ci:>18}{r['tasks_passed']:>5}/{r['tasks']:<3}"
              f"{r['tasks_infra']:>7}{g['eval_s'].get(r['policy_id'], 0):>8}")
    rnd, sbfl = (rates.get(p, {}).get("pass_rate") for p in ("harness:random", "harness:sbfl"))
    out = {"bench": "quixbugs", "programs": n, "buggy_fail": ref["buggy_fail"], "fixed_pass": ref["fixed_pass"],
           "infra": ref["infra"], "accepted": g["accepted"], "rejected": len(g["rejected"]),
           "holdout_quixbugs": g["holdout_quixbugs"], "holdout": g["holdout"], "eval_infra": g["eval_infra"],
           "seeds": a.seeds, "pass_rates": rates,
           "seconds": {"reference": round(ref_s, 1), "tasks": g["tasks_s"], "eval": g["eval_s"],
                       "total": round(wall, 1)},
           "baseline": "harness:random", "ratio": round(sbfl / rnd, 2) if rnd and sbfl is not None else None}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
