"""The train-fit prior as a feature of the policy's view: each candidate list in the prior's order,
every row keeping its environment index; the mask's index enum in the same order; the view saved
with a checkpoint and read back by make_policy; no view = the environment's order (as before);
the structured demonstrator's attempts are the first untried row of a list as the view shows it."""
import json

import pytest

from ratchet.policy.embedded.chat import make_view, order_candidates, policy_view, prepare
from sandboxes.agents.prior import Prior, prior_order

pytestmark = pytest.mark.training

CANDS = ("candidates for solution.py:13:\n"
         "[0] replace `numbers` with `mean` at column 15 (variable): `mean = sum(mean) / len(numbers)`\n"
         "[1] replace `/` with `*` at column 24 (arithmetic): `mean = sum(numbers) * len(numbers)`\n"
         "[2] replace `numbers` with `x` at column 15 (variable): `mean = sum(x) / len(numbers)`\n"
         "[3] replace `1` with `2` at column 3 (constant): `x = 2`")
PRIOR = Prior.from_counts({"arithmetic_swap": 3, "variable_swap": 4, "constant_plus_one": 1}, ["t1", "t2"])


def test_lists_are_shown_in_the_prior_order_with_their_own_index():
    view = make_view(PRIOR, source="test")
    rows = policy_view(CANDS, view).splitlines()
    # arithmetic 3 > variable 4 shared by 2 rows (2 each, ties: env order) > constant 1
    assert rows == ["candidates for solution.py: 13:", "[ 1] arithmetic_swap `/` -> `*`",
                    "[ 0] variable_swap `numbers` -> `mean`", "[ 2] variable_swap `numbers` -> `x`",
                    "[ 3] constant_plus_one `1` -> `2`"]
    # no view, or a view without the prior: the environment's order, exactly as before
    assert [r[:4] for r in policy_view(CANDS).splitlines()[1:]] == ["[ 0]", "[ 1]", "[ 2]", "[ 3]"]
    assert policy_view(CANDS, {"candidates": "env"}) == policy_view(CANDS)
    cands = [(0, "a"), (1, "b")]
    assert order_candidates(cands, None) == cands
    assert view["fit"] == {"tasks": 2, "source": "test"} and json.loads(json.dumps(view)) == view


def test_training_and_inference_render_the_view_and_the_stored_text_is_untouched():
    from ratchet.policy.embedded.chat import render

    view = make_view(PRIOR, source="test")
    msgs = [{"role": "user", "content": "fix it"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function", "function": {
                "name": "propose_edits", "arguments": '{"path": "solution.py", "line": 13}'}}]},
            {"role": "tool", "tool_call_id": "c0", "name": "propose_edits", "content": CANDS}]
    (tool,) = [m for m in prepare(msgs, None, view=view) if m["role"] == "tool"]
    assert tool["content"] == policy_view(CANDS, view) and msgs[2]["content"] == CANDS
    assert policy_view(CANDS, view) in render(msgs, None, view=view)
    assert policy_view(CANDS) in render(msgs, None) and policy_view(CANDS, view) not in render(msgs, None)


def test_the_view_is_saved_with_a_checkpoint_and_resolved_by_make_policy(tmp_path, tiny_model, tokenizer):
    from ratchet.policy import make_policy
    from ratchet.policy.embedded.decoding import DECODING_FILE, read_decoding, write_decoding
    from ratchet.policy.grammar import Bounds

    view = make_view(PRIOR, source="test")
    for name, v in (("with", view), ("without", None)):
        tiny_model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        write_decoding(tmp_path / name, action_mask="structured", bounds=Bounds(thought_chars=0), view=v)
    assert read_decoding(tmp_path / "with")["view"] == view
    assert "view" not in read_decoding(tmp_path / "without")
    assert "view" not in json.loads((tmp_path / "without" / DECODING_FILE).read_text())   # the old file format
    assert make_policy("embedded:x", path=str(tmp_path / "with")).view == view
    assert make_policy("embedded:x", path=str(tmp_path / "without")).view is None


@pytest.fixture(scope="module")
def runs():
    from sandboxes.agents import fit_prior, run_agent
    from sandboxes.humaneval import build_suite

    suite = sorted(build_suite(seed=0, limit=8).tasks, key=lambda b: b.task_id)
    prior = fit_prior(suite[:20])
    return prior, [run_agent("structured", b, seed=0, prior=prior, max_turns=14) for b in suite[20:24]]


def test_demonstrations_take_the_first_listed_row_and_the_mask_lists_it_first(runs):
    """Every attempt of the structured agent (fit with the view's prior) is the first row of its
    line's list, as the view shows it, not tried yet; the mask's index enum starts with that row.
    Without the view the enum is in index order (as before)."""
    from ratchet.policy.action_mask import call_allowed, narrow, structured_tools
    from sandboxes.observations import parse_candidates
    from sandboxes.tools import TOOL_SCHEMAS

    prior, done = runs
    view, tools = make_view(prior, source="test"), structured_tools(TOOL_SCHEMAS)
    attempts = reordered = 0
    for run in done:
        msgs, tried, lists, undo_next = run.messages, set(), {}, False
        for i, m in enumerate(msgs):
            if m["role"] == "tool" and m["name"] == "propose_edits":
                lists.setdefault(last, parse_candidates(m["content"]))
            for c in m.get("tool_calls") or ():
                args = json.loads(c["function"]["arguments"])
                assert call_allowed(msgs[:i], tools, c["function"]["name"], args, view=view)
                last = (args.get("path"), args.get("line"))
                if c["function"]["name"] != "apply_edit":
                    continue
                if undo_next:               # the undo of a failed attempt (the inverse candidate)
                    undo_next = False
                    continue
                undo_next = True
                shown = [j for j, _ in order_candidates(lists[last], view) if (last, j) not in tried]
                assert args["index"] == shown[0], (run.task_id, args, shown)
                offered = {t["function"]["name"]: t["function"]["parameters"] for t in narrow(msgs[:i], tools, view=view)}
                p = offered["apply_edit"]
                branch = next(b for b in p.get("anyOf", [p]) if b["properties"]["line"]["enum"] == [last[1]])
                assert branch["properties"]["index"]["enum"][0] == args["index"]
                plain = {t["function"]["name"]: t["function"]["parameters"] for t in narrow(msgs[:i], tools)}
                q = plain["apply_edit"]
                b2 = next(b for b in q.get("anyOf", [q]) if b["properties"]["line"]["enum"] == [last[1]])
                assert b2["properties"]["index"]["enum"] == sorted(b2["properties"]["index"]["enum"])
                reordered += branch["properties"]["index"]["enum"] != b2["properties"]["index"]["enum"]
                tried.add((last, args["index"]))
                attempts += 1
    assert attempts >= 4 and reordered >= 1        # some attempt's enum differs from index order
    for cands in lists.values():
        assert prior_order(cands, prior) == order_candidates(cands, view)


def test_recipe_view_is_fit_on_train_data_only(runs):
    """The recipe's view: from a given train-split prior, or from the accepted trajectories
    themselves (the tenant's training_set rows), counting each solved task's passing edit once;
    a rejected row, or one whose edit never passed, counts nothing; no counts -> no view."""
    from ratchet.training.recipe import RecipeSettings, recipe_view, trajectory_prior

    prior, done = runs
    rows = [{"task_id": r.task_id, "accepted": bool(r.accepted), "messages": r.messages} for r in done]
    tp = trajectory_prior(rows)
    solved = sorted({r["task_id"] for r in rows if r["accepted"]})
    assert list(tp.task_ids) == solved and sum(tp.counts.values()) == len(solved) >= 1
    assert trajectory_prior([{**r, "accepted": False} for r in rows]).counts == {}
    assert trajectory_prior(rows + rows) == tp                                  # once per task
    assert recipe_view(RecipeSettings(), rows, prior)["prior"]["counts"] == prior.counts
    assert recipe_view(RecipeSettings(), rows)["prior"]["counts"] == tp.counts
    # no prior order: the view holds only the rank actions (the default), or nothing at all
    assert recipe_view(RecipeSettings(prior_view=False), rows, prior) == {"actions": "rank"}
    assert recipe_view(RecipeSettings(), [{**r, "accepted": False} for r in rows]) == {"actions": "rank"}
    assert recipe_view(RecipeSettings(prior_view=False, rank_actions=False), rows, prior) is None
    assert recipe_view(RecipeSettings(rank_actions=False), [{**r, "accepted": False} for r in rows]) is None


def test_a_view_that_hides_the_task_drops_the_issue_and_the_quoted_code_only():
    """hide_task (an experiment): the first user message becomes a fixed text, localize's and
    apply_edit's rows lose the code they quote; file, line, score, the candidate rows and every
    later message are as the prior view shows them; the stored messages are untouched; off by
    default (a view without it renders exactly as before)."""
    from ratchet.policy.embedded.chat import TASK_HIDDEN_TEXT, render
    from ratchet.training.recipe import RecipeSettings, recipe_view

    view, hidden = make_view(PRIOR, source="test"), make_view(PRIOR, source="test", hide_task=True)
    assert "task" not in view and hidden["task"] == "hidden"
    loc = "suspicious lines (ochiai; 2 failing test(s)):\n 1. solution.py:13  score=0.71  | mean = sum(numbers)"
    applied = "applied [1] to solution.py:13: mean = sum(numbers) * len(numbers)"
    msgs = [{"role": "user", "content": "Issue HE-004: `mean_absolute_deviation` is wrong"}]
    for i, (name, out) in enumerate((("localize", loc), ("propose_edits", CANDS), ("apply_edit", applied))):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                  "function": {"name": name, "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "name": name, "content": out}]
    msgs.append({"role": "user", "content": "a later note"})
    stored = json.dumps(msgs)
    shown = prepare(msgs, None, view=hidden)
    assert shown[0]["content"] == TASK_HIDDEN_TEXT and shown[-1]["content"] == "a later note"
    tools = [m["content"] for m in shown if m["role"] == "tool"]
    assert tools[0].splitlines()[1] == " 1. solution.py: 13 score=0.71"
    assert tools[1] == policy_view(CANDS, view)
    assert tools[2] == "applied [ 1] to solution.py: 13"
    text = render(msgs, None, view=hidden)
    assert "mean_absolute_deviation" not in text and "sum(numbers)" not in text and json.dumps(msgs) == stored
    plain = prepare(msgs, None, view=view)
    assert plain[0]["content"] == msgs[0]["content"] and "| mean = sum(numbers)" in plain[1 + 1]["content"]
    assert recipe_view(RecipeSettings(hide_task=True), [], PRIOR)["task"] == "hidden"
    assert "task" not in recipe_view(RecipeSettings(), [], PRIOR)
    # without the prior's order (or with a prior that counted nothing) it still hides the task
    for alone in (recipe_view(RecipeSettings(hide_task=True, prior_view=False, rank_actions=False), [], PRIOR),
                  recipe_view(RecipeSettings(hide_task=True, rank_actions=False), [], Prior.from_counts({}, []))):
        assert alone == {"task": "hidden"} and prepare(msgs, None, view=alone)[0]["content"] == TASK_HIDDEN_TEXT
        assert prepare(msgs, None, view=alone)[4]["content"] == policy_view(CANDS)     # the env's order


def test_prepare_memo_keeps_views_apart_and_ignores_later_mutation():
    """`prepare` memoises each message's view and canonical arguments (every turn re-renders the
    whole conversation); the memo must never hand one view's text to another, nor follow a caller
    that mutates its view dict afterwards."""
    from ratchet.policy.action_mask import structured_tools
    from sandboxes.tools import TOOL_SCHEMAS

    tools = structured_tools(TOOL_SCHEMAS)
    msgs = [{"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "propose_edits", "arguments": json.dumps({"line": 13, "path": "solution.py"})}}]},
            {"role": "tool", "content": CANDS}]
    view = make_view(PRIOR, source="test")
    with_view, without = prepare(msgs, tools, view=view), prepare(msgs, tools)
    assert with_view[2]["content"] == policy_view(CANDS, view) != without[2]["content"] == policy_view(CANDS)
    # canonical arguments: the schema's property order, as the grammar emits them
    assert json.loads(with_view[1]["tool_calls"][0]["function"]["arguments"]) == {"path": "solution.py", "line": 13}
    assert list(json.loads(with_view[1]["tool_calls"][0]["function"]["arguments"])) == \
        list(next(t["function"] for t in tools if t["function"]["name"] == "propose_edits")["parameters"]["properties"])
    view["candidates"] = "env"                       # the caller's dict changes: a new key, not stale text
    assert prepare(msgs, tools, view=view)[2]["content"] == policy_view(CANDS)
    assert prepare(msgs, tools, view=make_view(PRIOR, source="test"))[2]["content"] == with_view[2]["content"]
