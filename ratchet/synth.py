"""Synthetic multi-turn trajectories in the native contract (for benchmarks, tests and the demo
before real agent logs exist). Deterministic for a seed; realistic shape: several turns, parallel
tool calls, long observations, approvals, token ids on some turns."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from ratchet.contract import Approval, Message, ToolCall, Trajectory

TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": []}}}
    for n, d in (("read_file", "Read a file"), ("run_tests", "Run the tests"),
                 ("edit", "Replace text"), ("search", "Search the repo"), ("submit", "Submit"))]
_WORDS = ("parser config cache index token buffer schema retry timeout handler queue worker "
          "session router model tensor batch shard vector").split()


def trajectory(i: int, rng: random.Random, tenants=("acme", "globex"), base=None) -> dict:
    base = base or datetime(2026, 11, 1, tzinfo=timezone.utc)
    tenant = tenants[i % len(tenants)]
    repo = f"{tenant}/svc-{rng.randrange(40)}"
    fn = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}"
    msgs = [Message("system", "You are a careful code-repair agent. Use the tools."),
            Message("user", f"Issue #{i}: `{fn}` returns the wrong value when the "
                            f"{rng.choice(_WORDS)} is empty. Fix it without touching tests.")]
    n_turns = rng.randint(2, 6)
    for t in range(n_turns):
        width = 2 if rng.random() < 0.3 else 1  # parallel tool calls
        calls = [ToolCall(f"c{i}_{t}_{k}", rng.choice(TOOLS)["function"]["name"],
                          {"path": f"src/{fn}.py", "line": rng.randrange(200)}) for k in range(width)]
        msgs.append(Message("assistant", f"Step {t}: checking {fn}.", tool_calls=calls,
                            token_ids=[rng.randrange(32000) for _ in range(8)] if t == 0 else None))
        for c in calls:
            body = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 120)))
            msgs.append(Message("tool", body, tool_call_id=c.id))
    msgs.append(Message("assistant", f"Fixed the empty-{fn} case; the comparison was off by one."))
    start = base + timedelta(minutes=i)
    latency = rng.uniform(10, 120)
    accepted = rng.random() < 0.6
    return Trajectory(
        trajectory_id=f"traj-{i:07d}", task_id=f"task-{i % 5000:05d}", messages=msgs,
        tenant_id=tenant, consent_id=f"CONSENT-{tenant.upper()}-TRN-2026-09", repo=repo,
        issue_id=f"{repo}#{i}", agent_id="support-agent@v7",
        started_at=start.isoformat(), ended_at=(start + timedelta(seconds=latency)).isoformat(),
        tools=TOOLS, approvals=[Approval(n_turns, "lead@" + tenant, "approved", start.isoformat())],
        patch=f"--- a/src/{fn}.py\n+++ b/src/{fn}.py\n@@ -1 +1 @@\n-    return x < n\n+    return x <= n\n",
        tests_passed=accepted or rng.random() < 0.2, accepted=accepted, human_edited=rng.random() < 0.3,
        prompt_tokens=rng.randint(800, 6000), completion_tokens=rng.randint(100, 900),
        cost_usd=round(rng.uniform(0.005, 0.2), 5), latency_s=round(latency, 3),
        environment_id="env://synthetic@v1", environment_digest="sha256:" + "0" * 64,
    ).to_record()


def write_jsonl(path, n: int, seed: int = 0, start: int = 0) -> int:
    import orjson

    rng = random.Random(seed)
    with open(path, "wb") as fh:
        for i in range(start, start + n):
            fh.write(orjson.dumps(trajectory(i, rng)) + b"\n")
    return n
