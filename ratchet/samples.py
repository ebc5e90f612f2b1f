"""Realistic sample logs in every supported format (for tests, docs and the demo's landing folder).

Each builder returns what the harness writes: several turns, parallel tool calls, long
observations, costs and timestamps. `write_samples` lays them out as a landing folder."""
from __future__ import annotations

import json
from pathlib import Path

PATCH = ("diff --git a/src/pagination.py b/src/pagination.py\n--- a/src/pagination.py\n"
         "+++ b/src/pagination.py\n@@ -12,7 +12,7 @@ def page_count(total, size):\n"
         "-    return total // size\n+    return -(-total // size)\n")
ISSUE = ("page_count(10, 3) returns 3 but there are 4 pages: the last partial page is dropped. "
         "Expected ceil(total / size).")
LONG_LOG = "\n".join(f"src/module_{i:03d}.py:{i * 7 % 200}: def handler_{i}(request, *args, **kwargs):"
                     for i in range(400))  # ~25 KB observation, like a real grep over a repo


def mini_swe_agent_traj(instance_id: str = "acme__billing-1042") -> dict:
    obs = lambda rc, out: f"<returncode>{rc}</returncode>\n<output>\n{out}\n</output>"  # noqa: E731
    return {
        "trajectory_format": "mini-swe-agent-1",
        "info": {"exit_status": "Submitted", "submission": PATCH, "mini_version": "1.9.1",
                 "model_stats": {"instance_cost": 0.0831, "api_calls": 4},
                 "config": {"model": {"model_name": "gpt-5-mini"}, "agent": {"step_limit": 250}}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that can interact with a computer shell."},
            {"role": "user", "content": f"<pr_description>\n{ISSUE}\n</pr_description>"},
            {"role": "assistant", "content": "THOUGHT: find the function.\n\n```bash\ngrep -rn 'def ' src | head -400\n```"},
            {"role": "user", "content": obs(0, LONG_LOG)},
            {"role": "assistant", "content": "THOUGHT: read it.\n\n```bash\nsed -n 1,30p src/pagination.py\n```"},
            {"role": "user", "content": obs(0, "def page_count(total, size):\n    return total // size")},
            {"role": "assistant", "content": "Edit without a command block: format error expected."},
            {"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks."},
            {"role": "assistant", "content": "THOUGHT: fix and submit.\n\n```bash\nsed -i 's|total // size|-(-total // size)|' "
                                             "src/pagination.py && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff\n```"},
            {"role": "user", "content": obs(0, PATCH)},
        ],
    }


def swe_agent_traj(function_calling: bool = True) -> dict:
    steps = [
        {"thought": "Look at the repository.", "action": "find_file pagination.py", "execution_time": 0.41,
         "observation": "Found 1 matches for \"pagination.py\":\n/repo/src/pagination.py", "response": "", "state": "{}"},
        {"thought": "Open it.", "action": "open src/pagination.py", "execution_time": 0.22,
         "observation": LONG_LOG[:6000], "response": "", "state": "{}"},
        {"thought": "Fix the rounding.", "action": "edit 12:12\n    return -(-total // size)\nend_of_edit",
         "execution_time": 0.9, "observation": "File updated.", "response": "", "state": "{}"},
        {"thought": "Done.", "action": "submit", "execution_time": 0.3, "observation": PATCH, "response": "", "state": "{}"},
    ]
    history = [
        {"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": f"We're currently solving the following issue:\n{ISSUE}", "agent": "main", "message_type": "observation"},
    ]
    for i, s in enumerate(steps):
        if function_calling:
            cid = f"call_{i}"
            history.append({"role": "assistant", "content": s["thought"], "thought": s["thought"], "action": s["action"],
                            "agent": "main", "message_type": "action",
                            "tool_calls": [{"id": cid, "type": "function", "function": {
                                "name": "bash", "arguments": json.dumps({"command": s["action"]})}}]})
            history.append({"role": "tool", "content": s["observation"], "tool_call_ids": [cid], "agent": "main",
                            "message_type": "observation"})
        else:
            history.append({"role": "assistant", "content": f"{s['thought']}\n```\n{s['action']}\n```", "agent": "main"})
            history.append({"role": "user", "content": s["observation"], "agent": "main"})
    return {"environment": "swe_main", "trajectory": steps, "history": history,
            "info": {"swe_agent_version": "1.1.0", "exit_status": "submitted", "submission": PATCH,
                     "model_stats": {"instance_cost": 0.21, "tokens_sent": 18233, "tokens_received": 911, "api_calls": 4}},
            "replay_config": "{}"}


def atif_traj(session_id: str = "sess-7f3a", task_id: str = "acme/billing#1042") -> dict:
    return {
        "schema_version": "ATIF-v1.4", "session_id": session_id,
        "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "qwen3-coder-30b"},
        "steps": [
            {"step_id": 1, "timestamp": "2026-11-02T09:00:00Z", "source": "system", "message": "You are a repair agent."},
            {"step_id": 2, "timestamp": "2026-11-02T09:00:01Z", "source": "user", "message": ISSUE},
            {"step_id": 3, "timestamp": "2026-11-02T09:00:04Z", "source": "agent", "message": "Searching in parallel.",
             "reasoning_content": "Two searches at once save a turn.",
             "tool_calls": [{"tool_call_id": "t1", "function_name": "search", "arguments": {"pattern": "page_count"}},
                            {"tool_call_id": "t2", "function_name": "read_file", "arguments": {"path": "src/pagination.py"}}],
             "observation": {"results": [{"source_call_id": "t1", "content": LONG_LOG[:8000]},
                                         {"source_call_id": "t2", "content": "def page_count(total, size):\n    return total // size"}]},
             "metrics": {"prompt_tokens": 1520, "completion_tokens": 64, "cost_usd": 0.0021,
                         "completion_token_ids": [151644, 872, 198, 3838, 374]}},
            {"step_id": 4, "timestamp": "2026-11-02T09:00:09Z", "source": "agent", "message": "Apply the fix.",
             "tool_calls": [{"tool_call_id": "t3", "function_name": "edit",
                             "arguments": {"path": "src/pagination.py", "old": "total // size", "new": "-(-total // size)"}}],
             "observation": {"results": [{"source_call_id": "t3", "content": "edited 1 occurrence"}]},
             "metrics": {"prompt_tokens": 9800, "completion_tokens": 41, "cost_usd": 0.0102}},
            {"step_id": 5, "timestamp": "2026-11-02T09:00:15Z", "source": "agent", "message": "Fixed: floor division dropped the partial page."},
        ],
        "final_metrics": {"total_prompt_tokens": 11320, "total_completion_tokens": 105, "total_cost_usd": 0.0123, "total_steps": 5},
        "extra": {"task_id": task_id, "repo": "acme/billing", "patch": PATCH},
    }


def swebench_predictions() -> tuple[list[dict], dict]:
    preds = [{"instance_id": i, "model_name_or_path": "acme-agent-v7", "model_patch": PATCH if i != "django__django-11099" else ""}
             for i in ("astropy__astropy-12907", "django__django-11099", "sympy__sympy-20590")]
    reports = {
        "astropy__astropy-12907": {"astropy__astropy-12907": {
            "patch_is_None": False, "patch_exists": True, "patch_successfully_applied": True, "resolved": True,
            "tests_status": {"FAIL_TO_PASS": {"success": ["test_separable[compound_model6]"], "failure": []},
                             "PASS_TO_PASS": {"success": ["test_coord_matrix", "test_cdot"], "failure": []}}}},
        "sympy__sympy-20590": {"sympy__sympy-20590": {
            "patch_is_None": False, "patch_exists": True, "patch_successfully_applied": True, "resolved": False,
            "tests_status": {"FAIL_TO_PASS": {"success": [], "failure": ["test_immutable"]},
                             "PASS_TO_PASS": {"success": ["test__aresame"], "failure": []}}}},
    }
    return preds, reports


def bad_lines() -> list[bytes]:
    """One line per malformed-input case that can live inside a JSONL file."""
    ok = {"trajectory_id": "bad-base", "task_id": "t", "messages": [{"role": "user", "content": "hi"}]}
    return [
        b'{"trajectory_id": "trunc-1", "task_id": "t", "messages": [{"role": "user", "cont',   # truncated
        b'[1, 2, 3]',                                                                           # not an object
        b'{"trajectory_id": "utf8", "task_id": "t", "messages": [{"role": "user", "content": "caf\xe9"}]}',
        json.dumps({**ok, "trajectory_id": "types", "messages": "not a list"}).encode(),        # wrong type
        json.dumps({k: v for k, v in ok.items() if k != "trajectory_id"}).encode(),             # missing id
        json.dumps({**ok, "trajectory_id": "orphan", "messages": [
            {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "y"}]}).encode(),
        b'{"hello": "world", "n": 1}',                                                          # unknown format
        json.dumps({**ok, "trajectory_id": "nul", "messages": [{"role": "user", "content": "a\u0000b"}]}).encode(),
    ]


def write_samples(landing: Path, n_synthetic: int = 200, seed: int = 0) -> dict:
    """A landing folder with every format, attribution sidecars and some bad input."""
    from ratchet.synth import write_jsonl

    landing = Path(landing)
    harness = landing / "harness"
    swe = landing / "swebench"
    for d in (landing / "native", harness, swe / "logs" / "run1" / "acme-agent-v7", landing / "bad"):
        d.mkdir(parents=True, exist_ok=True)
    if n_synthetic:
        write_jsonl(landing / "native" / "acme-globex-2026-11-01.jsonl", n_synthetic, seed=seed)
    (harness / "_batch.yaml").write_text("tenant_id: initech\nconsent_id: CONSENT-INITECH-TRN-2026-09\n")
    (harness / "acme__billing-1042.traj.json").write_text(json.dumps(mini_swe_agent_traj(), indent=1))
    (harness / "acme__billing-1042.traj").write_text(json.dumps(swe_agent_traj(), indent=1))
    (harness / "session-7f3a.json").write_text(json.dumps(atif_traj(), indent=1))
    (swe / "_batch.yaml").write_text("tenant_id: acme\nconsent_id: CONSENT-ACME-EVAL-2026-10\n")
    preds, reports = swebench_predictions()
    (swe / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    for inst, rep in reports.items():
        d = swe / "logs" / "run1" / "acme-agent-v7" / inst
        d.mkdir(parents=True, exist_ok=True)
        (d / "report.json").write_text(json.dumps(rep, indent=1))
    (landing / "bad" / "corrupt-2026-11-01.jsonl").write_bytes(b"\n".join(bad_lines()) + b"\n")
    return {"synthetic": n_synthetic, "foreign": 3 + len(preds), "malformed": len(bad_lines())}
