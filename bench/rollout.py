"""Rollout bench: episodes/s with batched generation across concurrent episodes vs one episode at
a time, on the same tasks and seeds, with the same policy.

Baseline: `run_policy_episode` per job, one after another (each turn one `generate` of one
request). One process: `run_episodes(concurrency=C)`: up to C episodes open, their sandbox steps
in a thread pool while the model generates for every waiting episode in one batch. Ours (the GRPO
default, `RecipeSettings.rl_rollout_workers`): the same over `--workers` worker processes
(`ratchet.policy.rollout_pool.RolloutPool`), each batching its contiguous share of the episodes
with one torch thread; their start (spawn, imports, zygote) is a warm-up call outside the timing,
as the engine's warm-up episode is. All are real episodes in the bwrap sandbox (reset, tool calls,
pristine verification at the end). CPU seconds per mode: `sandboxes.cpu_meter.tree_cpu_s`
(this process, its sandboxes and the workers' own reports).

Policy: the embedded base policy (`ratchet.policy.embedded.model`: random weights, its tokenizer
trained on train-split problems that are not benched, its chat format), sampling at temperature 1,
up to 128 new tokens a turn. Unconstrained by default: a random model then writes no valid call,
so the sandbox work is each episode's reset and final verification and the bench measures the
generation side. `--grammar` decodes under the tool-call grammar (valid random calls that the
sandbox executes); `--hidden/--layers` a wider random model; `--tiny` a 2-layer one with a small
local tokenizer. Per-row seeded sampling makes both modes sample the same tokens: `identical` says
whether every episode's transcript matched.

    .venv/bin/python bench/rollout.py [--tasks 16] [--concurrency 16] [--max-turns 4] [--grammar]

The final line is one JSON object; ratio = ours (pooled; one process with `--workers 0`) episodes/s
over one-at-a-time episodes/s; `ratio_one_process` the one-process batched mode's.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _tasks(n: int):
    """n benched tasks (one mutant per problem) and the train-side rows of other problems."""
    from sandboxes.humaneval import build_suite

    suite = build_suite(seed=0, limit=n + 24, per_problem=1).tasks
    by_problem = {}
    for b in suite:
        by_problem.setdefault((b.metadata or {}).get("problem_id", b.repo), b)
    bundles = sorted(by_problem.values(), key=lambda b: b.task_id)
    return bundles[:n], bundles[n:]


def _embedded_policy(train, cache: Path, grammar: dict, constrained: bool = True, hidden: int | None = None,
                     layers: int | None = None):
    from ratchet.policy.embedded.corpus import task_texts
    from ratchet.policy.embedded.model import build_base_policy, load_policy
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from sandboxes.tools import TOOL_SCHEMAS

    rows = [{"task_id": b.task_id, "split": "train", "repo": b.repo, "issue_id": b.issue_id,
             "issue_title": b.issue_title, "issue_body": b.issue_body, "solution": b.files.get("solution.py")}
            for b in train]
    path = build_base_policy(cache, task_texts(rows, TOOL_SCHEMAS))
    model, tok = load_policy(path)
    name = "embedded base_policy (random weights)"
    if hidden or layers:              # the same tokenizer and chat format, a wider/deeper random model
        from dataclasses import replace

        from ratchet.policy.embedded.model import EmbeddedConfig, new_model
        c = EmbeddedConfig()
        c = replace(c, hidden_size=hidden or c.hidden_size, intermediate_size=3 * (hidden or c.hidden_size),
                    num_hidden_layers=layers or c.num_hidden_layers)
        model = new_model(tok, c)
        name = f"random Qwen2 (embedded tokenizer, hidden {c.hidden_size}, {c.num_hidden_layers} layers)"
    return TransformersPolicy(model.eval(), tok, policy_id="embedded:base", constrained=constrained,
                              chat="embedded", grammar=grammar), \
        {"model": name, "path": str(path), "constrained": constrained}


def timed_generate(policy) -> tuple[list, list]:
    """Wrap `policy.generate`; returns (sizes, seconds): each call's request count is appended to
    sizes and its wall time added to seconds[0]."""
    sizes, spent = [], [0.0]
    gen = policy.generate

    def timed(reqs):
        sizes.append(len(reqs))
        t = time.monotonic()
        try:
            return gen(reqs)
        finally:
            spent[0] += time.monotonic() - t
    policy.generate = timed
    return sizes, spent


def _tiny_policy():
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from tests.policy.conftest import tiny_model

    return TransformersPolicy(*tiny_model(), policy_id="hf:tiny"), \
        {"model": "tiny random Qwen2 (2 layers, hidden 64)", "constrained": False}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core machine 2 threads were 8x slower per step)")
    ap.add_argument("--batched-threads", type=int, default=None,
                    help="torch threads for the batched run only (default: --threads). One episode at a time "
                         "is fastest at 1 thread here (batch-1 matmuls are too small to split), a batch of 16 "
                         "at 2: `--batched-threads 2` compares each mode at its own best")
    ap.add_argument("--max-string", type=int, default=None,
                    help="grammar bound on JSON strings (default: ratchet.policy.grammar.Bounds)")
    ap.add_argument("--thought-chars", type=int, default=None, help="grammar bound on the thought line")
    ap.add_argument("--min-batch", type=int, default=None,
                    help="run_episodes min_batch (default: --concurrency, i.e. turns in lockstep; measured "
                         "faster here than generating for half the episodes while the others step)")
    ap.add_argument("--grammar", action="store_true",
                    help="decode under the tool-call grammar (xgrammar; its per-token cost is per row, not batched)")
    ap.add_argument("--hidden", type=int, default=None, help="a random model of this width (embedded tokenizer)")
    ap.add_argument("--layers", type=int, default=None, help="... and this depth")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer random model, unconstrained")
    ap.add_argument("--no-share-prefix", action="store_true",
                    help="every row attends its own copy of the system turn's KV (the engine before shared-prefix attention)")
    ap.add_argument("--cache", default=None, help="where the embedded base is built (default: a temp dir)")
    ap.add_argument("--workers", type=int, default=2,
                    help="rollout worker processes for the pooled mode (ratchet.policy.rollout_pool: each "
                         "batches its share of the concurrent episodes, one torch thread each); 0: skip it")
    a = ap.parse_args(argv)

    import torch

    from ratchet.policy import Sampling, run_episodes, run_policy_episode
    from sandboxes.runtime import LocalRuntime

    torch.set_num_threads(a.threads)
    bench_tasks, train = _tasks(a.tasks)
    with tempfile.TemporaryDirectory() as tmp:
        grammar = {}
        if a.max_string or a.thought_chars:
            from dataclasses import replace

            from ratchet.policy.grammar import Bounds
            b = Bounds()
            grammar = {"bounds": replace(b, max_string=a.max_string or b.max_string,
                                         thought_chars=a.thought_chars or b.thought_chars)}
        policy, info = _tiny_policy() if a.tiny else _embedded_policy(train, Path(a.cache or tmp), grammar,
                                                                            a.grammar, a.hidden, a.layers)
        policy.share_prefix = not a.no_share_prefix
        info["grammar"] = repr(grammar.get("bounds", "default bounds")) if info["constrained"] else None
        params = sum(p.numel() for p in policy.model.parameters())
        rt = LocalRuntime(Path(tmp) / "rt")
        sampling = Sampling(temperature=1.0, max_tokens=a.max_tokens)
        jobs = [(b, a.seed + i) for i, b in enumerate(bench_tasks)]
        kw = {"runtime": rt, "max_turns": a.max_turns, "sampling": sampling}

        sizes, gen_s = timed_generate(policy)
        run_policy_episode(policy, *jobs[0], **kw)                  # warm-up (imports, grammar compile)
        from sandboxes.worktree import template_checkout
        for b, _ in jobs:                # every task's snapshot + template checkout, built once per
            template_checkout(rt.snapshots.for_bundle(b))  # runtime: neither timed mode pays for them
        sizes.clear()
        gen_s[0] = 0.0

        from sandboxes.cpu_meter import tree_cpu_s
        t0, c0 = time.monotonic(), tree_cpu_s()
        seq = [run_policy_episode(policy, b, s, **kw) for b, s in jobs]
        seq_s, seq_cpu = time.monotonic() - t0, tree_cpu_s() - c0
        seq_calls, seq_gen = len(sizes), gen_s[0]
        sizes.clear()
        gen_s[0] = 0.0
        bat_threads = a.batched_threads if a.batched_threads is not None else a.threads
        torch.set_num_threads(bat_threads)
        t0, c0 = time.monotonic(), tree_cpu_s()
        shared0 = policy.stats.get("shared_prefix_tokens", 0)
        bat = run_episodes(policy, jobs, concurrency=a.concurrency, min_batch=a.min_batch or a.concurrency, **kw)
        bat_s, bat_gen, bat_cpu = time.monotonic() - t0, gen_s[0], tree_cpu_s() - c0
        shared_tokens = policy.stats.get("shared_prefix_tokens", 0) - shared0
        pooled, pool_s, pool_cpu = None, None, None
        if a.workers > 1:
            from ratchet.policy.rollout_pool import RolloutPool
            engine = {"policy_id": policy.policy_id, "constrained": policy.constrained, "chat": policy.chat,
                      "grammar": policy.grammar, "share_prefix": policy.share_prefix}
            pkw = {"concurrency": a.concurrency, "min_batch": a.min_batch or a.concurrency, "max_turns": a.max_turns,
                   "sampling": sampling}
            with RolloutPool(a.workers, runtime=rt) as pool:
                # warm-up: the workers' start (spawn, imports, their zygotes) is paid once per
                # training run, like the warm-up episode above; excluded from the timing
                pool.run(policy.model, policy.tok, engine, jobs[:a.workers], runtime=rt, **pkw)
                c0, t0 = tree_cpu_s(), time.monotonic()
                pooled = pool.run(policy.model, policy.tok, engine, jobs, runtime=rt, **pkw)
                pool_s, pool_cpu = time.monotonic() - t0, tree_cpu_s() - c0
                assert pool.fallbacks == 0, "a rollout worker died"

    same = [x.messages == y.messages and x.reward == y.reward for x, y in zip(seq, bat)]
    same_pooled = [x.messages == y.messages and x.reward == y.reward for x, y in zip(seq, pooled or [])]
    n = len(jobs)
    turns = sum(r.turns for r in seq)
    tok_out = sum(r.tokens_out for r in seq)
    rows = [("sequential (one episode at a time)", seq_s, seq_calls, seq_gen, sum(r.sandbox_s for r in seq)),
            (f"batched (concurrency {a.concurrency})", bat_s, len(sizes), bat_gen, sum(r.sandbox_s for r in bat))]
    print(f"rollout bench: {n} episodes x <= {a.max_turns} turns, {info['model']}, {params:,} parameters, "
          f"constrained={info['constrained']} ({info['grammar']}), temperature 1.0, max_tokens {a.max_tokens}, "
          f"torch threads {a.threads} (batched: {bat_threads})")
    print(f"{'mode':38s} {'wall s':>8s} {'eps/s':>8s} {'generate calls':>15s} {'generate s':>11s} "
          f"{'sandbox s (sum)':>16s}")
    if pooled is not None:
        rows.append((f"{a.workers} worker processes (pooled)", pool_s, 0, float("nan"),
                     sum(r.sandbox_s for r in pooled)))
    for name, wall, calls, g, sb in rows:
        print(f"{name:38s} {wall:8.2f} {n / wall:8.3f} {calls:15d} {g:11.2f} {sb:16.2f}")
    print(f"turns {turns}, tokens out {tok_out}, mean batch {sum(sizes) / max(1, len(sizes)):.2f}, "
          f"max batch {max(sizes or [0])}, outcomes {sorted({r.outcome for r in bat})}, "
          f"identical transcripts {sum(same)}/{n}")
    result = {"bench": "rollout", "episodes": n, "max_turns": a.max_turns, "turns": turns, "tokens_out": tok_out,
              "model": info["model"], "parameters": params, "constrained": info["constrained"], "grammar": info["grammar"], "threads": a.threads, "batched_threads": bat_threads,
              "concurrency": a.concurrency, "ours_eps_per_s": round(n / bat_s, 4),
              "baseline": "one episode at a time (run_policy_episode)", "baseline_eps_per_s": round(n / seq_s, 4),
              "mean_batch": round(sum(sizes) / max(1, len(sizes)), 2), "identical": all(same),
              "identical_episodes": sum(same), "generate_s": round(bat_gen, 2), "baseline_generate_s": round(seq_gen, 2),
              "generate_ratio": round(seq_gen / bat_gen, 2),
              "share_prefix": not a.no_share_prefix, "shared_prefix_tokens": shared_tokens,
              "ratio_one_process": round(seq_s / bat_s, 2), "one_process_eps_per_s": round(n / bat_s, 4),
              "cpu_s": {"sequential": round(seq_cpu, 2), "one_process": round(bat_cpu, 2)}}
    if pooled is not None:
        result.update({"workers": a.workers, "pooled_eps_per_s": round(n / pool_s, 4), "pooled_identical": all(same_pooled),
                       "pooled_cpu_s": round(pool_cpu, 2), "ours_eps_per_s": round(n / pool_s, 4),
                       "ours": f"{a.workers} rollout worker processes (RolloutPool)"})
        result["cpu_s"]["pooled"] = round(pool_cpu, 2)
    best = pool_s if pooled is not None else bat_s
    result["ratio"] = round(seq_s / best, 2)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
