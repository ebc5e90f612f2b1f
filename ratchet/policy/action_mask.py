"""A per-turn action mask for the embedded policy: the tool schemas its grammar is compiled from,
narrowed to what the episode has observed. Policy side only: the environment's tools, schemas and
checks are unchanged, and every narrowed call is a valid call of the environment's schema
(tests/policy/test_action_mask.py checks each one with `sandboxes.tools.check_arguments`).

    tools = structured_tools(env_tools)                 # the subset the prompt lists
    offered = narrow(messages, tools)                   # this turn's grammar schemas

The structured subset: localize, propose_edits, apply_edit, run_tests, submit, offered in the
order the flow needs them and narrowed to what was observed (`narrow` lists the rules): which
line to inspect, which candidate to apply, whether to test, undo or submit stay the policy's
choices; the files, lines, indices and texts it may name come from the observations. So an
untrained model is a random-but-valid agent over these choices (close to the random-candidate
harness), and the grammar spends no tokens on free text. Why: an SFT start trained on ~100 trajectories wrote junk into free string
arguments (docs/training.md), so every GRPO group was flat; with the mask a random choice of line
and index hits the fix often enough for groups to hold passes.
"""
from __future__ import annotations

import copy

STRUCTURED = ("localize", "propose_edits", "apply_edit", "run_tests", "submit")
LOCALIZE_TOP = 10


def _name(t: dict) -> str:
    return (t.get("function") or t)["name"]


def structured_tools(tools: list[dict]) -> list[dict]:
    """The structured subset of `tools`, in their order (the env's schemas, unchanged)."""
    return [t for t in tools if _name(t) in STRUCTURED]


def call_allowed(messages: list[dict], tools: list[dict], name: str, arguments: dict) -> bool:
    """Whether the call lies inside this turn's mask (used to check demonstrations)."""
    from ratchet.policy.grammar import arguments_valid

    offered = {_name(t): (t.get("function") or t)["parameters"] for t in narrow(messages, tools)}
    return name in offered and arguments_valid(offered[name], arguments)


def _observations(messages: list[dict]):
    """(tool name, arguments dict, observation) per answered call, in order."""
    import json

    calls, out = {}, []
    for m in messages:
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or ():
                fn = c["function"]
                try:
                    args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
                except ValueError:
                    args = None
                calls[c.get("id")] = (fn["name"], args)
        elif m.get("role") == "tool":
            name, args = calls.get(m.get("tool_call_id"), (m.get("name"), None))
            out.append((name, args if isinstance(args, dict) else {}, m.get("content") or ""))
    return out


def episode_state(messages: list[dict]) -> dict:
    """What the mask needs from the conversation (see `narrow`)."""
    from sandboxes.agents.prior import localized_code
    from sandboxes.observations import is_error, parse_applied, parse_candidates, parse_localize

    st = {"localized": False, "ranked": [], "applied": None, "applies": 0, "tested": True, "clean": True}
    dirty: set = set()     # lines that no longer read as localize showed them
    code: dict = {}
    lists: dict = {}       # ((path, line), tag) -> {index: description}; tag: "clean" or the apply count

    def tag():
        # a list stays valid while the file reads as when it was listed: one listed on the clean
        # file whenever it is clean again (an undo), one listed after an edit until the next apply
        return "clean" if st["clean"] else st["applies"]
    for name, args, obs in _observations(messages):
        if is_error(obs):
            continue
        if name == "localize":
            st["localized"] = True
            st["ranked"] = [(f, ln) for f, ln, _ in parse_localize(obs)]
            code = localized_code(obs)
        elif name == "propose_edits":
            cands = parse_candidates(obs)
            key = (args.get("path"), args.get("line"))
            if cands and None not in key:
                lists[(key, tag())] = dict(cands)
        elif name == "apply_edit":
            a = parse_applied(obs)
            if a is not None:
                st["applied"] = (a.path, a.line, lists.get(((a.path, a.line), tag()), {}).get(a.index, ""))
                st["applies"] += 1
                st["tested"] = False
                (dirty.discard if code.get(a.line) == a.text else dirty.add)(a.line)
                st["clean"] = not dirty
        elif name == "run_tests":
            st["tested"] = True
    st["valid"] = {key: len(c) for (key, t), c in lists.items() if t == tag()}
    return st


def _with_params(tool: dict, params: dict) -> dict:
    t = copy.deepcopy(tool)
    (t.get("function") or t)["parameters"] = params
    return t


def _object(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def narrow(messages: list[dict], tools: list[dict]) -> list[dict]:
    """This turn's schemas: the structured tools of `tools`, offered and narrowed by state:
    - localize (`{"top": 10}`) until one has answered;
    - propose_edits once it listed lines: `path` among its files, `line` among its lines except
      those whose candidates are already listed for the file as it reads now (asking again shows
      nothing new; measured: at temperature 0.5 an SFT start looped on it until the turn limit);
    - apply_edit for the candidate lists that still describe the file (listed on the clean file
      while it is clean again, or since the last apply): one `anyOf` branch per (path, line)
      with `index` in [0, its count);
    - run_tests after an apply that was not tested yet (the whole suite: `{}`);
    - submit after any apply, or when localize found nothing; `explanation` one of the short
      texts `sandboxes.agents.prior.short_explanation` builds, or the no-fix text.
    At least one tool is always offered (localize, then propose_edits or apply_edit)."""
    from sandboxes.agents.prior import NO_FIX, short_explanation

    st = episode_state(messages)
    out = []
    for t in structured_tools(tools):
        name = _name(t)
        if name == "localize" and not st["localized"]:
            out.append(_with_params(t, _object({"top": {"type": "integer", "enum": [LOCALIZE_TOP]}}, ["top"])))
        elif name == "propose_edits" and st["ranked"]:
            files = sorted({f for f, _ in st["ranked"]})
            shown = {ln for _, ln in st["valid"]}     # listed already, and the file still reads the same
            lines = sorted({ln for _, ln in st["ranked"]} - shown)
            if not lines:
                continue
            out.append(_with_params(t, _object({"path": {"type": "string", "enum": files},
                                                "line": {"type": "integer", "enum": lines}}, ["path", "line"])))
        elif name == "apply_edit" and st["valid"]:
            branches = [_object({"path": {"type": "string", "enum": [p]}, "line": {"type": "integer", "enum": [ln]},
                                 "index": {"type": "integer", "minimum": 0, "maximum": n - 1}},
                                ["path", "line", "index"]) for (p, ln), n in sorted(st["valid"].items())]
            out.append(_with_params(t, branches[0] if len(branches) == 1 else {"anyOf": branches}))
        elif name == "run_tests" and not st["tested"]:
            out.append(_with_params(t, _object({}, [])))
        elif name == "submit" and (st["applied"] or (st["localized"] and not st["ranked"])):
            texts = ([short_explanation(*st["applied"])] if st["applied"] else []) + [NO_FIX]
            out.append(_with_params(t, _object({"explanation": {"type": "string", "enum": texts}}, ["explanation"])))
    if not out:      # localize answered with an error every time, say: let the episode end
        out = [_with_params(t, _object({"explanation": {"type": "string", "enum": [NO_FIX]}}, ["explanation"]))
               for t in structured_tools(tools) if _name(t) == "submit"]
    return out
