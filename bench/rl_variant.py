"""GRPO variants from a learning run's SFT checkpoint, paired with that run's own SFT evaluation.

    .venv/bin/python bench/rl_variant.py --run /tmp/ratchet-learning --out /tmp/exp/A --curriculum train
    .venv/bin/python bench/rl_variant.py --run /tmp/ratchet-learning --out /tmp/exp/B --updates-per-step 2 --steps 12
    .venv/bin/python bench/rl_variant.py --run /tmp/ratchet-learning --out /tmp/exp/T --curriculum-eval-only \
        --checkpoint /tmp/ratchet-learning/candidate/rl/step-00012 --checkpoint /tmp/exp/B/rl/step-00012

`--run` is a `bench/learning.py` output folder (its demonstrations, its SFT checkpoint and its
`per_task.json`). One GRPO run from that SFT checkpoint (the recipe's settings but for the flags
here), then its validation success on the run's 60 validation tasks x 3 seeds (the same tasks and
seeds as bench/learning.py), paired over tasks with the run's SFT, RL and harness rates: what one
RL change does, for ~25 minutes instead of a whole learning run's ~45 (the other policies are not
evaluated again). `--curriculum-eval-only`: no training; the run's SFT and the given checkpoints
on the RL curriculum itself (the train tasks the demonstrator solved), 2 fresh seeds, paired with
SFT: whether GRPO improved the tasks it trained on. `--pool DIR
...`: no training; several outputs (one recipe seed each: the SFT each RL started from and its RL
rates) pooled: per task, the mean over seeds of RL and of SFT, then RL - SFT paired over tasks
(the recipe's seed-to-seed spread averaged in instead of picking one seed).

    .venv/bin/python bench/rl_variant.py --pool /tmp/exp/H /tmp/exp/H2 /tmp/exp/H3

Greedy decoding (what the holdout evaluation does; the hard curriculum), paired with a run
that was itself evaluated greedily (`bench/learning.py --temperature 0 --eval-seeds 1`):

    .venv/bin/python bench/rl_variant.py --run /tmp/greedy --out /tmp/exp/G --curriculum hard \
        --temperature 0 --eval-seeds 1 --seed 0

`--method rest`: the RL stage as one round of reward-filtered self-training
(`ratchet.training.rest`) instead of GRPO, the same pairing:

    .venv/bin/python bench/rl_variant.py --run /tmp/greedy --out /tmp/exp/R --method rest --curriculum mixed \
        --temperature 0 --eval-seeds 1 --seed 0

`--eval-checkpoints`: every earlier RL checkpoint too (saved every `steps // 3`;
the lr is constant and the task order a function of the seed and step, so step k of a 36-step run
trains what a k-step run does),
each paired with SFT, with its cumulative SFT + RL CPU: success against the RL budget, one run:

    .venv/bin/python bench/rl_variant.py --run /tmp/greedy --out /tmp/exp/S --steps 36 --eval-checkpoints \
        --temperature 0 --eval-seeds 1 --seed 0

Final JSON line: `rl_pass`, `baseline` "sft" (the run's), `ratio` rl/sft; `by_step` with
`--eval-checkpoints`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import learning as L  # noqa: E402  (bench/learning.py: the same suite, split, helpers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="a bench/learning.py --out folder (default size, view on)")
    ap.add_argument("--out")
    ap.add_argument("--pool", nargs="+", default=None, metavar="DIR",
                    help="pool the per-task SFT and RL rates of these outputs (no training)")
    ap.add_argument("--problems", type=int, default=0,
                    help="the --problems of the learning run in --run (0: all 164, bench/learning.py's default; "
                         "40: the smaller split)")
    ap.add_argument("--split-seed", type=int, default=0, help="the --split-seed of the learning run in --run")
    ap.add_argument("--curriculum", choices=("solved", "train", "fresh", "mixed", "hard"), default="solved",
                    help="fresh: the train tasks SFT never saw that the demonstrator solves (the run's "
                         "curriculum-v2-124-4-14.json, found and cached there when missing: learning.fresh_solved); "
                         "mixed: solved and fresh together; hard: the mixed tasks on which the run's SFT policy's "
                         "greedy episode fails (learning.greedy_failures, cached in the run as hard-<n>.json)")
    ap.add_argument("--turn-cost", type=float, default=None,
                    help="RecipeSettings.rl_turn_cost (default: the recipe's, 0.3; 0 = none)")
    ap.add_argument("--updates-per-step", type=int, default=1)
    ap.add_argument("--minibatches", type=int, default=None,
                    help="optimizer steps per pass over a step's rollouts (RecipeSettings.rl_minibatches; default the recipe's)")
    ap.add_argument("--steps", type=int, default=None,
                    help="GRPO steps (default: the recipe's, 12, as bench/learning.py)")
    ap.add_argument("--tasks-per-step", type=int, default=None, help="GRPO tasks per step (default: the recipe's)")
    ap.add_argument("--group-size", type=int, default=None, help="GRPO rollouts per task (default: the recipe's)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0, help="the recipe's seed (GRPO's task order and episode seeds; "
                                                        "SFT's with --hide-task); evaluation seeds stay 0..N-1")
    ap.add_argument("--eval-seeds", type=int, default=3)
    ap.add_argument("--method", choices=("grpo", "rest"), default="grpo",
                    help="rest: one round of reward-filtered self-training from the SFT checkpoint "
                         "(ratchet.training.rest: --rest-samples episodes a curriculum task at T = 1, the "
                         "shortest pass kept, SFT continued on passes + demonstrations) instead of GRPO")
    ap.add_argument("--rest-samples", type=int, default=4)
    ap.add_argument("--rest-keep", type=int, default=1)
    ap.add_argument("--rest-epochs", type=float, default=2.0)
    ap.add_argument("--rest-lr", type=float, default=1e-3)
    ap.add_argument("--rest-no-demos", action="store_true", help="train on the kept passes only")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="evaluation sampling (0: greedy, what the holdout evaluation does; pair it only with a "
                         "--run evaluated at the same temperature, e.g. --temperature 0 --eval-seeds 1)")
    ap.add_argument("--rl-temperature", type=float, default=None,
                    help="GRPO's sampling temperature (RecipeSettings.rl_temperature; its logprobs are taken at the "
                         "same temperature); default: the recipe's. Higher: more exploration from a low-entropy SFT")
    ap.add_argument("--limit", type=int, default=None, help="evaluate the first N tasks only (smoke runs)")
    ap.add_argument("--curriculum-eval-only", action="store_true")
    ap.add_argument("--checkpoint", action="append", default=[], help="with --curriculum-eval-only")
    ap.add_argument("--eval-checkpoints", action="store_true",
                    help="also evaluate every earlier RL checkpoint (step-NNNNN, saved every steps // 3) on the same "
                         "validation tasks, paired with SFT: success against RL CPU from one run (per_task_rl-stepN.json)")
    ap.add_argument("--hide-task", action="store_true",
                    help="train a new SFT from the run's base_policy on its demonstrations with a view that names "
                         "no task (RecipeSettings.hide_task), then RL from it; both evaluated and paired")
    a = ap.parse_args(argv)
    if a.pool:
        return pool(a.pool)
    from ratchet.training.recipe import RecipeSettings as _RS
    if a.turn_cost is None:
        a.turn_cost = _RS().rl_turn_cost
    if a.steps is None:
        a.steps = _RS().rl_steps
    if not (a.run and a.out):
        ap.error("--run and --out are required (or --pool DIR ...)")

    import torch

    from ratchet.evaluation.stats import paired_difference
    from ratchet.training.recipe import RecipeSettings, rl_stage
    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime

    torch.set_num_threads(1)
    run, out = Path(a.run), Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.monotonic()
    say = lambda s: print(f"[{time.monotonic() - t0:6.0f}s] {s}", flush=True)   # noqa: E731
    # bench/learning.py's split and samples (124 train tasks, 60 validation) on the run's problems
    train, val, train_used = L.split_tasks(build_suite(seed=0, limit=a.problems or None).tasks, val_tasks=60,
                                           train_tasks=124, split_seed=a.split_seed)
    val = val[:a.limit]
    found = L.data_file(run, 124, 4, 14, a.split_seed)
    if not found.exists():
        raise SystemExit(f"{found}: missing (is --run a bench/learning.py output with this --split-seed and --problems?)")
    demo = json.loads(found.read_text())
    solved = {d["task_id"] for d in demo if d["passed"]}
    solved_tasks = [b for b in train_used if b.task_id in solved]
    sft_path = run / "candidate" / "sft"
    rt = LocalRuntime()
    ev = dict(max_turns=14, max_tokens=RecipeSettings().max_tokens, temperature=a.temperature, runtime=rt)

    if a.curriculum_eval_only:
        pt, res = {}, {}
        for name, path in [("sft", sft_path)] + [(f"ckpt{i}", Path(p)) for i, p in enumerate(a.checkpoint)]:
            rows = L.run_embedded(path, solved_tasks[:a.limit], seeds=(100, 101), **ev)
            pt[name], res[name] = L.per_task_rate(rows), L.summarise(rows)
            say(f"{name} ({path}) on {len(solved_tasks[:a.limit])} curriculum tasks x 2 seeds: {res[name]}")
        diffs = {k: paired_difference(pt[k], pt["sft"]) for k in pt if k != "sft"}
        for k, iv in diffs.items():
            say(f"paired {k} - sft on the curriculum: {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
        best = max((res[k]["pass"] for k in diffs), default=None)
        print(json.dumps({"bench": "rl_variant", "mode": "curriculum_eval", "sft_pass": res["sft"]["pass"],
                          **{f"{k}_pass": res[k]["pass"] for k in diffs}, "checkpoints": a.checkpoint,
                          "paired": {k: [iv.estimate, iv.lo, iv.hi] for k, iv in diffs.items()},
                          "baseline": "sft", "ratio": round(best / res["sft"]["pass"], 3)
                          if best is not None and res["sft"]["pass"] else None}))
        return 0

    cur = train_used if a.curriculum == "train" else solved_tasks
    if a.curriculum in ("fresh", "mixed", "hard"):
        from sandboxes.agents import fit_prior
        fresh = L.fresh_solved(run, train, train_used, prior=fit_prior(train), k=4, max_turns=14, n=124, runtime=rt)
        cur = fresh if a.curriculum == "fresh" else solved_tasks + fresh
        if a.curriculum == "hard":
            c0 = L.cpu_now()
            cur = L.greedy_failures(run, sft_path, cur, max_turns=14, max_tokens=RecipeSettings().max_tokens, runtime=rt)
            say(f"hard curriculum: the SFT policy's greedy episode fails {len(cur)} of {len(solved_tasks) + len(fresh)} "
                f"solvable train tasks ({L.cpu_now() - c0:.0f} CPU s)")
    shape = {k: v for k, v in (("rl_tasks_per_step", a.tasks_per_step), ("rl_group_size", a.group_size),
                               ("rl_minibatches", a.minibatches)) if v}
    rs = RecipeSettings(rl_steps=a.steps, rl_lr=a.lr, rl_updates_per_step=a.updates_per_step, max_turns=14,
                        rl_turn_cost=a.turn_cost,
                        hide_task=a.hide_task, seed=a.seed, **shape,
                        **({"rl_temperature": a.rl_temperature} if a.rl_temperature else {}))
    new_sft = None
    if a.hide_task:
        from ratchet.training.recipe import sft_stage
        from sandboxes.agents import fit_prior

        base = next(p for p in (run / "base").iterdir() if p.name.startswith("base-"))
        sft = sft_stage(base, L.demonstration_rows(demo), out / "sft", rs, prior=fit_prior(train))
        sft_path = sft.checkpoint
        say(f"SFT (view names no task): {sft.steps} steps, loss {sft.losses[0]:.2f} -> {sft.losses[-1]:.2f}, "
            f"{sft.cpu_s:.0f} CPU s")
        rows = L.run_embedded(sft_path, val, seeds=tuple(range(a.eval_seeds)), **ev)
        new_sft = (L.summarise(rows), L.per_task_rate(rows))
        say(f"eval sft (view names no task): {new_sft[0]}")
    say(f"curriculum {a.curriculum}: {len(cur)} tasks; updates/step {a.updates_per_step}; steps {a.steps}; lr {a.lr}; "
        f"{rs.rl_tasks_per_step} tasks x {rs.rl_group_size} rollouts a step in {rs.rl_minibatches} minibatch(es)")

    def on_step(r):
        say(f"  rl step {r['step']}: pass {r['pass_rate']} kl {r['kl']:.4f} ent {r['entropy']:.3f} "
            f"clip {r['clip_fraction']:.3f} flat {r.get('flat_groups')} cpu {r['cpu_s']:.0f}s upd {r['update_s']:.0f}s")
    if a.method == "rest":
        from ratchet.training.rest import RestSettings, train_rest

        rest = RestSettings(samples=a.rest_samples, keep=a.rest_keep, epochs=a.rest_epochs, learning_rate=a.rest_lr,
                            max_turns=14, max_tokens=rs.max_tokens, seed=a.seed)
        rl = train_rest(sft_path, cur, out / "rl", rest, runtime=rt,
                        demos=() if a.rest_no_demos else L.demonstration_rows(demo))
        say(f"ReST: {rl.sampled} episodes ({rl.sample_cpu_s:.0f} CPU s), {rl.passed} passed, {rl.kept} kept on "
            f"{rl.tasks_with_pass} tasks, {rl.infra} infra; SFT loss {rl.losses[0]:.3f} -> {rl.losses[-1]:.3f}")
    else:
        rl = rl_stage(sft_path, cur, out / "rl", rs, runtime=rt, on_step=on_step, resume=False)
    sft_cpu = json.loads((sft_path / "ratchet_checkpoint.json").read_text())["cpu_s"]
    say(f"RL {rl.cpu_s:.0f} CPU s; SFT + RL {(rl.cpu_s + sft_cpu) / 60:.2f} CPU-min")
    rows = L.run_embedded(rl.checkpoint, val, seeds=tuple(range(a.eval_seeds)), **ev)
    res, pt = L.summarise(rows), L.per_task_rate(rows)
    say(f"eval rl: {res}")
    (out / "per_task_rl.json").write_text(json.dumps(pt, indent=1, sort_keys=True))
    old = json.loads((run / "per_task.json").read_text())
    # the SFT this RL started from, per task (its own with --hide-task, else the run's): what --pool pairs with
    (out / "per_task_sft.json").write_text(json.dumps(new_sft[1] if new_sft else {t: v for t, v in old["sft"].items()
                                                                                 if t in pt}, indent=1, sort_keys=True))
    if new_sft:
        for k, (x, y) in {"rl_minus_sft_new": (pt, new_sft[1]), "sft_new_minus_sft": (new_sft[1], old["sft"])}.items():
            iv = paired_difference(x, {t: v for t, v in y.items() if t in x})
            say(f"paired {k}: {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
    by_step = {}
    base_sft = new_sft[1] if new_sft else old["sft"]   # the SFT this RL started from (as per_task_sft.json)
    if a.eval_checkpoints:
        # the budget curve: each earlier checkpoint of this one run (constant lr; the task order is a pure
        # function of (ids, seed, step), so step k of a longer run trains what a k-step run does, up to the
        # sandboxes' timing), its cumulative CPU from its own meta
        for ck in sorted(p for p in (out / "rl").glob("step-*") if p.resolve() != Path(rl.checkpoint).resolve()):
            n = int(ck.name.split("-")[1])
            rows_k = L.run_embedded(ck, val, seeds=tuple(range(a.eval_seeds)), **ev)
            res_k, pt_k = L.summarise(rows_k), L.per_task_rate(rows_k)
            (out / f"per_task_rl-step{n}.json").write_text(json.dumps(pt_k, indent=1, sort_keys=True))
            iv = paired_difference(pt_k, {t: v for t, v in base_sft.items() if t in pt_k})
            cpu_k = json.loads((ck / "ratchet_checkpoint.json").read_text())["cpu_s"]
            by_step[n] = {"rl_pass": res_k["pass"], "rl_first_try": res_k["first_try"],
                          "rl_minus_sft": [iv.estimate, iv.lo, iv.hi], "train_cpu_min": round((cpu_k + sft_cpu) / 60, 2)}
            say(f"step {n}: rl {res_k['pass']:.3f} (first try {res_k['first_try']:.3f}), rl - sft {iv.estimate:+.3f} "
                f"[{iv.lo:+.3f}, {iv.hi:+.3f}], SFT + RL {by_step[n]['train_cpu_min']} CPU-min")
    paired = {}
    for b in ("sft", "rl", "untrained", "random", "prior", "sbfl"):
        iv = paired_difference(pt, {t: v for t, v in old[b].items() if t in pt})
        paired[f"rl_minus_{b}"] = [iv.estimate, iv.lo, iv.hi]
        say(f"paired rl (this) - {b} ({run.name}): {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
    sft_p = new_sft[0]["pass"] if new_sft else sum(v for t, v in old["sft"].items() if t in pt) / len(pt)
    print(json.dumps({"bench": "rl_variant", "run": str(run), "curriculum": a.curriculum, "method": a.method, "rl_tasks": len(cur), "temperature": a.temperature, "rl_temperature": rs.rl_temperature, "hide_task": a.hide_task,
                      "updates_per_step": a.updates_per_step, "steps": a.steps, "turn_cost": a.turn_cost,
                      "tasks_per_step": rs.rl_tasks_per_step, "group_size": rs.rl_group_size, "minibatches": rs.rl_minibatches, "lr": a.lr, "seed": a.seed,
                      "rl_pass": res["pass"], "rl_pass_ci": res["pass_ci"], "rl_first_try": res["first_try"],
                      "train_cpu_min": round((rl.cpu_s + sft_cpu) / 60, 2), "paired": paired, "by_step": by_step,
                      "baseline": "sft", "sft_pass": sft_p, "ratio": round(res["pass"] / sft_p, 3) if sft_p else None}))
    return 0


def pool(dirs) -> int:
    """RL - SFT over recipe seeds: each DIR's per_task_{sft,rl}.json (the SFT its RL started from: its
    own with --hide-task, else the run's), per task the mean over DIRs, then the paired bootstrap over tasks."""
    from ratchet.evaluation.stats import paired_difference

    runs = []
    for d in map(Path, dirs):
        try:
            runs.append({k: json.loads((d / f"per_task_{k}.json").read_text()) for k in ("sft", "rl")})
        except FileNotFoundError as e:
            raise SystemExit(f"{d}: {e.filename} missing (an output of rl_variant.py before it wrote per_task_sft.json)")
    tasks = sorted(set.intersection(*(set(r["sft"]) & set(r["rl"]) for r in runs)))
    if not tasks:
        raise SystemExit("no task is scored in every run")
    mean = {k: {t: sum(r[k][t] for r in runs) / len(runs) for t in tasks} for k in ("sft", "rl")}
    per_run = []
    for d, r in zip(dirs, runs):
        iv = paired_difference(*({t: r[k][t] for t in tasks} for k in ("rl", "sft")))
        per_run.append([iv.estimate, iv.lo, iv.hi])
        print(f"{d}: SFT {sum(r['sft'][t] for t in tasks) / len(tasks):.3f}, RL {sum(r['rl'][t] for t in tasks) / len(tasks):.3f}, "
              f"RL - SFT {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
    iv = paired_difference(mean["rl"], mean["sft"])
    sft_p, rl_p = (sum(mean[k].values()) / len(tasks) for k in ("sft", "rl"))
    print(f"pooled over {len(runs)} seeds, {len(tasks)} tasks: SFT {sft_p:.3f}, RL {rl_p:.3f}, "
          f"RL - SFT {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
    print(json.dumps({"bench": "rl_variant", "mode": "pool", "runs": [str(d) for d in dirs], "tasks": len(tasks),
                      "sft_pass": sft_p, "rl_pass": rl_p, "rl_minus_sft": [iv.estimate, iv.lo, iv.hi],
                      "per_run_rl_minus_sft": per_run, "baseline": "sft",
                      "ratio": round(rl_p / sft_p, 3) if sft_p else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
