"""Imitation bench: how closely does an embedded checkpoint follow the demonstrator it learned from?

SFT imitates the structured agent (agent@v7-structured: localize, propose the top SBFL tier's
lines, try their candidates in the train-fit prior's order, test, undo, submit). A perfect imitator
would reach the demonstrator's success rate on problems it never trained on; this bench measures
how far a checkpoint is from that, and where the difference lies. On the validation tasks of a
`bench/learning.py` run (or its train tasks, `--tasks train`: the ones SFT trained on), per task:
the demonstrator's episode and the checkpoint's greedy episode (the holdout evaluation's decoding),
the same 14-turn budget. Reported: both success rates, the discordant tasks (one passes, the other
fails), agreement on the first attempt (line and candidate) and on the whole proposal sequence,
the proposals made before the first attempt (each costs a turn), and for every task the
demonstrator passes and the checkpoint fails, both episodes' proposals and attempts. Then
teacher-forced: every turn of the demonstrator's passing episodes, its prefix given to the
checkpoint, per kind of decision (`attempt`: where the demonstrator stops listing lines and
applies a candidate; `list`: which line it lists next), how often the checkpoint's call is the
same tool and the same call (measured by this bench; see docs/experiments/).

    .venv/bin/python bench/imitation.py --run /tmp/ratchet-learning        # that run's sample, its SFT
    .venv/bin/python bench/imitation.py --run /tmp/ratchet-learning --checkpoint /tmp/exp/A/rl
    .venv/bin/python bench/imitation.py --run /tmp/ratchet-learning --tasks train   # its demonstration tasks

Final line: one JSON object; ratio = policy_pass / demonstrator_pass, baseline = the demonstrator.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import learning as L  # noqa: E402  (bench/learning.py: the same suite, split and helpers)


def calls(messages) -> list[tuple[str, dict]]:
    out = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for c in m.get("tool_calls") or ():
            args = c["function"]["arguments"]
            out.append((c["function"]["name"], json.loads(args) if isinstance(args, str) else dict(args)))
    return out


def decision(name: str, earlier: list[str]) -> str:
    """What kind of decision a demonstrated call is, from the calls before it: `attempt` (an
    apply_edit that is not an undo: the turn where the demonstrator stops listing), `list` (a
    propose_edits that is not an undo's), `undo` (either call of an undo), or the tool's name."""
    if name == "apply_edit":
        return "undo" if len(earlier) >= 2 and earlier[-2] == "run_tests" else "attempt"
    if name == "propose_edits":
        return "undo" if earlier and earlier[-1] == "run_tests" else "list"
    return name


def shape(messages) -> dict:
    """An episode's decisions: the lines proposed (in order), the attempts (line, candidate index)
    and the proposals made before the first attempt; an undo's calls are neither (`decision`)."""
    cs = calls(messages)
    proposals, attempts, before = [], [], None
    for i, (name, args) in enumerate(cs):
        kind = decision(name, [n for n, _ in cs[:i]])
        if kind == "list":
            proposals.append(args.get("line"))
        elif kind == "attempt":
            if before is None:
                before = len(proposals)
            attempts.append((args.get("line"), args.get("index")))
    return {"proposals": proposals, "attempts": attempts,
            "proposals_before_attempt": len(proposals) if before is None else before,
            "gave_up": bool(cs) and cs[-1][0] == "submit" and not attempts}


def compare(demo: list[dict], policy: list[dict]) -> dict:
    """Per-task rows of both agents (task_id, passed, infra, messages) -> the agreement summary."""
    by = {r["task_id"]: r for r in policy}
    rows = []
    for d in demo:
        p = by[d["task_id"]]
        if d["infra"] or p["infra"]:
            continue
        sd, sp = shape(d["messages"]), shape(p["messages"])
        rows.append({"task_id": d["task_id"], "demo_pass": d["passed"], "policy_pass": p["passed"], "demo": sd,
                     "policy": sp, "same_first": sd["attempts"][:1] == sp["attempts"][:1],
                     "same_proposals": sd["proposals"] == sp["proposals"]})
    n = len(rows) or 1
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0   # noqa: E731
    lost = [r for r in rows if r["demo_pass"] and not r["policy_pass"]]
    return {
        "n": len(rows),
        "demonstrator_pass": sum(r["demo_pass"] for r in rows) / n,
        "policy_pass": sum(r["policy_pass"] for r in rows) / n,
        "demo_only": len(lost),
        "policy_only": sum(1 for r in rows if r["policy_pass"] and not r["demo_pass"]),
        "same_first_attempt": sum(r["same_first"] for r in rows) / n,
        "same_proposals": sum(r["same_proposals"] for r in rows) / n,
        "demo_proposals_before_attempt": mean([r["demo"]["proposals_before_attempt"] for r in rows]),
        "policy_proposals_before_attempt": mean([r["policy"]["proposals_before_attempt"] for r in rows]),
        "demo_attempts": mean([len(r["demo"]["attempts"]) for r in rows]),
        "policy_attempts": mean([len(r["policy"]["attempts"]) for r in rows]),
        # where the checkpoint loses a task the demonstrator wins: another first attempt, and
        # (of those) another line rather than another candidate of the same line
        "lost_other_first": sum(1 for r in lost if not r["same_first"]),
        "lost_other_first_line": sum(1 for r in lost if not r["same_first"] and r["demo"]["attempts"][:1]
                                     and r["policy"]["attempts"][:1]
                                     and r["demo"]["attempts"][0][0] != r["policy"]["attempts"][0][0]),
        "lost_more_proposals": sum(1 for r in lost if r["policy"]["proposals_before_attempt"]
                                   > r["demo"]["proposals_before_attempt"]),
        "rows": rows,
    }


def teacher_forced(policy, episodes) -> dict:
    """Each demonstrated turn's prefix given to `policy` (greedy): per decision kind, how often it
    calls the same tool and makes the very same call (ranks turned back into the environment's
    numbers by the engine, so calls compare as logged)."""
    from ratchet.policy.base import GenerationRequest

    reqs, want = [], []
    for ep in episodes:
        earlier: list[str] = []
        for i, m in enumerate(ep["messages"]):
            if m.get("role") != "assistant" or not m.get("tool_calls"):
                continue
            (name, args), = calls([m])[:1]          # one call a turn, as the structured tools emit
            reqs.append(GenerationRequest(ep["messages"][:i], ep["tools"], seed=0))
            want.append((decision(name, earlier), name, args))
            earlier.append(name)
    out: dict = {}
    for s in range(0, len(reqs), 32):
        for comp, (kind, name, args) in zip(policy.generate(reqs[s:s + 32]), want[s:s + 32]):
            tc = comp[0].tool_calls[0] if comp[0].tool_calls else None
            row = out.setdefault(kind, {"n": 0, "tool": 0, "call": 0})
            row["n"] += 1
            row["tool"] += bool(tc and tc.name == name)
            row["call"] += bool(tc and tc.name == name and tc.arguments == args)
    return {k: {**v, "tool_rate": v["tool"] / v["n"], "call_rate": v["call"] / v["n"]} for k, v in sorted(out.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a bench/learning.py --out folder")
    ap.add_argument("--checkpoint", help="an embedded checkpoint (default: the run's candidate/sft)")
    ap.add_argument("--tasks", choices=("val", "train"), default="val",
                    help="val: the run's 60 validation tasks; train: its demonstration tasks (SFT's)")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--max-turns", type=int, default=14)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", help="write the per-task rows here (JSON)")
    a = ap.parse_args(argv)

    import torch
    from ratchet.policy import make_policy, run_episodes
    from sandboxes.agents.prior import fit_prior
    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime

    torch.set_num_threads(1)
    run = Path(a.run)
    ckpt = Path(a.checkpoint) if a.checkpoint else run / "candidate" / "sft"
    if not (ckpt / "ratchet_checkpoint.json").exists():
        raise SystemExit(f"{ckpt}: not an embedded checkpoint (no ratchet_checkpoint.json); run "
                         f"bench/learning.py --out {run} first")
    t0 = time.monotonic()
    say = lambda s: print(f"[{time.monotonic() - t0:6.0f}s] {s}", flush=True)   # noqa: E731
    suite = build_suite(seed=0, limit=None)
    train, val, used = L.split_tasks(sorted(suite.tasks, key=lambda b: b.task_id), val_tasks=60, train_tasks=124,
                                     split_seed=a.split_seed)
    prior = fit_prior(train)
    rt = LocalRuntime()
    bundles = val if a.tasks == "val" else used
    say(f"{len(bundles)} {a.tasks} tasks; the demonstrator (structured agent, prior fit on {len(prior.task_ids)} "
        f"train tasks) and {ckpt} at T = {a.temperature}")
    demo = L.run_harness("structured", bundles, prior=prior, k=a.k, max_turns=a.max_turns, runtime=rt)
    if a.tasks == "train":
        # SFT trained on the tasks the demonstrator solved: those are the ones to check the fit on
        solved = {d["task_id"] for d in demo if d["passed"]}
        demo = [d for d in demo if d["task_id"] in solved]
        bundles = [b for b in bundles if b.task_id in solved]
    say(f"demonstrator: {sum(d['passed'] for d in demo)}/{len(demo)} passed")
    pol = make_policy("embedded:imitation", path=str(ckpt), threads=1,
                      sampling={"temperature": a.temperature, "max_tokens": 96})
    recs = run_episodes(pol, [(b, 0) for b in bundles], concurrency=16, runtime=rt, max_turns=a.max_turns,
                        min_batch=16)
    policy = [{"task_id": r.task_id, "passed": bool(r.passed), "infra": r.outcome == "infra_failure",
               "messages": r.messages} for r in recs]
    res = compare(demo, policy)
    say(f"checkpoint: {sum(p['passed'] for p in policy)}/{len(policy)} passed")
    tf = teacher_forced(pol, [d for d in demo if d["passed"] and not d["infra"]])
    say(f"teacher-forced on the demonstrator's {sum(1 for d in demo if d['passed'])} passing episodes")
    print()
    print(f"{'':<38}{'demonstrator':>14}{'checkpoint':>12}")
    print(f"{'success':<38}{res['demonstrator_pass']:>14.3f}{res['policy_pass']:>12.3f}")
    print(f"{'proposals before the first attempt':<38}{res['demo_proposals_before_attempt']:>14.2f}"
          f"{res['policy_proposals_before_attempt']:>12.2f}")
    print(f"{'attempts':<38}{res['demo_attempts']:>14.2f}{res['policy_attempts']:>12.2f}")
    print(f"same first attempt {res['same_first_attempt']:.3f}, same proposal sequence {res['same_proposals']:.3f}; "
          f"demonstrator only {res['demo_only']}, checkpoint only {res['policy_only']} of {res['n']} tasks")
    print(f"of the {res['demo_only']} the checkpoint loses: another first attempt {res['lost_other_first']} "
          f"({res['lost_other_first_line']} on another line), more proposals first {res['lost_more_proposals']}")
    print("teacher-forced on the demonstrator's passing episodes (its prefix, the checkpoint's next call):")
    for k, v in tf.items():
        print(f"  {k:<14}{v['n']:>5} turns   same tool {v['tool_rate']:.3f}   same call {v['call_rate']:.3f}")
    for r in res["rows"]:
        if r["demo_pass"] and not r["policy_pass"]:
            print(f"  {r['task_id']}: proposals {r['demo']['proposals']} / {r['policy']['proposals']}; "
                  f"attempts {r['demo']['attempts']} / {r['policy']['attempts']}")
    if a.out:
        Path(a.out).write_text(json.dumps(res["rows"], indent=1, default=str))
    summary = {k: v for k, v in res.items() if k != "rows"}
    summary["teacher_forced"] = {k: {"n": v["n"], "tool": round(v["tool_rate"], 3), "call": round(v["call_rate"], 3)}
                                 for k, v in tf.items()}
    summary.update({"bench": "imitation", "tasks": a.tasks, "checkpoint": str(ckpt), "temperature": a.temperature,
                    "baseline": "demonstrator",
                    "ratio": res["policy_pass"] / res["demonstrator_pass"] if res["demonstrator_pass"] else None,
                    "wall_s": round(time.monotonic() - t0, 1)})
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
