"""Render bench: the embedded policy's prompt for every turn of real episodes, with `prepare`'s
per-message memo (ratchet.policy.embedded.chat.MEMO) against without it.

Every turn's prompt is the chat template over the whole conversation so far, so without the memo
each turn redoes every earlier message's view (candidate lists in the prior's order, compacted
rows) and each call's canonical arguments with its schema check: quadratic in turns. The
episodes: the structured agent (the demonstrator) on `--tasks` suite tasks, 14 turns, in the
sandbox; the view: the count prior fit on those tasks, as a trained checkpoint's. Both modes
render the same prompts (checked: identical text for every turn), alternating `--repeats` times;
the best time of each counts.

    .venv/bin/python bench/render.py [--tasks 24] [--repeats 3]

Final line: one JSON object; ratio = no-memo seconds / memo seconds (baseline: no memo).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)

    from ratchet.policy.action_mask import structured_tools
    from ratchet.policy.embedded import chat
    from sandboxes.agents import fit_prior, run_agent
    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime
    from sandboxes.tools import TOOL_SCHEMAS

    tasks = sorted(build_suite(seed=0, limit=a.tasks, per_problem=1).tasks, key=lambda b: b.task_id)[:a.tasks]
    prior = fit_prior(tasks)
    view = chat.make_view(prior, source="bench/render.py")
    tools = structured_tools(TOOL_SCHEMAS)
    rt = LocalRuntime()
    t0 = time.monotonic()
    convs = [run_agent("structured", b, runtime=rt, max_turns=14, k=4, prior=prior).messages for b in tasks]
    agent_s = time.monotonic() - t0
    # one prompt per assistant turn: the conversation before it
    prompts = [m[:i] for m in convs for i, msg in enumerate(m) if msg.get("role") == "assistant"]
    for p in prompts[:5]:                  # warm-up: the template's compile, imports
        chat.render(p, tools, view=view)
    times: dict[bool, list[float]] = {False: [], True: []}
    texts: dict[bool, list[str]] = {}
    for _ in range(a.repeats):
        for memo in (False, True):
            chat.MEMO = memo
            chat._tool_view.cache_clear()
            chat._canonical_cached.cache_clear()
            t = time.perf_counter()
            texts[memo] = [chat.render(p, tools, view=view) for p in prompts]
            times[memo].append(time.perf_counter() - t)
    chat.MEMO = True
    same = texts[False] == texts[True]
    base, ours = min(times[False]), min(times[True])
    print(f"render bench: {len(convs)} structured-agent episodes ({agent_s:.0f} s in the sandbox), "
          f"{len(prompts)} prompts, best of {a.repeats} alternating runs")
    print(f"  no memo {base:.3f} s, memo {ours:.3f} s; identical prompts: {same}")
    res = {"bench": "render", "episodes": len(convs), "prompts": len(prompts), "repeats": a.repeats,
           "baseline": "prepare without its per-message memo (chat.MEMO = False)",
           "baseline_s": round(base, 4), "ours_s": round(ours, 4), "identical": same,
           "all_s": {"no_memo": [round(x, 4) for x in times[False]], "memo": [round(x, 4) for x in times[True]]},
           "ratio": round(base / ours, 3)}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
