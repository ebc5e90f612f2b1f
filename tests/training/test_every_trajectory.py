"""Every accepted trajectory trains: the logs real agents write (bash, file editors) in every
supported source format are rendered with the environment's whole tool vocabulary, their loss
covers exactly the policy's turns, and a trajectory longer than the context is cut between turns."""
import json

import pytest

from ratchet.training.examples import to_training_example, training_windows


def _native(fmt_rec):
    from ratchet import adapters

    fmt = adapters.detect(fmt_rec)
    return fmt, adapters.to_native(fmt, fmt_rec, None)["messages"]


def _editor_chat() -> list[dict]:
    call = lambda i, name, args: {"id": f"c{i}", "type": "function",                 # noqa: E731
                                  "function": {"name": name, "arguments": json.dumps(args)}}
    return [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "count_pos counts zeros."},
        {"role": "assistant", "content": "Look first.", "tool_calls": [call(0, "bash", {"command": "cat solution.py"})]},
        {"role": "tool", "tool_call_id": "c0", "content": "def count_pos(xs):\n    return sum(x >= 0 for x in xs)"},
        {"role": "assistant", "content": None, "tool_calls": [call(1, "str_replace_editor", {
            "command": "str_replace", "path": "solution.py", "old_str": "x >= 0", "new_str": "x > 0"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "edited solution.py"},
        {"role": "assistant", "content": None, "tool_calls": [call(2, "browser", {"url": "https://example.com"})]},
        {"role": "tool", "tool_call_id": "c2", "content": "error: unknown tool"},
        {"role": "assistant", "content": None, "tool_calls": [call(3, "submit", {"explanation": "x >= 0 counted 0"})]},
    ]


def test_rows_of_every_source_format_train_with_the_environments_tools():
    from ratchet import samples
    from ratchet.policy.action_mask import structured_tools
    from ratchet.training.recipe import coverage, coverage_summary
    from sandboxes.tools import TOOL_SCHEMAS

    rows = []
    for rec in (samples.mini_swe_agent_traj(), samples.swe_agent_traj(True), samples.swe_agent_traj(False),
                samples.atif_traj()):
        fmt, msgs = _native(rec)
        rows.append({"record_id": f"r{len(rows)}", "source_format": fmt, "messages": msgs})
    rows.append({"record_id": "editor", "source_format": "openai_chat", "messages": _editor_chat()})
    rows.append({"record_id": "lost", "source_format": "openai_chat", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "browser", "arguments": "{}"}}]}]})
    got = {e["record_id"]: e for e in coverage(rows, TOOL_SCHEMAS)}
    assert [got[f"r{i}"]["trains"] for i in range(4)] == [True] * 4
    assert got["editor"]["trains"] and (got["editor"]["turns"], got["editor"]["trainable_turns"]) == (4, 3)
    assert got["lost"] == {**got["lost"], "trains": False, "reason": "calls tools outside the environment's: browser"}
    summary = coverage_summary(got.values())
    assert summary["mini_swe_agent"] == {"trains": 1, "not": 0, "reasons": {}}
    assert summary["swe_agent"]["trains"] == 2 and summary["atif"]["trains"] == 1
    # under the five structured tools only, the bash and editor turns teach nothing
    strict = {e["record_id"]: e for e in coverage(rows, structured_tools(TOOL_SCHEMAS))}
    for r in ("r0", "r1", "editor"):
        assert strict[r]["trainable_turns"] < got[r]["trainable_turns"], r


def test_the_loss_covers_exactly_the_policys_valid_turns(tokenizer):
    """Checked by hand: the tokens with loss decode to the bash turn (its thought too), the editor
    turn and the submit turn, each ending at its stop token; the unknown tool's turn, the prompt and
    the tool output carry none."""
    from sandboxes.tools import TOOL_SCHEMAS

    ex = to_training_example(_editor_chat(), TOOL_SCHEMAS, tokenizer)
    runs, cur = [], []
    for t, m in zip(ex["input_ids"], ex["assistant_masks"]):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tokenizer.decode(cur))
            cur = []
    if cur:
        runs.append(tokenizer.decode(cur))
    assert runs == [
        'Look first.\n<tool_call>{"name": "bash", "arguments": {"command": "cat solution.py"}}</tool_call><|im_end|>',
        '<tool_call>{"name": "str_replace_editor", "arguments": {"command": "str_replace", "path": "solution.py", '
        '"old_str": "x >= 0", "new_str": "x > 0"}}</tool_call><|im_end|>',
        '<tool_call>{"name": "submit", "arguments": {"explanation": "x >= 0 counted 0"}}</tool_call><|im_end|>']


def test_a_long_trajectory_becomes_windows_of_whole_turns(tokenizer):
    from sandboxes.tools import TOOL_SCHEMAS

    msgs = _editor_chat()[:2]
    for i in range(12):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"b{i}", "type": "function", "function": {
                     "name": "bash", "arguments": json.dumps({"command": f"echo step {i}"})}}]},
                 {"role": "tool", "tool_call_id": f"b{i}", "content": f"step {i}\n" * 20}]
    full = to_training_example(msgs, TOOL_SCHEMAS, tokenizer)
    limit = len(full["input_ids"]) // 3
    wins = training_windows(msgs, TOOL_SCHEMAS, tokenizer, max_length=limit)
    assert len(wins) >= 3 and all(len(w["input_ids"]) <= limit for w in wins)
    prompt = to_training_example(msgs[:2], TOOL_SCHEMAS, tokenizer)["input_ids"]
    trained = []
    for w in wins:
        assert w["input_ids"][:len(prompt)] == prompt                       # each window keeps the prompt
        text = tokenizer.decode([t for t, m in zip(w["input_ids"], w["assistant_masks"]) if m])
        trained += [int(s.split('"')[0]) for s in text.split("echo step ")[1:]]
        assert text.count("<tool_call>") == text.count("</tool_call><|im_end|>")   # no call cut in two
    assert trained == list(range(12))                                      # every turn once, in order
    assert training_windows(msgs, TOOL_SCHEMAS, tokenizer, max_length=len(full["input_ids"])) == [full]
    assert training_windows(msgs, TOOL_SCHEMAS, tokenizer, max_length=len(prompt) + 3) == []   # no turn fits


def test_sft_on_every_row_decodes_without_the_structured_mask(tmp_path, tiny_model, tokenizer, trajectories):
    from ratchet.policy import make_policy
    from ratchet.training.recipe import RecipeSettings, sft_stage

    base = tmp_path / "base"
    tiny_model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    rows = [{"record_id": t["trajectory_id"], "task_id": t["task_id"], "messages": t["messages"],
             "source_format": "openai_chat"} for t in trajectories if t["accepted"]]
    rows.append({"record_id": "editor", "task_id": None, "messages": _editor_chat(), "source_format": "openai_chat"})
    res = sft_stage(base, rows, tmp_path / "sft", RecipeSettings(sft_max_steps=1, sft_batch=2, sft_data="all"))
    assert "editor" in res.manifest["record_ids"] and len(res.manifest["record_ids"]) == len(rows)
    assert {"bash", "str_replace_editor", "localize"} <= set(res.offered)
    pol = make_policy("embedded:cand", path=str(res.checkpoint))
    assert pol.action_mask is None
    with pytest.raises(ValueError, match="sft_data"):
        RecipeSettings(sft_data="some")
