"""Rank-relative actions (`make_view(..., rank=True)`): the policy names the k-th line localize
listed and the k-th row of a list as its view shows it; logged calls keep the environment's
numbers. Checked on the structured demonstrator's real episodes and on a real embedded episode."""
import json

import pytest

from ratchet.policy.action_mask import call_allowed, narrow, structured_tools
from ratchet.policy.embedded.chat import make_view, policy_view, prepare
from ratchet.policy.rank_actions import Ranks, rank_actions
from sandboxes.observations import parse_candidates
from sandboxes.tools import TOOL_SCHEMAS

pytestmark = pytest.mark.training

TOOLS = structured_tools(TOOL_SCHEMAS)


@pytest.fixture(scope="module")
def demos():
    from sandboxes.agents import fit_prior, run_agent
    from sandboxes.humaneval import build_suite

    suite = sorted(build_suite(seed=0, limit=8).tasks, key=lambda b: b.task_id)
    prior = fit_prior(suite[:20])
    runs = [run_agent("structured", b, seed=0, prior=prior, max_turns=14) for b in suite[20:26]]
    return make_view(prior, source="test", rank=True), runs


def _calls(msgs):
    for i, m in enumerate(msgs):
        for c in m.get("tool_calls") or ():
            yield i, c["function"]["name"], json.loads(c["function"]["arguments"])


def test_every_demonstrated_call_round_trips_and_lies_inside_the_ranked_mask(demos):
    """env -> rank -> env is the identity on every numbered call of the demonstrations; each call,
    in ranks, is one the ranked mask offers; each attempt (not an undo) is the first untried row of
    its line as the view lists it: rank 1 on a fresh list. And the ranked mask offers ranks only."""
    view, runs = demos
    numbered = firsts = 0
    for run in runs:
        tried: dict = {}
        undo_next = False
        for i, name, args in _calls(run.messages):
            assert call_allowed(run.messages[:i], TOOLS, name, args, view=view), (run.task_id, name, args)
            ranks = Ranks.of(run.messages[:i], view)
            r = ranks.to_rank(name, args)
            assert r is not None and ranks.to_env(name, r) == args
            if name not in ("propose_edits", "apply_edit"):
                continue
            numbered += 1
            assert 1 <= r["line"] <= len(ranks.lines)
            offered = {t["function"]["name"]: t["function"]["parameters"]
                       for t in narrow(run.messages[:i], TOOLS, view=view)}
            for b in offered[name].get("anyOf", [offered[name]]):
                assert all(1 <= k <= len(ranks.lines) for k in b["properties"]["line"]["enum"])
            if name == "apply_edit":
                if undo_next:
                    undo_next = False
                    continue
                undo_next = True
                key = (args["path"], args["line"])
                untried = [k for k in range(1, len(ranks.rows[key]) + 1) if k not in tried.get(key, set())]
                assert r["index"] == untried[0]
                firsts += r["index"] == 1
                tried.setdefault(key, set()).add(r["index"])
    assert numbered > 15 and firsts >= len(runs)


def test_after_an_undo_ranks_name_the_rows_of_the_list_the_attempt_came_from(demos):
    """A failed attempt is undone through a list read on the edited line; once the file is clean
    again, ranks refer to the clean file's list again (as the mask's lists do): the demonstrator's
    next attempt on the same line is its next row, rank 2, and maps back to that list's index."""
    from ratchet.policy.embedded.chat import order_candidates

    view, runs = demos
    seconds = 0
    for run in runs:
        first, undo_next, clean_list, n = None, False, {}, 0
        for i, name, args in _calls(run.messages):
            if name == "propose_edits" and first is None:
                obs = next(m for m in run.messages[i:] if m["role"] == "tool")["content"]
                clean_list.setdefault((args["path"], args["line"]), [j for j, _ in order_candidates(parse_candidates(obs), view)])
            if name != "apply_edit":
                continue
            if undo_next:
                undo_next = False
                continue
            undo_next, n = True, n + 1
            key = (args["path"], args["line"])
            r = Ranks.of(run.messages[:i], view).to_rank(name, args)
            if key in clean_list:
                assert r["index"] == clean_list[key].index(args["index"]) + 1
            if n == 2 and first == key:
                seconds += 1
                assert r["index"] == 2, (run.task_id, args, r)
            first = key if first is None else first
    assert seconds >= 1


def test_prepare_shows_ranks_and_the_stored_trajectory_keeps_the_environments_numbers(demos):
    view, runs = demos
    run = next(r for r in runs if any(n == "apply_edit" and a["index"] != 0 for _, n, a in _calls(r.messages)))
    before = json.dumps(run.messages)
    shown = prepare(run.messages, TOOLS, view=view)
    assert json.dumps(run.messages) == before                  # the log is not touched
    env_calls = [(n, a) for _, n, a in _calls(run.messages)]
    ranked = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
              for m in shown if m["role"] == "assistant" for c in m["tool_calls"]]
    assert [n for n, _ in ranked] == [n for n, _ in env_calls]
    assert all(m.get("train", True) for m in shown if m["role"] == "assistant")
    applies = [(a, b) for (n, a), (_, b) in zip(env_calls, ranked) if n == "apply_edit"]
    assert applies and applies[0][1]["index"] == 1 and any(a["index"] != b["index"] for a, b in applies)
    # candidate rows are labelled 1..n, and a list's head names the line by its rank on localize
    tool_texts = [m["content"] for m in shown if m["role"] == "tool"]
    lists = [t for t in tool_texts if t.startswith("candidates for")]
    assert lists and all(t.splitlines()[1].startswith("[ 1] ") for t in lists if len(t.splitlines()) > 1)
    assert all(t.startswith("candidates for 1. ") or t.split(" ", 2)[2][0].isdigit() for t in lists)
    assert any(t.startswith("applied to ") for t in tool_texts)
    # the same messages without ranks: the environment's numbers, rows labelled by index
    plain = prepare(run.messages, TOOLS, view={k: v for k, v in view.items() if k != "actions"})
    assert [json.loads(c["function"]["arguments"]) for m in plain if m["role"] == "assistant"
            for c in m["tool_calls"]] == [a for _, a in env_calls]


def test_a_call_naming_nothing_listed_does_not_train(demos):
    view, runs = demos
    msgs = json.loads(json.dumps(runs[0].messages))
    i, _, args = next(x for x in _calls(msgs) if x[1] == "propose_edits")
    msgs[i]["tool_calls"][0]["function"]["arguments"] = json.dumps({**args, "line": 999})
    shown = prepare(msgs, TOOLS, view=view)
    assert all(m.get("train", True) for m in shown[:i])
    assert shown[i].get("train") is False
    assert json.loads(shown[i]["tool_calls"][0]["function"]["arguments"])["line"] == 999


def _call(i, name, args):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _answer(i, name, text):
    return {"role": "tool", "tool_call_id": f"c{i}", "name": name, "content": text}


def test_after_an_undo_a_rank_names_the_clean_files_row_not_the_undo_lists():
    """The list read on the edited line (to find the undo) orders its rows otherwise; once the undo
    makes the file clean, rank 2 is again the clean list's second row (what the mask offers)."""
    from sandboxes.agents.prior import Prior
    from sandboxes.observations import format_applied, format_candidates, format_localize

    view = make_view(Prior.from_counts({"comparison_swap": 5, "variable_swap": 1}, ["t"]), source="t", rank=True)
    p = {"path": "solution.py", "line": 5}
    clean = ["replace `a` with `b` at column 8 (variable): `return b < b`",
             "replace `<` with `<=` at column 10 (comparison): `return a <= b`",
             "replace `b` with `a` at column 12 (variable): `return a < a`"]
    edited = ["replace `<=` with `<` at column 10 (comparison): `return a < b`",   # the undo, in env order first
              "replace `a` with `b` at column 8 (variable): `return b <= b`",
              "replace `b` with `a` at column 13 (variable): `return a <= a`"]
    msgs = [{"role": "user", "content": "fix"},
            _call(0, "localize", {"top": 10}),
            _answer(0, "localize", format_localize("ochiai", 1, [("solution.py", 5, 0.577, "return a < b")])),
            _call(1, "propose_edits", p),
            _answer(1, "propose_edits", format_candidates("solution.py", 5, list(enumerate(clean)))),
            _call(2, "apply_edit", {**p, "index": 1}),
            _answer(2, "apply_edit", format_applied(1, "solution.py", 5, "return a <= b")),
            _call(3, "run_tests", {}),
            _answer(3, "run_tests", "1 failed, 2 passed\nFAILED tests/test_x.py::test_a"),
            _call(4, "propose_edits", p),
            _answer(4, "propose_edits", format_candidates("solution.py", 5, list(enumerate(edited)))),
            _call(5, "apply_edit", {**p, "index": 0}),
            _answer(5, "apply_edit", format_applied(0, "solution.py", 5, "return a < b"))]
    r = Ranks.of(msgs, view)
    # the clean list in the prior's order: [1] comparison, [0] variable, [2] variable
    assert r.rows[("solution.py", 5)] == (1, 0, 2)
    assert r.to_env("apply_edit", {**p, "line": 1, "index": 2}) == {**p, "index": 0}
    assert r.to_rank("apply_edit", {**p, "index": 2}) == {**p, "line": 1, "index": 3}
    # while the file was edited, the undo list ruled (env order here: its comparison row is [0])
    mid = Ranks.of(msgs[:-2], view)
    assert mid.rows[("solution.py", 5)] == (0, 1, 2) and mid.to_rank("apply_edit", {**p, "index": 0})["index"] == 1
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in narrow(msgs, TOOLS, view=view)}
    # the mask offers the clean list's untried rows 2 and 3 (row 1, index 1, was tried)
    assert offered["apply_edit"]["properties"]["index"]["enum"] == [2, 3]


def test_ranks_label_observations_only_in_the_rank_view():
    cands = "candidates for solution.py:13:\n[4] replace `a` with `b` at column 3 (variable): `b`\n" \
            "[7] replace `+` with `-` at column 5 (arithmetic): `a - 1`"
    lines = (("solution.py", 9), ("solution.py", 13))
    ranked = policy_view(cands, {"actions": "rank"}, lines).splitlines()
    assert ranked == ["candidates for 2. solution.py: 13:", "[ 1] variable_swap `a` -> `b`",
                      "[ 2] arithmetic_swap `+` -> `-`"]
    assert policy_view(cands, None, lines).splitlines()[0] == "candidates for solution.py: 13:"
    assert policy_view("applied [7] to solution.py:13: `a - 1`", {"actions": "rank"}, lines) == \
        "applied to 2. solution.py: 13: `a - 1`"
    assert rank_actions(make_view(None, rank=True)) and not rank_actions(make_view(None))
    # localize rows: the SBFL tier (equal scores share one) instead of the score, with ranks only
    loc = ("suspicious lines (ochiai; 1 failing test(s)):\n 1. solution.py:13  score=0.577  | a + 1\n"
           " 2. solution.py:9  score=0.577  | b\n 3. solution.py:4  score=0.408  | c")
    assert policy_view(loc, {"actions": "rank"}).splitlines()[1:] == [
        " 1. solution.py: 13 tier 1 | a + 1", " 2. solution.py: 9 tier 1 | b", " 3. solution.py: 4 tier 2 | c"]
    assert "score=0.577" in policy_view(loc) and "tier" not in policy_view(loc)
    ranks = Ranks()
    ranks.observe("propose_edits", {"path": "solution.py", "line": 13}, cands)
    ranks.lines = lines
    assert ranks.to_env("apply_edit", {"path": "solution.py", "line": 2, "index": 2}) == \
        {"path": "solution.py", "line": 13, "index": 7}
    for bad in ({"path": "solution.py", "line": 3, "index": 1}, {"path": "x.py", "line": 2, "index": 1},
                {"path": "solution.py", "line": 2, "index": 3}, {"path": "solution.py", "line": True, "index": 1}):
        assert ranks.to_env("apply_edit", bad) is None
    assert [i for i, _ in parse_candidates(cands)] == [4, 7]         # the env's own text is unchanged


def test_a_generated_rank_that_names_nothing_is_never_sent_as_a_number():
    """Without the mask a model could write a rank past the list; the environment would read it as
    a real line (line 3 exists in most files): it is sent wrapped, and the environment refuses it."""
    from ratchet.policy.base import ToolCall
    from ratchet.policy.rank_actions import env_calls
    from sandboxes.observations import format_candidates, format_localize
    from sandboxes.tools import ToolError, check_arguments

    view = make_view(None, rank=True)
    msgs = [{"role": "user", "content": "fix"}, _call(0, "localize", {"top": 10}),
            _answer(0, "localize", format_localize("ochiai", 1, [("solution.py", 9, 0.5, "x = 1")])),
            _call(1, "propose_edits", {"path": "solution.py", "line": 9}),
            _answer(1, "propose_edits", format_candidates("solution.py", 9, [(0, "replace `1` with `2` at column 5 "
                                                                              "(constant): `x = 2`")]))]
    good, past_lines, past_rows = env_calls([
        ToolCall.from_raw("apply_edit", {"path": "solution.py", "line": 1, "index": 1}),
        ToolCall.from_raw("propose_edits", {"path": "solution.py", "line": 3}),
        ToolCall.from_raw("apply_edit", {"path": "solution.py", "line": 1, "index": 2})], msgs, view)
    assert good.arguments == {"path": "solution.py", "line": 9, "index": 0}
    for c in (past_lines, past_rows):
        assert list(c.arguments) == ["unlisted_rank"]
        with pytest.raises(ToolError):
            check_arguments(c.name, c.arguments)


def test_a_random_policy_in_ranks_drives_the_real_environment(tokenizer, tiny_model, runtime):
    """A random embedded model under the ranked mask, through the episode runner and a real
    sandbox: the environment gets its own numbers (no numbered call answered with an error), the
    trajectory logs them, and each turn's prompt extends the last (RL trains on the sampled ranks)."""
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from ratchet.policy.grammar import Bounds
    from ratchet.policy.runner import Sampling, run_episodes, training_sequence
    from sandboxes.humaneval import build_suite

    view = make_view(None, rank=True)
    pol = TransformersPolicy(tiny_model, tokenizer, constrained=True, chat="embedded", action_mask="structured",
                             grammar={"bounds": Bounds(thought_chars=0)}, view=view, prefix_cache=0)
    bundles = sorted(build_suite(seed=0, limit=2).tasks, key=lambda b: b.task_id)[:2]
    recs = run_episodes(pol, [(b, s) for b in bundles for s in (0, 1)], runtime=runtime, max_turns=8,
                        sampling=Sampling(temperature=1.0, max_tokens=96), concurrency=4)
    from ratchet.policy.embedded.chat import parse_turn

    numbered = translated = 0
    for rec in recs:
        assert rec.outcome != "infra_failure", rec.error
        turns = iter(rec.turn_records)
        for i, m in enumerate(rec.messages):
            if m["role"] != "assistant":
                continue
            sampled = parse_turn(tokenizer.decode(next(turns).completion_ids))["tool_calls"]
            for c, s in zip(m.get("tool_calls") or (), sampled):
                name, logged = c["function"]["name"], json.loads(c["function"]["arguments"])
                if name not in ("propose_edits", "apply_edit"):
                    continue
                numbered += 1
                ranks = Ranks.of(rec.messages[:i], view)
                said = json.loads(s["function"]["arguments"])      # what the model wrote: ranks
                assert ranks.to_env(name, said) == logged and (logged["path"], logged["line"]) in ranks.lines
                translated += said != logged
                answer = next(x for x in rec.messages[i:] if x.get("tool_call_id") == c["id"])
                assert not answer["content"].startswith("error:"), (logged, answer["content"])
        assert training_sequence(rec) is not None
    assert numbered >= 4 and translated >= 1


def test_tier_progress_note_says_what_the_demonstrator_does_next(demos):
    """The view's tier-progress note (`make_view(..., progress=True)`) on the
    demonstrator's real episodes: before each of its proposals (not an undo's) the last note reads
    `next to list: k.` with k the rank it proposes; before each first attempt it reads `tier t
    listed.` unless the demonstrator stopped listing for want of turns. Without the setting the
    rendering is unchanged: no note."""
    import re

    view, runs = demos
    pview = {**view, "progress": "tier"}
    proposals = attempts = 0
    for run in runs:
        started = False
        prev = None
        for i, name, args in _calls(run.messages):
            plain = prepare(run.messages[:i], TOOLS, view=view)
            noted = prepare(run.messages[:i], TOOLS, view=pview)
            tools_said = [m["content"] for m in noted if m["role"] == "tool"]
            assert [m["content"] for m in plain if m["role"] == "tool"] == [
                re.sub(r"\n(next to list: \d+\.|tier \d+ listed\.)$", "", t) for t in tools_said]
            note = next((t.rsplit("\n", 1)[-1] for t in reversed(tools_said)
                         if re.search(r"(next to list: \d+\.|tier \d+ listed\.)$", t)), None)
            if name == "propose_edits" and prev != "run_tests":
                r = Ranks.of(run.messages[:i], view).to_rank(name, args)
                assert note == f"next to list: {r['line']}.", (run.task_id, i, note, r)
                proposals += 1
            if name == "apply_edit" and not started:
                started = True
                if not re.fullmatch(r"tier \d+ listed\.", note):
                    # it stops listing with 5 turns left: room for one attempt, its undo and submit
                    assert run.messages and sum(1 for m in run.messages[:i] if m["role"] == "assistant") >= 14 - 6
                attempts += 1
            prev = name
    assert proposals > len(runs) and attempts >= len(runs) - 1
    # the note needs ranks: a view of environment numbers never carries it
    assert "progress" not in make_view(None, progress=True) and make_view(None, rank=True, progress=True)["progress"] == "tier"


def test_pick_note_names_the_demonstrators_next_attempt(demos):
    """The view's pick note (`make_view(..., pick=True)`) on the demonstrator's real
    episodes: before each attempt it makes once its tier is listed (an apply_edit on the clean
    file), the last pick note names that very call in ranks; before an undo (the file is edited)
    the last tool message carries no note. Without the setting the rendering is unchanged."""
    import re

    view, runs = demos
    nview = {**view, "progress": "tier", "pick": "prior"}
    note_re = re.compile(r"\nbest untried: line (\d+), index (\d+)\.$")
    attempts = undos = 0
    for run in runs:
        for i, name, args in _calls(run.messages):
            plain = prepare(run.messages[:i], TOOLS, view={**view, "progress": "tier"})
            noted = prepare(run.messages[:i], TOOLS, view=nview)
            said = [m["content"] for m in noted if m["role"] == "tool"]
            assert [m["content"] for m in plain if m["role"] == "tool"] == [note_re.sub("", t) for t in said]
            ranks = Ranks.of(run.messages[:i], view)
            if name != "apply_edit":
                continue
            if ranks.clean:
                m = next(m for t in reversed(said) if (m := note_re.search(t)))
                r = ranks.to_rank(name, args)
                assert (int(m.group(1)), int(m.group(2))) == (r["line"], r["index"]), (run.task_id, i, m.group(0), r)
                attempts += 1
            else:
                assert not note_re.search(said[-1])
                undos += 1
    assert attempts >= len(runs) and undos >= 1
    # the note needs ranks and a prior
    from sandboxes.agents.prior import Prior

    assert "pick" not in make_view(None, rank=True, pick=True)
    assert "pick" not in make_view(Prior.from_counts({"comparison_swap": 1}), pick=True)
    assert make_view(Prior.from_counts({"comparison_swap": 1}), rank=True, pick=True)["pick"] == "prior"


def test_rank_zero_follows_the_notes_on_the_demonstrators_episodes(demos):
    """`make_view(..., follow=True)`: rank 0 names what the notes name. On the
    demonstrator's real episodes every call round-trips (env -> ranks -> env), lies inside the
    ranked mask, and each of its proposals (not an undo's) and attempts renders as rank 0, since it
    does exactly what the notes say; the mask still offers the explicit ranks beside it, and rank 0
    is never offered on an edited file (the undo)."""
    from sandboxes.agents.prior import Prior

    view, runs = demos
    fview = {**view, "progress": "tier", "pick": "prior", "follow": "notes"}
    zero = {"propose_edits": 0, "apply_edit": 0}
    undos = 0
    for run in runs:
        for i, name, args in _calls(run.messages):
            msgs = run.messages[:i]
            assert call_allowed(msgs, TOOLS, name, args, view=fview), (run.task_id, i, name, args)
            ranks = Ranks.of(msgs, fview)
            r = ranks.to_rank(name, args)
            assert r is not None and ranks.to_env(name, r) == args
            if name not in zero:
                continue
            offered = {t["function"]["name"]: t["function"]["parameters"] for t in narrow(msgs, TOOLS, view=fview)}
            lines = [k for b in offered[name].get("anyOf", [offered[name]]) for k in b["properties"]["line"]["enum"]]
            if ranks.clean:
                assert r["line"] == 0 and r.get("index", 0) == 0, (run.task_id, i, name, r)
                assert lines[0] == 0 and any(k >= 1 for k in lines)
                zero[name] += 1
            else:
                assert 0 not in lines and r["line"] >= 1
                undos += 1
    assert zero["propose_edits"] > len(runs) and zero["apply_edit"] >= len(runs) and undos >= 2
    # rank 0 where the notes name nothing is never sent as a number
    ranks = Ranks.of(runs[0].messages[:1], fview)
    assert ranks.to_env("apply_edit", {"path": "solution.py", "line": 0, "index": 0}) is None
    # it needs both notes
    p = Prior.from_counts({"comparison_swap": 1})
    assert "follow" not in make_view(p, rank=True, pick=True, follow=True)
    assert make_view(p, rank=True, progress=True, pick=True, follow=True)["follow"] == "notes"
