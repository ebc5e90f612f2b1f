"""The policy-side action mask: every narrowed call is a valid call of the environment's schema,
and a random model under the narrowed grammar picks only observed files, listed lines and
listed candidate indices."""
import itertools
import json

import pytest

from ratchet.policy.action_mask import STRUCTURED, episode_state, narrow, structured_tools

pytestmark = pytest.mark.training


def _instances(tool: dict) -> list[dict]:
    """Every argument dict the narrowed schema allows (they are all finite)."""
    params = tool["function"]["parameters"]
    if "anyOf" in params:
        return [x for branch in params["anyOf"] for x in _instances({"function": {"name": "", "parameters": branch}})]
    props = params["properties"]
    choices = []
    for k, spec in props.items():
        if "enum" in spec:
            choices.append([(k, v) for v in spec["enum"]])
        else:
            assert spec["type"] == "integer", (tool["function"]["name"], k, spec)
            choices.append([(k, v) for v in range(spec["minimum"], spec["maximum"] + 1)])
    return [dict(c) for c in itertools.product(*choices)]


def _prefixes(trajectories):
    for t in trajectories:
        msgs = t["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                yield msgs[:i]


def test_every_narrowed_call_is_valid_for_the_environment(trajectories, tools):
    from sandboxes.tools import check_arguments

    seen_tools, n = set(), 0
    for prefix in _prefixes(trajectories):
        offered = narrow(prefix, tools)
        for t in offered:
            name = t["function"]["name"]
            seen_tools.add(name)
            for args in _instances(t):
                assert check_arguments(name, args) == args
                n += 1
    assert seen_tools == set(STRUCTURED) and n > 100


def test_narrowing_follows_the_observations(trajectories, tools):
    """After the expert's localize, propose_edits offers exactly its lines; after a
    propose_edits, apply_edit offers exactly that line's candidate indices."""
    from sandboxes.observations import parse_candidates, parse_localize

    t = next(t for t in trajectories if t["agent_id"].startswith("expert"))
    msgs = t["messages"]
    loc = next(i for i, m in enumerate(msgs) if m.get("name") == "localize" and m["role"] == "tool")
    prop = next(i for i, m in enumerate(msgs) if m.get("name") == "propose_edits" and m["role"] == "tool")
    before = {x["function"]["name"] for x in narrow(msgs[:loc], tools)}
    assert before == {"localize"}                                  # nothing is known yet
    after = {x["function"]["name"]: x["function"]["parameters"]["properties"] for x in narrow(msgs[:loc + 1], tools)}
    ranked = [ln for _, ln, _ in parse_localize(msgs[loc]["content"])]
    assert after["propose_edits"]["line"]["enum"] == list(dict.fromkeys(ranked))    # in SBFL rank order
    assert "apply_edit" not in after and "localize" not in after and "submit" not in after
    offered = {x["function"]["name"]: x for x in narrow(msgs[:prop + 1], tools)}
    idx = offered["apply_edit"]["function"]["parameters"]["properties"]["index"]
    assert idx["enum"] == list(range(len(parse_candidates(msgs[prop]["content"]))))
    st = episode_state(msgs[:prop + 1])
    assert list(st["valid"].values()) == [len(idx["enum"])] and st["clean"] and st["tested"]
    app = next(i for i, m in enumerate(msgs) if m.get("name") == "apply_edit" and m["role"] == "tool")
    offered = {x["function"]["name"] for x in narrow(msgs[:app + 1], tools)}
    assert offered == {"run_tests"}                # an attempt is tested before anything else


def test_random_model_under_the_mask_stays_inside_it(trajectories, tools, tokenizer, tiny_model):
    """A random model decoded by the engine with action_mask='structured' emits, at each state of
    an expert episode, only calls the narrowed schemas allow."""
    from ratchet.policy.base import GenerationRequest
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from ratchet.policy.grammar import Bounds, arguments_valid

    pol = TransformersPolicy(tiny_model, tokenizer, constrained=True, chat="embedded", action_mask="structured",
                             grammar={"bounds": Bounds(thought_chars=0, max_string=32)}, prefix_cache=0)
    t = next(t for t in trajectories if t["agent_id"].startswith("expert"))
    prefixes = [p for p in _prefixes([t]) if p[-1]["role"] == "tool"][2:5]
    reqs = [GenerationRequest(p, tools, n=6, temperature=2.0, seed=k, max_tokens=200) for k, p in enumerate(prefixes)]
    names = set()
    for p, outs in zip(prefixes, pol.generate(reqs)):
        allowed = {x["function"]["name"]: x["function"]["parameters"] for x in narrow(p, tools)}
        for c in outs:
            assert c.finish_reason == "stop" and len(c.tool_calls) == 1, c
            call = c.tool_calls[0]
            assert call.name in allowed and arguments_valid(allowed[call.name], call.arguments), call
            assert len(c.forced) == len(c.token_ids) and c.forced[-1]      # the stop token is forced
            if len(allowed) > 1:
                assert not all(c.forced)                                  # the tool name was a choice
            names.add(call.name)
    assert len(names) >= 2
    # the prompt lists the structured tools only
    listed = tokenizer.decode(pol.prompt_ids(GenerationRequest(prefixes[0], structured_tools(tools))))
    assert "apply_edit(" in listed and "read_file(" not in listed and "edit(" not in listed.replace("apply_edit(", "")
    assert json.dumps(allowed)                  # the schemas are plain JSON


def test_the_structured_agents_calls_lie_inside_the_mask(tools):
    """The demonstrations SFT imitates never step outside what the policy may emit: every call of
    the structured agent (including undo by the inverse candidate) is allowed by that turn's mask."""
    from ratchet.policy.action_mask import call_allowed
    from sandboxes.agents import fit_prior, run_agent
    from sandboxes.humaneval import build_suite

    suite = sorted(build_suite(seed=0, limit=8).tasks, key=lambda b: b.task_id)
    prior = fit_prior(suite[:20])
    checked, undone = 0, 0
    for b in suite[20:26]:
        run = run_agent("structured", b, seed=0, prior=prior, max_turns=14)
        msgs = run.messages
        names = []
        for i, m in enumerate(msgs):
            for c in m.get("tool_calls") or ():
                assert call_allowed(msgs[:i], tools, c["function"]["name"], json.loads(c["function"]["arguments"])), \
                    (b.task_id, i, c["function"])
                names.append(c["function"]["name"])
                checked += 1
        undone += names.count("apply_edit") > 1
    assert checked > 30 and undone >= 1


def _structured_runs(n_tasks: int, k: int = 4):
    from sandboxes.agents import fit_prior, run_agent
    from sandboxes.humaneval import build_suite

    suite = sorted(build_suite(seed=0, limit=8).tasks, key=lambda b: b.task_id)
    prior = fit_prior(suite[:20])
    return [run_agent("structured", b, seed=0, prior=prior, max_turns=14, k=k) for b in suite[20:20 + n_tasks]]


def _offered(msgs, tools) -> dict:
    return {x["function"]["name"]: x["function"]["parameters"] for x in narrow(msgs, tools)}


def test_attempt_structure_undoes_a_failed_attempt_and_submits_a_passing_one(tools):
    """After an attempt's tests fail the mask offers only the undo (propose_edits on that line,
    then apply_edit of the candidate that restores it, found from the observations); after the
    tests pass, only submit; a failed candidate is never offered again on the clean file."""
    from sandboxes.agents.prior import localized_code
    from sandboxes.observations import parse_applied, parse_candidates, tests_all_passed

    failed, passed = 0, 0
    for run in _structured_runs(6):
        msgs = run.messages
        tool_msgs = [i for i, m in enumerate(msgs) if m["role"] == "tool"]
        for j, i in enumerate(tool_msgs):
            if msgs[i]["name"] != "run_tests" or j == 0 or msgs[tool_msgs[j - 1]]["name"] != "apply_edit":
                continue
            a = parse_applied(msgs[tool_msgs[j - 1]]["content"])
            after = _offered(msgs[:i + 1], tools)
            if tests_all_passed(msgs[i]["content"]):
                assert list(after) == ["submit"] and after["submit"]["properties"]["explanation"]["enum"][0] \
                    .startswith(f"Fixed {a.path} line {a.line}:")
                passed += 1
                continue
            assert list(after) == ["propose_edits"]
            assert after["propose_edits"]["properties"]["line"]["enum"] == [a.line]
            if len(tool_msgs) <= j + 2 or msgs[tool_msgs[j + 1]]["name"] != "propose_edits":
                continue                                   # the turn limit came first
            listing = tool_msgs[j + 1]
            undo = _offered(msgs[:listing + 1], tools)
            assert list(undo) == ["apply_edit"]
            (index,) = undo["apply_edit"]["properties"]["index"]["enum"]
            restored = dict(parse_candidates(msgs[listing]["content"]))[index]
            loc = next(m["content"] for m in msgs if m.get("name") == "localize" and m["role"] == "tool")
            assert restored.split(": `", 1)[-1][:-1] == localized_code(loc)[a.line]     # the line as it was
            if len(tool_msgs) > j + 2:
                st = episode_state(msgs[:tool_msgs[j + 2] + 1])
                assert st["clean"] and st["pending"] is None and (a.path, a.line, a.index) in st["tried"]
                again = _offered(msgs[:tool_msgs[j + 2] + 1], tools).get("apply_edit")
                branches = (again or {}).get("anyOf", [again] if again else [])
                assert not any(b["properties"]["line"]["enum"] == [a.line] and a.index in b["properties"]["index"]["enum"]
                               for b in branches)
            failed += 1
    assert failed >= 1 and passed >= 1


def test_undo_index_reads_the_inverse_from_the_descriptions():
    from ratchet.policy.action_mask import undo_index

    cands = [(0, "replace `<` with `>` at column 7 (comparison): `if a > b:`"),
             (1, "replace `<` with `<=` at column 7 (comparison): `if a <= b:`"),
             (2, "remove `not` at column 3: `if a < b:`")]
    assert undo_index(cands, "if a < b:") == 2
    assert undo_index(cands, "if a == b:") is None and undo_index(cands, None) is None
