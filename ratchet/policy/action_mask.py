"""A per-turn action mask for the embedded policy: the tool schemas its grammar is compiled from,
narrowed to what the episode has observed. Policy side only: the environment's tools, schemas and
checks are unchanged, and every narrowed call is a valid call of the environment's schema
(tests/policy/test_action_mask.py checks each one with `sandboxes.tools.check_arguments`).

    tools = structured_tools(env_tools)                 # the subset the prompt lists
    offered = narrow(messages, tools)                   # this turn's grammar schemas

The structured subset: localize, propose_edits, apply_edit, run_tests, submit. Narrowing:
- localize: `{"top": 10}` only (what the logged agents call); run_tests: `{}` (the whole suite);
- propose_edits: `path` an enum of the files the last localize named, `line` an enum of the
  lines it listed; offered only once a localize listed lines;
- apply_edit: `path`/`line` the last propose_edits' file and line, `index` in
  [0, its candidate count); offered only after a propose_edits that listed candidates;
- submit: `explanation` one of the short texts `sandboxes.agents.prior.short_explanation` builds
  from the last applied candidate (or the no-fix text): the structured agent's own texts.
So an untrained model is a random-but-valid agent over these choices, and the grammar spends no
tokens on free text. Why: an SFT start trained on ~100 trajectories wrote junk into free string
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
    """What the mask needs from the conversation: the last localize's (file, line) rows, the last
    propose_edits' path, line and candidates, and the last applied candidate's description."""
    from sandboxes.observations import is_error, parse_applied, parse_candidates, parse_localize

    st = {"ranked": [], "proposed": None, "applied": None}
    descs: dict = {}
    for name, args, obs in _observations(messages):
        if is_error(obs):
            continue
        if name == "localize":
            st["ranked"] = [(f, ln) for f, ln, _ in parse_localize(obs)]
        elif name == "propose_edits":
            cands = parse_candidates(obs)
            key = (args.get("path"), args.get("line"))
            descs[key] = dict(cands)
            st["proposed"] = (key[0], key[1], len(cands)) if cands and None not in key else None
        elif name == "apply_edit":
            a = parse_applied(obs)
            if a is not None:
                st["applied"] = (a.path, a.line, descs.get((a.path, a.line), {}).get(a.index, ""))
    return st


def _with_params(tool: dict, props: dict, required: list[str]) -> dict:
    t = copy.deepcopy(tool)
    fn = t.get("function") or t
    fn["parameters"] = {"type": "object", "properties": props, "required": required,
                        "additionalProperties": False}
    return t


def narrow(messages: list[dict], tools: list[dict]) -> list[dict]:
    """This turn's schemas: the structured tools of `tools`, narrowed as the module doc says."""
    from sandboxes.agents.prior import NO_FIX, short_explanation

    st = episode_state(messages)
    out = []
    for t in structured_tools(tools):
        name = _name(t)
        if name == "localize":
            out.append(_with_params(t, {"top": {"type": "integer", "enum": [LOCALIZE_TOP]}}, ["top"]))
        elif name == "run_tests":
            out.append(_with_params(t, {}, []))
        elif name == "propose_edits" and st["ranked"]:
            files = sorted({f for f, _ in st["ranked"]})
            lines = sorted({ln for _, ln in st["ranked"]})
            out.append(_with_params(t, {"path": {"type": "string", "enum": files},
                                        "line": {"type": "integer", "enum": lines}}, ["path", "line"]))
        elif name == "apply_edit" and st["proposed"]:
            path, line, n = st["proposed"]
            out.append(_with_params(t, {"path": {"type": "string", "enum": [path]},
                                        "line": {"type": "integer", "enum": [line]},
                                        "index": {"type": "integer", "minimum": 0, "maximum": n - 1}},
                                    ["path", "line", "index"]))
        elif name == "submit":
            text = short_explanation(*st["applied"]) if st["applied"] else NO_FIX
            out.append(_with_params(t, {"explanation": {"type": "string", "enum": [text]}}, ["explanation"]))
    return out
