"""Measure the embedded SFT stage end to end on real expert trajectories (no warehouse needed):

    .venv/bin/python -m ratchet.training.measure_sft --problems 30 --tasks 40 --out /tmp/sft-measure

1. builds the HumanEval repair suite for the first `--problems` problems, splits them by problem
   (even problem numbers train, odd ones held out), and builds `base_policy` from the train
   tasks only (timed separately: the one-off build);
2. runs the scripted expert on up to `--tasks` train tasks in the real sandbox (or reads
   `--trajectories FILE.jsonl` with `messages` per line) and keeps the accepted trajectories;
3. trains SFT and prints the loss curve, CPU seconds and tokens/s, then samples one
   grammar-constrained first turn on each held-out task and reports how often it calls the tool
   the expert calls first (`view_issue`): a protocol check, not a pass rate.
Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _expert_runs(tasks, limit):
    from sandboxes.agents import run_agent

    out = []
    for i, b in enumerate(tasks[:limit]):
        r = run_agent("expert", b, seed=i)
        if r.accepted:
            out.append({"record_id": f"m-{i:03d}", "task_id": b.task_id, "messages": r.messages,
                        "tools": r.tools, "consent_id": "measure", "accepted": True})
    return out


def main(argv=None) -> int:
    from ratchet.training.sft import SFTSettings as SFT_DEFAULTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=30)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--trajectories", default=None)
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=SFT_DEFAULTS.threads)
    ap.add_argument("--lr", type=float, default=SFT_DEFAULTS.learning_rate)
    ap.add_argument("--batch", type=int, default=SFT_DEFAULTS.batch_size)
    ap.add_argument("--no-thoughts", action="store_true", help="train and decode calls only (no text before a call)")
    ap.add_argument("--out", default="/tmp/ratchet-sft-measure")
    a = ap.parse_args(argv)

    import torch

    from ratchet.policy.embedded.chat import parse_turn, render
    from ratchet.policy.embedded.corpus import task_texts
    from ratchet.policy.embedded.model import base_manifest, build_base_policy, load_policy
    from ratchet.policy.grammar import Bounds, tool_call_logits_processor
    from ratchet.training.sft import SFTSettings, train_sft
    from sandboxes.env import SYSTEM_PROMPT, user_prompt
    from sandboxes.humaneval import build_suite
    from sandboxes.tools import TOOL_SCHEMAS

    torch.set_num_threads(a.threads)
    suite = build_suite(seed=0, limit=a.problems)
    pnum = lambda b: int(str(b.metadata.get("problem_id", "x/0")).split("/")[-1])
    train = sorted((b for b in suite.tasks if pnum(b) % 2 == 0), key=lambda b: b.task_id)
    held = sorted((b for b in suite.tasks if pnum(b) % 2 == 1), key=lambda b: b.task_id)
    rows_t = [{"task_id": b.task_id, "repo": b.repo, "issue_id": b.issue_id, "split": "train",
               "issue_text": f"{b.issue_title}\n\n{b.issue_body}".strip(), "solution": b.files.get("solution.py")}
              for b in train]
    t0 = time.monotonic()
    base = build_base_policy(Path(a.out) / "base", task_texts(rows_t, TOOL_SCHEMAS))
    base_s = time.monotonic() - t0
    if a.trajectories:
        rows = [json.loads(x) for x in Path(a.trajectories).read_text().splitlines() if x.strip()]
        train_ids = {b.task_id for b in train}
        rows = [{**r, "record_id": r.get("record_id") or f"f-{i:03d}", "tools": r.get("tools") or TOOL_SCHEMAS,
                 "consent_id": "measure"} for i, r in enumerate(rows)
                if r.get("accepted") and r["task_id"] in train_ids]
    else:          # the expert's runs are cached beside the output (re-running them costs minutes)
        cache = Path(a.out) / f"expert-{a.problems}-{a.tasks}.jsonl"
        if cache.exists():
            rows = [json.loads(x) for x in cache.read_text().splitlines()]
        else:
            rows = _expert_runs(train, a.tasks)
            cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = train_sft(base, rows, Path(a.out) / "sft", SFTSettings(epochs=a.epochs, threads=a.threads,
                                                                      learning_rate=a.lr, batch_size=a.batch,
                                                                      thoughts=not a.no_thoughts))
    model, tok = load_policy(res.checkpoint)
    hits = 0
    bounds = Bounds(thought_chars=0) if a.no_thoughts else Bounds()
    for b in held[:20]:
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_prompt(b)}]
        ids = tok(render(msgs, TOOL_SCHEMAS), return_tensors="pt")
        gen = model.generate(**ids, do_sample=True, max_new_tokens=200,
                             logits_processor=[tool_call_logits_processor(tok, TOOL_SCHEMAS, bounds=bounds)])
        calls = parse_turn(tok.decode(gen[0, ids["input_ids"].shape[1]:]))["tool_calls"]
        hits += bool(calls) and calls[0]["function"]["name"] == "view_issue"
    man = base_manifest(base)
    print("loss curve:", " ".join(f"{x:.3f}" for x in res.losses))
    print(f"base_policy: {man['parameters']:,} parameters, vocab {man['vocab']}, corpus {man['corpus_texts']} "
          f"train tasks, built in {base_s:.1f} s")
    print(f"SFT: {res.n_examples} trajectories, {res.n_tokens:,} tokens ({res.n_loss_tokens:,} in the loss), "
          f"{res.steps} steps, {res.wall_s:.1f} s wall, {res.cpu_s:.1f} CPU s, "
          f"{res.n_tokens * a.epochs / max(res.wall_s, 1e-9):.0f} tokens/s")
    print(f"held-out first turn = view_issue: {hits}/{len(held[:20])}")
    print(json.dumps({"bench": "sft_measure", "base_build_s": round(base_s, 2), "parameters": man["parameters"],
                      "examples": res.n_examples, "tokens": res.n_tokens, "loss_tokens": res.n_loss_tokens,
                      "steps": res.steps, "sft_wall_s": res.wall_s, "sft_cpu_s": res.cpu_s,
                      "loss_first": res.losses[0], "loss_last": res.losses[-1],
                      "heldout_first_turn_view_issue": hits, "heldout_tasks": len(held[:20])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
