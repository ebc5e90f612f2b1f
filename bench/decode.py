"""Decode bench: the engine's fused decode steps (engines.fused_decode) vs transformers' forward,
on the same evaluation-shaped episodes.

Both modes run the same jobs through `run_episodes` (batched generation, every episode open at
once, sandbox steps in threads), with the same policy object, alternating `--repeats` times so
that a busy machine slows both alike; only `policy.fused_decode` differs. The policy is an
embedded checkpoint (`--checkpoint`, e.g. an SFT or RL candidate: grammar-constrained, greedy, its
action mask and view) or, without one, the random base policy built here. Reported: wall and
generate seconds per mode (the best of the repeats), decode forwards, and whether every
transcript is the same in both modes.

    .venv/bin/python bench/decode.py [--checkpoint DIR] [--tasks 24] [--max-turns 14] [--repeats 2]

The final line is one JSON object; ratio = reference generate_s / fused generate_s (the engine's
own time; `wall_ratio` includes the sandboxes).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None, help="an embedded checkpoint folder (default: the random base)")
    ap.add_argument("--tasks", type=int, default=24)
    ap.add_argument("--max-turns", type=int, default=14)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: as each evaluation worker)")
    a = ap.parse_args(argv)

    import torch

    from ratchet.policy import Sampling, make_policy, run_episodes
    from sandboxes.runtime import LocalRuntime

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rollout import _embedded_policy, _tasks, timed_generate

    torch.set_num_threads(a.threads)
    bench_tasks, train = _tasks(a.tasks)
    with tempfile.TemporaryDirectory() as tmp:
        if a.checkpoint:
            policy = make_policy("embedded:bench", path=a.checkpoint, memo_size=0)
            model = f"embedded checkpoint {a.checkpoint}"
        else:
            policy, info = _embedded_policy(train, Path(tmp), {}, True)
            policy.memo_size = 0
            model = info["model"]
        rt = LocalRuntime(Path(tmp) / "rt")
        jobs = [(b, i) for i, b in enumerate(bench_tasks)]
        kw = {"runtime": rt, "max_turns": a.max_turns, "concurrency": len(jobs),
              "sampling": Sampling(temperature=a.temperature, max_tokens=a.max_tokens)}
        _, spent = timed_generate(policy)
        run_episodes(policy, jobs[:2], **{**kw, "concurrency": 2})         # warm-up (imports, grammars)
        runs: dict[bool, list] = {True: [], False: []}
        for _ in range(a.repeats):
            for fused in (False, True):
                policy.fused_decode = fused
                policy._prefixes = type(policy._prefixes)(policy.prefix_cache)   # no KV carried between runs
                f0, spent[0] = policy.stats["forwards"], 0.0
                t0 = time.monotonic()
                recs = run_episodes(policy, jobs, **kw)
                runs[fused].append({"wall_s": time.monotonic() - t0, "generate_s": spent[0],
                                    "forwards": policy.stats["forwards"] - f0,
                                    "transcripts": [r.messages for r in recs],
                                    "turns": sum(r.turns for r in recs), "tokens": sum(r.tokens_out for r in recs),
                                    "passed": sum(r.passed for r in recs)})
    ref, fus = (min(runs[m], key=lambda r: r["generate_s"]) for m in (False, True))
    same = all(r["transcripts"] == runs[False][0]["transcripts"] for m in (False, True) for r in runs[m])
    print(f"decode bench: {len(jobs)} episodes x <= {a.max_turns} turns, {model}, temperature {a.temperature}, "
          f"max_tokens {a.max_tokens}, torch threads {a.threads}, best of {a.repeats} alternating runs")
    print(f"{'mode':34s} {'wall s':>8s} {'generate s':>11s} {'forwards':>9s} {'turns':>6s} {'tokens':>7s} {'passed':>7s}")
    for name, r in (("transformers forward (reference)", ref), ("fused decode steps", fus)):
        print(f"{name:34s} {r['wall_s']:8.2f} {r['generate_s']:11.2f} {r['forwards']:9d} {r['turns']:6d} "
              f"{r['tokens']:7d} {r['passed']:7d}")
    print("every run: generate s reference", [round(r["generate_s"], 2) for r in runs[False]],
          "fused", [round(r["generate_s"], 2) for r in runs[True]], f"; identical transcripts: {same}")
    result = {"bench": "decode", "episodes": len(jobs), "max_turns": a.max_turns, "model": model,
              "temperature": a.temperature, "threads": a.threads, "repeats": a.repeats,
              "baseline": "transformers' forward for decode steps (fused_decode=False)",
              "baseline_generate_s": round(ref["generate_s"], 3), "ours_generate_s": round(fus["generate_s"], 3),
              "baseline_wall_s": round(ref["wall_s"], 3), "ours_wall_s": round(fus["wall_s"], 3),
              "identical": same, "wall_ratio": round(ref["wall_s"] / fus["wall_s"], 3),
              "ratio": round(ref["generate_s"] / fus["generate_s"], 3)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
