"""Learning bench: does the embedded policy learn, on problems it never trained on?

One machine, end to end: build the HumanEval repair suite; split BY PROBLEM (even problem numbers
train, odd ones validation: no mutant of a validation problem is ever trained on or counted in
a prior); build base_policy from the train tasks only; obtain the training trajectories by running
the structured agent (agent@v7-structured, with the count prior fit on train tasks) on train tasks
and keeping the accepted ones; SFT, then GRPO on the train tasks that agent solved (a curriculum:
groups can hold passes), both through `ratchet.training.recipe.train_candidate`; then evaluate on
validation tasks with the same turn budget (and k attempts for the harnesses) for everyone:
untrained base_policy, harness:random, harness:sbfl, harness:prior, SFT, RL.

The view (the default; `--no-prior-view`: the environment's order): every embedded policy
here, the untrained one included, sees each `propose_edits` list in the order of that same
train-fit prior (`ratchet.policy.embedded.chat.make_view`, saved with each checkpoint); the JSON's
`view` says which order ran and whether the SFT and RL checkpoints carry it; `--hide-task`: the
view also names no task (`RecipeSettings.hide_task`, an experiment measured by this bench; see
docs/experiments/).

Task success = the tests pass at submit (or at the turn limit); first-try fix = success with one
candidate edit applied. 95% CIs: percentile bootstrap over tasks (ratchet.evaluation.stats).

    .venv/bin/python bench/learning.py            # default (what the results page records)
    .venv/bin/python bench/learning.py --quick    # minutes: the plumbing, not the numbers
    .venv/bin/python bench/learning.py --problems 40 --rl-seeds 1   # the small size: 20 train / 20
                                                                    # validation problems, one GRPO seed

`--base smollm2`: the pretrained SmolLM2-135M-Instruct (a LoRA, 2 torch threads) instead of the
small from-scratch base; it adds `harness:lm` (the base's likelihood ranks the candidate edits) and
the small base untrained beside it. The summary then names the columns the targets use:
`untrained_tiny_pass`, `prompted_pass` (the base, no weight change), `lm_harness_pass`. Its costs
on 2 cores are in docs/experiments/ (a GRPO step of 8 episodes ~5 minutes): its default size is a
GPU job.

RL is trained `--rl-seeds` times (default 3) from the one SFT checkpoint under recipe seeds 0..N-1
(GRPO's task order and episode seeds), each evaluated on the same tasks and seeds; `rl_pass` and
the paired RL differences pool them (per task, the mean over RL seeds), each seed is reported too,
and `train_cpu_min` is SFT + the costliest seed's RL (what one candidate costs, at most).

`--tier-progress` (off by default): the view's note "next to list: k." / "tier t
listed." (RecipeSettings.tier_progress); `bench/imitation.py --run DIR` then shows how the run's
SFT follows its demonstrator, decision by decision.
`--pick` / `--follow` (off by default): the pick note "best untried: line k, index i."
(RecipeSettings.pick_note) and rank 0 naming what the notes name (RecipeSettings.follow_notes, with
--tier-progress --pick); what they do was measured by this bench; see docs/experiments/.

Final line: one JSON object; ratio = rl_pass / sft_pass, baseline = the SFT checkpoint.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STRUCT_SIZE = {"quick": dict(problems=16, train_tasks=40, val_tasks=10, sft_epochs=3.0, rl_steps=2,
                             rl_tasks_per_step=2, rl_group_size=4, rl_seeds=1),
               # 12 GRPO steps x 4 tasks x 8: the best of the GRPO sizes measured with this bench (~12
               # CPU-min; see docs/experiments/).
               # problems=0 (all 164): 124 train / 60 validation tasks drawn from 82 + 82 problems instead
               # of 20 + 20 (60 validation tasks of 20 problems are ~3 mutants of each: the CIs treat them
               # as independent; the prior harness is fit on 588 train tasks, not 131); --problems 40 is
               # the smaller split.
               # rl_seeds=3: GRPO from the one SFT checkpoint under recipe seeds 0..N-1, each evaluated; RL
               # is reported pooled (per task, the mean over seeds) because one seed's RL - SFT moved by
               # ~10 points with the seed alone (measured with this bench; see docs/experiments/)
               "default": dict(problems=0, train_tasks=124, val_tasks=60, sft_epochs=3.0, rl_steps=12,
                               rl_tasks_per_step=4, rl_group_size=8, rl_seeds=3)}


def cpu_now() -> float:
    """CPU seconds of this process tree, sandboxes included (`sandboxes.cpu_meter.tree_cpu_s`: the
    workers killed unwaited-for and those the zygote reaped, which rusage does not see)."""
    from sandboxes.cpu_meter import tree_cpu_s
    return tree_cpu_s()


def problem_number(b) -> int:
    return int(str(b.metadata.get("problem_id", "x/0")).split("/")[-1])


def split_tasks(tasks, *, val_tasks: int, train_tasks: int, split_seed: int = 0):
    """-> (train, val, train_used): the split BY PROBLEM (even problem numbers train, odd ones
    validation), the validation sample (Random(split_seed)) and the train tasks the demonstrator
    runs on (Random(split_seed + 1)). bench/rl_variant.py calls this too, so both see the same tasks."""
    import random

    tasks = sorted(tasks, key=lambda b: b.task_id)
    train = [b for b in tasks if problem_number(b) % 2 == 0]
    val = [b for b in tasks if problem_number(b) % 2 == 1]
    assert not {problem_number(b) for b in train} & {problem_number(b) for b in val}
    return (train, random.Random(split_seed).sample(val, min(val_tasks, len(val))),
            random.Random(split_seed + 1).sample(train, min(train_tasks, len(train))))


def data_file(out: Path, n_train: int, k: int, max_turns: int, split_seed: int = 0) -> Path:
    """Where a run's demonstrations are cached (split seed 0 has no seed suffix, so caches
    written before `--split-seed` existed are still found)."""
    return out / f"data-v2-{n_train}-{k}-{max_turns}{'-s%d' % split_seed if split_seed else ''}.json"


def fresh_solved(out: Path, train, train_used, *, prior, k: int, max_turns: int, n: int, runtime,
                 reuse: bool = True) -> list:
    """The train tasks SFT never saw that the demonstrator solves: `n` of the unused train tasks
    (Random(2)), each tried once by the structured agent; the ids are cached in
    `out/curriculum-v2-<n>-<k>-<max_turns>.json` (bench/rl_variant.py reads the same file)."""
    import random

    used = {b.task_id for b in train_used}
    rest = [b for b in train if b.task_id not in used]
    if not rest:
        raise SystemExit("a fresh curriculum: every train task is already a demonstration task "
                         "(raise --problems or lower --train-tasks)")
    pool = random.Random(2).sample(rest, min(n, len(rest)))
    cached = out / f"curriculum-v2-{len(pool)}-{k}-{max_turns}.json"
    if reuse and cached.exists():
        ids = set(json.loads(cached.read_text()))
    else:
        ids = {d["task_id"] for d in run_harness("structured", pool, prior=prior, k=k, max_turns=max_turns,
                                                 runtime=runtime) if d["passed"]}
        cached.write_text(json.dumps(sorted(ids)))
    fresh = [b for b in pool if b.task_id in ids]
    assert not {b.task_id for b in fresh} & used
    return fresh


def greedy_failures(out: Path, sft_path: Path, pool, *, max_turns: int, max_tokens: int, runtime,
                    reuse: bool = True) -> list:
    """The tasks of `pool` on which the SFT policy's greedy episode fails (the "hard"
    curriculum: groups that can pay a rollout beating SFT's first choice, the one greedy decoding
    takes); the ids are cached in `out/hard-<n>.json`, keyed by that checkpoint's record (another
    SFT in the same folder finds its own)."""
    import hashlib

    sft = hashlib.sha256((Path(sft_path) / "ratchet_checkpoint.json").read_bytes()).hexdigest()
    cached = out / f"hard-{len(pool)}.json"
    found = json.loads(cached.read_text()) if reuse and cached.exists() else None
    if isinstance(found, dict) and found.get("sft") == sft:
        ids = set(found["ids"])
    else:
        rows = run_embedded(sft_path, pool, max_turns=max_turns, max_tokens=max_tokens, temperature=0.0,
                            runtime=runtime)
        ids = {r["task_id"] for r in rows if not r["passed"] and not r["infra"]}
        cached.write_text(json.dumps({"sft": sft, "ids": sorted(ids)}))
    return [b for b in pool if b.task_id in ids]


def first_try(messages, passed: bool) -> bool:
    applies = sum(1 for m in messages if m.get("role") == "assistant"
                  for c in m.get("tool_calls") or () if c["function"]["name"] == "apply_edit")
    return bool(passed and applies == 1)


def run_harness(name, bundles, *, prior, k, max_turns, runtime, seeds=(0,), scorer=None):
    from sandboxes.agents import run_agent

    out = []
    kw = {"prior": prior} if name in ("prior", "structured") else {"scorer": scorer} if name == "lm" else {}
    for seed in seeds:
        for b in bundles:
            r = run_agent(name, b, seed=seed, runtime=runtime, max_turns=max_turns, k=k, **kw)
            ok = bool(r.accepted)
            out.append({"task_id": b.task_id, "seed": seed, "passed": ok, "first_try": first_try(r.messages, ok),
                        "infra": r.reward is None or r.reward.status == "infra_failure", "messages": r.messages,
                        "tools": r.tools})
    return out


def run_embedded(path, bundles, *, max_turns, max_tokens, temperature, runtime, seeds=(0,), threads=1):
    from ratchet.policy import make_policy, run_episodes

    pol = make_policy("embedded:bench", path=str(path), threads=threads,
                      sampling={"temperature": temperature, "max_tokens": max_tokens})
    recs = run_episodes(pol, [(b, s) for s in seeds for b in bundles], concurrency=16, runtime=runtime,
                        max_turns=max_turns, min_batch=16)
    return [{"task_id": r.task_id, "seed": r.seed, "passed": bool(r.passed),
             "first_try": first_try(r.messages, r.passed), "infra": r.outcome == "infra_failure", "turns": r.turns} for r in recs]


def demonstration_rows(demo) -> list[dict]:
    """The demonstrator's passing episodes as SFT rows (the shape tenant_training_rows gives)."""
    return [{"record_id": f"bench-{i:04d}", "task_id": d["task_id"], "consent_id": None, "messages": d["messages"],
             "tools": d["tools"]} for i, d in enumerate(demo) if d["passed"]]


def per_task_rate(rows, key: str = "passed") -> dict:
    """task -> mean of `key` over its scored seeds (None when every seed was an infra failure)."""
    by: dict = {}
    for r in rows:
        by.setdefault(r["task_id"], []).append(None if r["infra"] else float(r[key]))
    return {t: (sum(v for v in vs if v is not None) / len([v for v in vs if v is not None])
                if any(v is not None for v in vs) else None) for t, vs in by.items()}


def summarise(rows) -> dict:
    """Success and first-try rates with 95% CIs: bootstrap over TASKS of each task's mean over
    its evaluation seeds (seeds of one task are not independent samples)."""
    from ratchet.evaluation.stats import bootstrap_ci

    p_t, f_t = per_task_rate(rows), per_task_rate(rows, "first_try")
    p = bootstrap_ci([v for v in p_t.values() if v is not None])
    f = bootstrap_ci([v for v in f_t.values() if v is not None])
    return {"pass": p.estimate, "pass_ci": [p.lo, p.hi], "first_try": f.estimate, "first_try_ci": [f.lo, f.hi],
            "n": p.n, "episodes": len(rows), "infra": sum(1 for r in rows if r["infra"])}


def plot(results: dict, cpu: dict, path: Path, rl_seeds: int = 1) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = {"untrained": 0.0, "sft": cpu["sft"] / 60, "rl": (cpu["sft"] + cpu["rl"]) / 60}
    pts = [(xs[k], results[k]) for k in ("untrained", "sft", "rl")]
    ax.errorbar([x for x, _ in pts], [r["pass"] for _, r in pts],
                yerr=[[r["pass"] - r["pass_ci"][0] for _, r in pts], [r["pass_ci"][1] - r["pass"] for _, r in pts]],
                marker="o", capsize=3, label="embedded policy (untrained -> SFT -> RL"
                + (f", RL pooled over {rl_seeds} seeds; x: SFT + mean RL)" if rl_seeds > 1 else ")"))
    for k, style in (("random", ":"), ("sbfl", "--"), ("prior", "-.")):
        ax.axhline(results[k]["pass"], linestyle=style, color="grey", label=f"harness:{k}")
    ax.set_xlabel("training CPU-minutes (SFT + RL; base_policy build not included)")
    ax.set_ylabel("validation task success")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reuse-data", action="store_true",
                    help="keep --out and reuse its demonstrations (data-*.json) and SFT checkpoint from an earlier run "
                         "of the same size (RL and every evaluation run again)")
    ap.add_argument("--out", default="/tmp/ratchet-learning")
    ap.add_argument("--split-seed", type=int, default=0,
                    help="which tasks are sampled: the validation tasks (Random(seed)) and the train tasks whose "
                         "demonstrations SFT uses (Random(seed + 1)); the split BY PROBLEM does not change. "
                         "0: the default sample; another seed is another data set for the same claim")
    ap.add_argument("--k", type=int, default=4, help="attempt budget of the harnesses")
    ap.add_argument("--max-turns", type=int, default=14)
    ap.add_argument("--eval-seeds", type=int, default=3,
                    help="evaluation seeds per validation task for the sampled policies (embedded, harness:random); "
                         "sbfl and prior are deterministic. CIs: bootstrap over tasks of per-task means")
    ap.add_argument("--temperature", type=float, default=1.0, help="embedded policies' eval sampling (RL samples at 1.0)")
    ap.add_argument("--rl-lr", type=float, default=None,
                    help="GRPO step size (default 1e-3 for the embedded base, 2e-5 for a LoRA on smollm2)")
    ap.add_argument("--rl-beta", type=float, default=0.04)
    ap.add_argument("--rl-updates-per-step", type=int, default=1,
                    help="optimizer steps per batch of GRPO rollouts (clipped ratio after the first)")
    ap.add_argument("--rl-minibatches", type=int, default=None,
                    help="optimizer steps per pass over a GRPO step's rollouts, the same CPU "
                         "(default RecipeSettings.rl_minibatches)")
    ap.add_argument("--rl-curriculum", choices=("solved", "train", "fresh", "mixed", "hard"), default="solved",
                    help="GRPO tasks: the train tasks the demonstrator solved (SFT's own tasks), every "
                         "train task used, or 'fresh': train tasks SFT never saw that the demonstrator solves "
                         "(--fresh-tasks of them are tried; needs more train tasks than --train-tasks, e.g. "
                         "--problems 0), or 'mixed': solved and fresh together, or 'hard': the mixed tasks on "
                         "which the SFT policy's greedy episode fails (greedy_failures)")
    ap.add_argument("--fresh-tasks", type=int, default=124,
                    help="with --rl-curriculum fresh, mixed or hard: how many unused train tasks the demonstrator tries")
    ap.add_argument("--rl-turn-cost", type=float, default=None,
                    help="GRPO's reward for a pass x (1 - c * turns / max_turns): the shorter pass is preferred "
                         "(default RecipeSettings.rl_turn_cost, 0.3; 0: no turn cost; a fail keeps 0)")
    ap.add_argument("--sft-lr", type=float, default=None,
                    help="SFT step size (default 3e-3 for the embedded base, 2e-4 for a LoRA on smollm2)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for training and the learned policies' episodes (default: 1 for the "
                         "embedded base, whose small matmuls ran 2-3x more CPU-efficient on one; all cores up to "
                         "2 for smollm2, whose matmuls are large enough to split)")
    ap.add_argument("--base", choices=("embedded", "smollm2"), default="embedded",
                    help="embedded: the small model trained from scratch; smollm2: the pretrained "
                         "SmolLM2-135M-Instruct (ratchet.policy.pretrained), trained through a LoRA adapter, "
                         "and harness:lm (its likelihood ranking the candidate edits) joins the baselines")
    ap.add_argument("--no-prior-view", action="store_true",
                    help="show candidate lists in the environment's order instead of the train-fit "
                         "prior's order (the view's prior feature, chat.make_view)")
    ap.add_argument("--hide-task", action="store_true",
                    help="the view names no task (RecipeSettings.hide_task): the policy reads 'Make the failing "
                         "tests pass.' instead of the issue, and no quoted code on localize/apply_edit rows")
    ap.add_argument("--tier-progress", action=argparse.BooleanOptionalAction, default=None,
                    help="the view's tier-progress note (RecipeSettings.tier_progress, Ranks.progress: 'next to "
                         "list: k.' / 'tier t listed.' after localize and each list); default: the recipe's")
    ap.add_argument("--pick", action=argparse.BooleanOptionalAction, default=None,
                    help="the view's pick note (RecipeSettings.pick_note, Ranks.pick: 'best untried: line k, index i.' "
                         "on the clean file after each list and undo); default: the recipe's")
    ap.add_argument("--follow", action=argparse.BooleanOptionalAction, default=None,
                    help="rank 0 names what the notes name (RecipeSettings.follow_notes, Ranks.followed; with "
                         "--tier-progress --pick); default: the recipe's")
    ap.add_argument("--rank-actions", action=argparse.BooleanOptionalAction, default=True,
                    help="calls name the k-th listed line / candidate row instead of the environment's numbers "
                         "(RecipeSettings.rank_actions, ratchet.policy.rank_actions; on by default, "
                         "--no-rank-actions: the environment's numbers)")
    ap.add_argument("--unmasked-logprobs", action="store_true",
                    help="GRPO on the unmasked distribution instead of the grammar-masked one")
    ap.add_argument("--test-cache", action=argparse.BooleanOptionalAction, default=True,
                    help="reuse sandbox test results an exact repeat of a run gives (sandboxes.result_cache; "
                         "a file in --out that starts empty): a GRPO group's pristine localize and identical "
                         "verifications run once (the same rewards, ~13%% less CPU a GRPO step). On by default; "
                         "--no-test-cache runs every one")
    for key in STRUCT_SIZE["default"]:
        ap.add_argument("--" + key.replace("_", "-"), type=type(STRUCT_SIZE["default"][key]), default=None)
    a = ap.parse_args(argv)
    from ratchet.training.recipe import RecipeSettings as _RS
    for flag, field in (("rl_minibatches", "rl_minibatches"), ("rl_turn_cost", "rl_turn_cost"),
                        ("tier_progress", "tier_progress"), ("follow", "follow_notes"), ("pick", "pick_note")):
        if getattr(a, flag) is None:         # unset on the command line: the recipe's default
            setattr(a, flag, getattr(_RS(), field))
    # a LoRA on a pretrained model takes far smaller steps than a small model trained from scratch
    a.sft_lr = a.sft_lr if a.sft_lr is not None else (2e-4 if a.base == "smollm2" else 3e-3)
    a.rl_lr = a.rl_lr if a.rl_lr is not None else (2e-5 if a.base == "smollm2" else 1e-3)
    size = dict(STRUCT_SIZE["quick" if a.quick else "default"])
    size.update({k: getattr(a, k) for k in size if getattr(a, k) is not None})

    import shutil

    import torch

    from ratchet.policy.action_mask import structured_tools
    from ratchet.policy.embedded.chat import task_hidden
    from ratchet.policy.rank_actions import rank_actions
    from ratchet.policy.embedded.corpus import task_texts
    from ratchet.policy.embedded.model import build_base_policy
    from ratchet.policy.embedded.decoding import read_view, write_decoding
    from dataclasses import replace
    from types import SimpleNamespace

    from ratchet.policy.lm_score import LMScorer
    from ratchet.training.recipe import RecipeSettings, plot_curve, recipe_view, rl_stage, sft_stage, structured_rows
    from sandboxes.agents import fit_prior
    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime
    from sandboxes.tools import TOOL_SCHEMAS

    import os

    threads = a.threads or (min(2, os.cpu_count() or 1) if a.base == "smollm2" else 1)
    torch.set_num_threads(threads)
    out = Path(a.out)
    if not a.reuse_data:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    if a.test_cache:
        (out / "test-results.sqlite").unlink(missing_ok=True)
    rt = LocalRuntime(test_cache=out / "test-results.sqlite" if a.test_cache else None)
    t0, cpu = time.monotonic(), {}
    say = lambda s: print(f"[{time.monotonic() - t0:6.0f}s] {s}", flush=True)   # noqa: E731

    suite = build_suite(seed=0, limit=size["problems"] or None)     # --problems 0: all 164
    tasks = sorted(suite.tasks, key=lambda b: b.task_id)
    train, val, train_used = split_tasks(tasks, val_tasks=size["val_tasks"], train_tasks=size["train_tasks"],
                                         split_seed=a.split_seed)
    prior = fit_prior(train)
    # the proof, in every run: the prior (the prior harness's, the demonstrator's and the view's)
    # counts train tasks only, and no validation problem
    assert set(prior.task_ids) <= {b.task_id for b in train}
    assert not set(prior.task_ids) & {b.task_id for b in val} and prior.task_ids
    # the view every embedded policy here reads (the recipe's, from this train-fit prior)
    view = recipe_view(RecipeSettings(prior_view=not a.no_prior_view, hide_task=a.hide_task,
                                       rank_actions=a.rank_actions, tier_progress=a.tier_progress,
                                       pick_note=a.pick, follow_notes=a.follow), [], prior)
    # what the view really holds (the JSON and the log report it, not the flags)
    ordered, hidden = bool(view and view.get("candidates")), task_hidden(view)
    say(f"suite: {len(tasks)} tasks of {len({problem_number(b) for b in tasks})} problems; train {len(train)} (even problems), "
        f"validation {len(val)} sampled (odd problems); prior fit on {len(prior.task_ids)} train tasks")

    c = cpu_now()
    rows = [{"task_id": b.task_id, "split": "train", "repo": b.repo, "issue_id": b.issue_id,
             "issue_title": b.issue_title, "issue_body": b.issue_body, "solution": b.files.get("solution.py")}
            for b in train]
    tiny = None
    if a.base == "smollm2":
        from ratchet.policy.pretrained import build_pretrained_base
        base = build_pretrained_base(out / "base")
        # the small from-scratch base beside it, untrained (`untrained_tiny`): what the pretrained
        # weights add before any training
        tiny = build_base_policy(out / "tiny-base", task_texts(rows, structured_tools(TOOL_SCHEMAS)))
    else:
        base = build_base_policy(out / "base", task_texts(rows, structured_tools(TOOL_SCHEMAS)))
    cpu["base_policy"] = cpu_now() - c
    rs = RecipeSettings(max_turns=a.max_turns)
    # the untrained policy reads the same view as the trained ones (no weights learn from it)
    for b_ in (base, *((tiny,) if tiny else ())):
        write_decoding(b_, action_mask="structured", bounds=rs.grpo().bounds(), view=view)
    say(f"base_policy {base.name} built in {cpu['base_policy']:.0f} CPU s (train tasks only); view: "
        f"{'candidates in the prior order' if ordered else 'the environment order'}{', names no task' if hidden else ''}"
        f"{', calls name ranks' if rank_actions(view) else ', calls name env numbers'}")

    c = cpu_now()
    # v2: the structured agent follows the mask's attempt structure (no give-up before the turn limit)
    cached = data_file(out, len(train_used), a.k, a.max_turns, a.split_seed)
    if a.reuse_data and cached.exists():
        demo = json.loads(cached.read_text())
    else:
        demo = run_harness("structured", train_used, prior=prior, k=a.k, max_turns=a.max_turns, runtime=rt)
        cached.write_text(json.dumps(demo))
    cpu["data"] = cpu_now() - c
    data = demonstration_rows(demo)
    solved = {d["task_id"] for d in demo if d["passed"]}
    curriculum = [b for b in train_used if a.rl_curriculum == "train" or b.task_id in solved]
    cpu["curriculum"] = 0.0
    if a.rl_curriculum in ("fresh", "mixed", "hard"):
        # GRPO on train tasks SFT never saw: its groups then reward what carries over to a new task,
        # not the recall of a demonstration SFT was fitted to (the demonstrator's pass = groups hold passes);
        # "mixed": those and the demonstration tasks together
        c = cpu_now()
        fresh = fresh_solved(out, train, train_used, prior=prior, k=a.k, max_turns=a.max_turns, n=a.fresh_tasks,
                             runtime=rt, reuse=a.reuse_data)
        curriculum = fresh if a.rl_curriculum == "fresh" else curriculum + fresh
        cpu["curriculum"] = cpu_now() - c
        # "hard": filtered after SFT (below), by the SFT policy's greedy episodes
    say(f"training data: the structured agent solved {len(data)}/{len(demo)} train tasks "
        f"({cpu['data']:.0f} CPU s); RL curriculum: {len(curriculum)} tasks ({a.rl_curriculum}"
        f"{', %.0f CPU s to find them' % cpu['curriculum'] if cpu['curriculum'] else ''})")

    rs = RecipeSettings(sft_epochs=size["sft_epochs"], rl_steps=size["rl_steps"], rl_lr=a.rl_lr, rl_beta=a.rl_beta,
                        sft_lr=a.sft_lr, masked_logprobs=not a.unmasked_logprobs,
                        rl_updates_per_step=a.rl_updates_per_step, rl_turn_cost=a.rl_turn_cost,
                        rl_minibatches=a.rl_minibatches,
                        rl_tasks_per_step=size["rl_tasks_per_step"], rl_group_size=size["rl_group_size"],
                        max_turns=a.max_turns, prior_view=not a.no_prior_view, hide_task=a.hide_task,
                        rank_actions=a.rank_actions, tier_progress=a.tier_progress, pick_note=a.pick,
                        follow_notes=a.follow, threads=threads)

    def on_step(r, seed=0):
        say(f"  rl seed {seed} step {r['step']}: pass {r['pass_rate']} reward {r['reward'] and round(r['reward'], 3)} "
            f"kl {r['kl']:.4f} entropy {r['entropy']:.3f} flat {r.get('flat_groups')} cpu {r['cpu_s']:.0f}s")
    sft_meta = out / "candidate" / "sft" / "ratchet_checkpoint.json"
    if a.reuse_data and sft_meta.exists() and read_view(sft_meta.parent) == view:
        # the SFT checkpoint of an earlier run with the same data and settings (--reuse-data): its
        # measured CPU seconds come from its own record
        meta = json.loads(sft_meta.read_text())
        sft = SimpleNamespace(checkpoint=sft_meta.parent, cpu_s=meta["cpu_s"], losses=meta["losses"],
                              steps=meta["steps"], n_examples=meta["n_examples"])
        say(f"SFT reused from {sft.checkpoint} ({sft.cpu_s:.0f} CPU s when it was trained)")
    else:
        shutil.rmtree(out / "candidate" / "sft", ignore_errors=True)
        sft = sft_stage(base, data, out / "candidate" / "sft", rs, prior=prior)
    if a.rl_curriculum == "hard" and rs.rl_steps > 0:
        c = cpu_now()
        pool_n = len(curriculum)
        curriculum = greedy_failures(out, sft.checkpoint, curriculum, max_turns=a.max_turns, max_tokens=rs.max_tokens,
                                     runtime=rt, reuse=a.reuse_data)
        cpu["curriculum"] += cpu_now() - c
        say(f"hard curriculum: the SFT policy's greedy episode fails {len(curriculum)} of {pool_n} tasks "
            f"({cpu_now() - c:.0f} CPU s)")
    rls = []
    for s in range(size["rl_seeds"] if rs.rl_steps > 0 else 0):
        # seed 0 in candidate/rl (the path every earlier run used), seed s in candidate/rl-seed{s}
        d = out / "candidate" / ("rl" if s == 0 else f"rl-seed{s}")
        shutil.rmtree(d, ignore_errors=True)
        rls.append(rl_stage(sft.checkpoint, curriculum, d, replace(rs, seed=s), runtime=rt,
                            on_step=lambda r, s=s: on_step(r, s), resume=False))
        plot_curve(rls[-1].history, out / ("rl_curve.png" if s == 0 else f"rl_curve-seed{s}.png"), f"GRPO seed {s}",
                   ("reward", "pass_rate", "kl", "entropy"))
        say(f"RL seed {s}: {len(rls[-1].history)} steps, {rls[-1].cpu_s:.0f} CPU s")
    rl = rls[0] if rls else None
    res = SimpleNamespace(sft=sft, rl=rl, n_structured=len(structured_rows(data)))
    plot_curve([{"step": i + 1, "loss": v} for i, v in enumerate(sft.losses)], out / "sft_curve.png", "SFT", ("loss",))
    # one candidate's cost: SFT + its RL; with several RL seeds the mean and (for the target) the costliest
    cpu["sft"] = sft.cpu_s
    cpu["rl"] = sum(r.cpu_s for r in rls) / len(rls) if rls else 0.0
    cpu["rl_max"] = max((r.cpu_s for r in rls), default=0.0)
    say(f"SFT: {res.sft.steps} steps, loss {res.sft.losses[0]:.2f} -> {res.sft.losses[-1]:.2f}, "
        f"{res.sft.n_examples} examples ({res.n_structured} structured), {cpu['sft']:.0f} CPU s; "
        f"RL: {len(rls)} seed(s) x {len(rl.history) if rl else 0} steps, {cpu['rl']:.0f} CPU s a seed "
        f"(max {cpu['rl_max']:.0f})")

    results, eval_cpu, per_task, seed_rows = {}, {}, {}, []
    seeds = tuple(range(a.eval_seeds))
    for name, fn in (
            ("random", lambda: run_harness("random", val, prior=None, k=a.k, max_turns=a.max_turns, runtime=rt,
                                           seeds=seeds)),
            ("sbfl", lambda: run_harness("sbfl", val, prior=None, k=a.k, max_turns=a.max_turns, runtime=rt)),
            ("prior", lambda: run_harness("prior", val, prior=prior, k=a.k, max_turns=a.max_turns, runtime=rt)),
            *((("lm", lambda: run_harness("lm", val, prior=None, k=a.k, max_turns=a.max_turns, runtime=rt,
                                          scorer=LMScorer(base))),) if a.base == "smollm2" else ()),
            *((("untrained_tiny", lambda: run_embedded(tiny, val, max_turns=a.max_turns, max_tokens=rs.max_tokens,
                                                       temperature=a.temperature, runtime=rt, seeds=seeds)),)
              if tiny else ()),
            ("untrained", lambda: run_embedded(base, val, max_turns=a.max_turns, max_tokens=rs.max_tokens,
                                               temperature=a.temperature, runtime=rt, seeds=seeds, threads=threads)),
            ("sft", lambda: run_embedded(res.sft.checkpoint, val, max_turns=a.max_turns, max_tokens=rs.max_tokens,
                                         temperature=a.temperature, runtime=rt, seeds=seeds, threads=threads)),
            *((f"rl_seed{s}", lambda p=p: run_embedded(p, val, max_turns=a.max_turns, max_tokens=rs.max_tokens,
                                                         temperature=a.temperature, runtime=rt, seeds=seeds, threads=threads))
              for s, p in enumerate([r.checkpoint for r in rls] or [res.sft.checkpoint]))):
        c = cpu_now()
        rows_ = fn()
        per_task[name] = per_task_rate(rows_)
        results[name] = summarise(rows_)
        eval_cpu[name] = round(cpu_now() - c, 1)
        say(f"eval {name}: {results[name]} ({eval_cpu[name]:.0f} CPU s)")
        if name.startswith("rl_seed"):
            seed_rows.extend(rows_)
    # RL pooled over its seeds: per task, the mean over every RL seed's episodes (each seed has the same
    # tasks x evaluation seeds, so this is the mean of the seeds' per-task rates)
    per_task["rl"], results["rl"] = per_task_rate(seed_rows), summarise(seed_rows)

    png = plot(results, cpu, out / "learning.png", rl_seeds=len(rls))
    (out / "per_task.json").write_text(json.dumps(per_task, indent=1, sort_keys=True))
    print()
    print(f"{'policy':<12}{'success':>9}{'95% CI':>16}{'first try':>11}{'95% CI':>16}{'n':>5}")
    for k in (*(("untrained_tiny",) if "untrained_tiny" in results else ()), "untrained", "random", "sbfl", "prior", *(("lm",) if "lm" in results else ()), "sft", "rl"):
        r = results[k]
        ci = lambda v: f"[{v[0]:.2f}, {v[1]:.2f}]"   # noqa: E731
        print(f"{k:<12}{r['pass']:>9.3f}{ci(r['pass_ci']):>16}{r['first_try']:>11.3f}{ci(r['first_try_ci']):>16}{r['n']:>5}")
        if k == "rl" and len(rls) > 1:
            for s in range(len(rls)):
                r = results[f"rl_seed{s}"]
                print(f"{'  seed ' + str(s):<12}{r['pass']:>9.3f}{ci(r['pass_ci']):>16}{r['first_try']:>11.3f}"
                      f"{ci(r['first_try_ci']):>16}{r['n']:>5}")
    print(f"CPU s: base_policy {cpu['base_policy']:.0f} (one-off), data {cpu['data']:.0f}, SFT {cpu['sft']:.0f}, "
          f"RL {cpu['rl']:.0f} a seed (max {cpu['rl_max']:.0f}); eval {eval_cpu}; wall {time.monotonic() - t0:.0f} s; plot {png}")
    sft_p, rl_p = results["sft"]["pass"], results["rl"]["pass"]
    from ratchet.evaluation.stats import paired_difference
    paired = {f"{a_}_minus_{b_}": paired_difference(per_task[a_], per_task[b_])
              for a_, b_ in (("rl", "sft"), ("sft", "random"), ("rl", "sbfl"), ("rl", "prior"), ("sft", "untrained"),
                             *((("rl", "lm"),) if "lm" in per_task else ()))}
    seed_paired = {s: paired_difference(per_task[f"rl_seed{s}"], per_task["sft"]) for s in range(len(rls))}
    for k, iv in paired.items():
        print(f"paired {k}: {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}] over {iv.n} tasks"
              f"{' (RL pooled over %d seeds)' % len(rls) if k.startswith('rl_') and len(rls) > 1 else ''}")
    if len(rls) > 1:
        print("paired rl_minus_sft by RL seed: " + ", ".join(f"seed {s} {iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]"
                                                            for s, iv in seed_paired.items()))
    summary = {
        "bench": "learning", "mode": "quick" if a.quick else "default", "base": a.base, "threads": threads, **{f"{k}_pass": results[k]["pass"] for k in results},
        **{f"{k}_first_try": results[k]["first_try"] for k in results},
        **{f"{k}_pass_ci": results[k]["pass_ci"] for k in results},
        # the names the targets are stated in: the base with no weight change, the lm harness, and the
        # small from-scratch base untrained (the base itself when --base embedded)
        "prompted_pass": results["untrained"]["pass"],
        "untrained_tiny_pass": results.get("untrained_tiny", results["untrained"])["pass"],
        **({"lm_harness_pass": results["lm"]["pass"]} if "lm" in results else {}),
        "train_cpu_min": round((cpu["sft"] + cpu["rl_max"]) / 60, 2), "settings": {**size, "rl_lr": a.rl_lr,
                                                                          "rl_beta": a.rl_beta, "sft_lr": a.sft_lr,
                                                                          "rl_updates_per_step": a.rl_updates_per_step, "rl_minibatches": a.rl_minibatches,
                                                                          "rl_curriculum": a.rl_curriculum, "rl_turn_cost": a.rl_turn_cost,
                                                                          "temperature": a.temperature,
                                                                          "masked_logprobs": not a.unmasked_logprobs,
                                                                          "max_turns": a.max_turns, "k": a.k,
                                                                          "eval_seeds": a.eval_seeds,
                                                                          "split_seed": a.split_seed}, "sft_cpu_min": round(cpu["sft"] / 60, 2),
        "rl_cpu_min": round(cpu["rl"] / 60, 2), "rl_cpu_min_max": round(cpu["rl_max"] / 60, 2),
        "rl_seeds": [{"seed": s, "pass": results[f"rl_seed{s}"]["pass"], "pass_ci": results[f"rl_seed{s}"]["pass_ci"],
                      "first_try": results[f"rl_seed{s}"]["first_try"], "cpu_min": round(r.cpu_s / 60, 2),
                      "rl_minus_sft": [seed_paired[s].estimate, seed_paired[s].lo, seed_paired[s].hi],
                      "history": [{k: h.get(k) for k in ("step", "pass_rate", "reward", "kl")} for h in r.history]}
                     for s, r in enumerate(rls)],
        "base_policy_cpu_min": round(cpu["base_policy"] / 60, 2),
        "data_cpu_min": round(cpu["data"] / 60, 2), "curriculum_cpu_min": round(cpu["curriculum"] / 60, 2), "eval_cpu_min": round(sum(eval_cpu.values()) / 60, 2),
        "val_tasks": len(val), "train_tasks": len(train), "train_trajectories": len(data),
        "rl_tasks": len(curriculum), "sft_steps": res.sft.steps,
        "view": {"candidates": "prior" if ordered else "env", "task": "hidden" if hidden else "shown",
                 "actions": "rank" if rank_actions(view) else "env",
                 "progress": (view or {}).get("progress", "none"),
                 "pick": (view or {}).get("pick", "none"), "follow": (view or {}).get("follow", "none"), "prior_tasks": len(prior.task_ids),
                 "sft": read_view(res.sft.checkpoint) == view,
                 "rl": all(read_view(r.checkpoint) == view for r in rls) if rls else None}, "rl_steps": len(res.rl.history) if res.rl else 0,
        "rl_history": [{k: h.get(k) for k in ("step", "pass_rate", "reward", "kl", "entropy", "flat_groups")}
                       for h in (res.rl.history if res.rl else [])],
        "baseline": "sft", "ratio": round(rl_p / sft_p, 3) if sft_p else None,
        "rl_minus_sft": round(rl_p - sft_p, 3),
        "paired": {k: [iv.estimate, iv.lo, iv.hi] for k, iv in paired.items()}, "plot": str(png), "wall_s": round(time.monotonic() - t0, 1),
        "test_cache": rt.test_cache.stats() if rt.test_cache is not None else None}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
