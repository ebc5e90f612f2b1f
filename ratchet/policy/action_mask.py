"""A per-turn action mask for the embedded policy: the tool schemas its grammar is compiled from,
narrowed to what the episode has observed. Policy side only: the environment's tools, schemas and
checks are unchanged, and every narrowed call is a valid call of the environment's schema
(tests/training/test_action_mask.py checks each one with `sandboxes.tools.check_arguments`).

    tools = structured_tools(env_tools)                 # the subset the prompt lists
    offered = narrow(messages, tools)                   # this turn's grammar schemas

The structured subset: localize, propose_edits, apply_edit, run_tests, submit, offered in the
order the flow needs them and narrowed to what was observed (`narrow` lists the rules): which
line to inspect and which candidate to apply stay the policy's choices; the files, lines, indices
and texts it may name come from the observations. An attempt is tested, then submitted if it
passed or undone by its inverse candidate if it failed (harness rules, the same for every policy).
So an untrained model is a random-but-valid agent over these choices (close to the
random-candidate harness), and the grammar spends no tokens on free text. Why: an SFT start
trained on ~100 trajectories wrote junk into free string arguments (docs/experiments/), so every
GRPO group was flat; with the mask a random choice of line and index hits the fix often enough for
groups to hold passes.
"""
from __future__ import annotations

import copy

STRUCTURED = ("localize", "propose_edits", "apply_edit", "run_tests", "submit")
LOCALIZE_TOP = 10
# Giving up (submit with the no-fix text) never makes a test pass, so it is offered only late: after
# 10 turns (of the bench's and recipe's 14, too few are left for another attempt and its undo). The
# mask sees the conversation, not the budget. Offered after every failed attempt, an SFT start took
# it right after its first undo (measured: 7 of 8 validation episodes ended so).
GIVE_UP_AFTER = 10


def _name(t: dict) -> str:
    return (t.get("function") or t)["name"]


def structured_tools(tools: list[dict]) -> list[dict]:
    """The structured subset of `tools`, in their order (the env's schemas, unchanged)."""
    return [t for t in tools if _name(t) in STRUCTURED]


def call_allowed(messages: list[dict], tools: list[dict], name: str, arguments: dict, *,
                 view: dict | None = None) -> bool:
    """Whether the call lies inside this turn's mask (used to check demonstrations)."""
    from ratchet.policy.grammar import arguments_valid
    from ratchet.policy.rank_actions import Ranks, rank_actions

    if rank_actions(view):          # `arguments` are the environment's: the mask offers ranks
        arguments = Ranks.of(messages, view).to_rank(name, arguments)
        if arguments is None:
            return False
    offered = {_name(t): (t.get("function") or t)["parameters"] for t in narrow(messages, tools, view=view)}
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


def undo_index(cands: list[tuple[int, str]], original: str | None) -> int | None:
    """The candidate that puts a line back as `original` (its code as localize showed it), read from
    the descriptions only (`...: \`<the line after the edit>\``): the operator tables are symmetric,
    so the inverse of the applied edit is on the dirty line's list. None if absent."""
    if original is None:
        return None
    return next((i for i, d in cands if d.split(": `", 1)[-1][:-1] == original), None)


class ListValidity:
    """Which candidate lists still describe the file, for the mask (`episode_state`) and the rank
    translation (`rank_actions.Ranks`) alike, so the two never disagree about which list a row
    number refers to. A list is keyed by `tag()` when it is shown: one shown on the clean file
    (every line reads as localize showed it) is valid again whenever the file is clean again (an
    undo), one shown after an edit until the next edit."""

    def __init__(self):
        self.code: dict = {}     # line -> its code as localize showed it
        self.dirty: set = set()  # lines that no longer read so
        self.applies = 0

    @property
    def clean(self) -> bool:
        return not self.dirty

    def tag(self):
        return "clean" if self.clean else self.applies

    def localized(self, obs: str) -> None:
        from sandboxes.agents.prior import localized_code

        self.code = localized_code(obs)

    def applied(self, a) -> None:
        """One successful apply_edit (`sandboxes.observations.parse_applied`)."""
        self.applies += 1
        (self.dirty.discard if self.code.get(a.line) == a.text else self.dirty.add)(a.line)


def episode_state(messages: list[dict]) -> dict:
    """What the mask needs from the conversation (see `narrow`), from the observations only."""
    from sandboxes.observations import is_error, parse_applied, parse_candidates, parse_localize, tests_all_passed

    st = {"localized": False, "ranked": [], "applied": None, "applies": 0, "tested": True, "clean": True,
          "attempts": 0, "pending": None, "verdict": None, "undo": None, "tried": set(),
          "turns": sum(1 for m in messages if m.get("role") == "assistant")}
    lv = ListValidity()
    lists: dict = {}       # ((path, line), lv.tag()) -> {index: description}
    tag = lv.tag
    for name, args, obs in _observations(messages):
        if is_error(obs):
            continue
        if name == "localize":
            st["localized"] = True
            st["ranked"] = [(f, ln) for f, ln, _ in parse_localize(obs)]
            lv.localized(obs)
        elif name == "propose_edits":
            key = (args.get("path"), args.get("line"))
            if None not in key:          # an empty list counts as shown too (nothing to apply there)
                lists[(key, tag())] = dict(parse_candidates(obs))
        elif name == "apply_edit":
            a = parse_applied(obs)
            if a is not None:
                was_clean = st["clean"]
                st["applied"] = (a.path, a.line, lists.get(((a.path, a.line), tag()), {}).get(a.index, ""))
                st["tested"] = False
                lv.applied(a)
                st["applies"], st["clean"] = lv.applies, lv.clean
                if was_clean and not st["clean"]:      # an attempt: an edit of the clean file
                    st["attempts"] += 1
                    st["tried"].add((a.path, a.line, a.index))
                    st["pending"], st["verdict"] = (a.path, a.line), None
                elif st["clean"]:
                    st["pending"], st["verdict"] = None, None
                else:                                  # an edit on top of an edit: no attempt structure
                    st["pending"], st["verdict"] = None, None
        elif name == "run_tests":
            st["tested"] = True
            if st["pending"] is not None:
                st["verdict"] = tests_all_passed(obs)
    st["valid"] = {key: len(c) for (key, t), c in lists.items() if t == tag()}
    st["listed"] = {key: sorted(c.items()) for (key, t), c in lists.items() if t == tag()}
    if st["pending"] is not None and st["verdict"] is False:
        listed = lists.get((st["pending"], tag()))
        if listed is not None:
            st["undo"] = undo_index(sorted(listed.items()), lv.code.get(st["pending"][1]))
            st["undo_listed"] = True
    return st


def _with_params(tool: dict, params: dict) -> dict:
    t = copy.deepcopy(tool)
    (t.get("function") or t)["parameters"] = params
    return t


def _object(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _rank_order(ranked, values):
    """`values` (lines) in SBFL rank order (the order localize listed them), not numeric order."""
    pos = {}
    for i, (_, ln) in enumerate(ranked):
        pos.setdefault(ln, i)
    return sorted(values, key=lambda v: (pos.get(v, len(pos)), v))


def narrow(messages: list[dict], tools: list[dict], *, view: dict | None = None) -> list[dict]:
    """This turn's schemas: the structured tools of `tools`, offered and narrowed by state.
    The flow:
    - localize (`{"top": 10}`) until one has answered; submit (no-fix text) if it ranked nothing;
    - attempt structure (harness rules, the same for every policy): an edit of the clean file is an
      attempt; it is tested before anything else (run_tests only); if the tests pass, only submit
      (its explanation: `sandboxes.agents.prior.short_explanation` of that edit); if they fail,
      only the undo: propose_edits on the edited line, then apply_edit of the candidate that puts
      the line back as localize showed it (`undo_index`, read from the observations). So a failed
      attempt is always undone cleanly and a passing one is always submitted;
    - on the clean file: propose_edits with `path` among localize's files and `line` among its
      lines except those whose candidates are already listed for the file as it reads now (asking
      again shows nothing new; measured: an SFT start looped on it until the turn limit); and
      apply_edit for the candidate lists that still describe the file, one `anyOf` branch per
      (path, line) with `index` among the candidates not tried yet (no attempt twice). Enums list
      lines in SBFL rank order, and indices in the order the policy's view lists the candidates
      (`view`: a checkpoint's view setting, `chat.make_view`; the prior's order when it has one,
      else the environment's), so the first enum value is the first row the policy sees; with
      rank-relative actions (`view["actions"] == "rank"`) every line and index is offered as its
      rank (`ratchet.policy.rank_actions.rank_schemas`);
    - submit with the no-fix text on the clean file after a failed attempt once `GIVE_UP_AFTER`
      turns are used, when nothing else is left (every line listed, every candidate tried), or when
      an edit could not be undone (then the pre-mask options stay open too).
    At least one tool is always offered."""
    from ratchet.policy.rank_actions import Ranks, rank_actions, rank_schemas
    from sandboxes.agents.prior import NO_FIX, short_explanation

    st = episode_state(messages)
    by_name = {_name(t): t for t in structured_tools(tools)}

    def one(name, props):
        return [_with_params(by_name[name], _object(props, list(props)))] if name in by_name else []

    def enum(v):
        return {"type": "integer" if isinstance(v[0], int) else "string", "enum": list(v)}

    if not st["localized"]:
        out = one("localize", {"top": enum([LOCALIZE_TOP])})
    elif not st["ranked"]:
        out = one("submit", {"explanation": enum([NO_FIX])})
    elif st["pending"] is not None and st["verdict"] is None:
        out = one("run_tests", {})
    elif st["pending"] is not None and st["verdict"]:
        out = one("submit", {"explanation": enum([short_explanation(*st["applied"])])})
    elif st["pending"] is not None and not st.get("undo_listed"):
        p, ln = st["pending"]
        out = one("propose_edits", {"path": enum([p]), "line": enum([ln])})
    elif st["pending"] is not None and st["undo"] is not None:
        p, ln = st["pending"]
        out = one("apply_edit", {"path": enum([p]), "line": enum([ln]), "index": enum([st["undo"]])})
    else:
        out = _open_choices(st, by_name, fallback=st["pending"] is not None or not st["clean"], view=view)
    if rank_actions(view):          # the same choices, named by rank (ratchet.policy.rank_actions)
        out = rank_schemas(out, Ranks.of(messages, view))
    if not out:      # nothing left to try (or localize failed every time): let the episode end
        out = one("submit", {"explanation": enum([NO_FIX])})
    return out


def _open_choices(st: dict, by_name: dict, *, fallback: bool, view: dict | None = None) -> list[dict]:
    """The clean file's choices: inspect a line, or apply an untried candidate. `fallback` (an
    edit that could not be undone): also test and submit, as before the attempt structure."""
    from ratchet.policy.embedded.chat import order_candidates
    from sandboxes.agents.prior import NO_FIX, short_explanation

    out = []
    for name, t in by_name.items():
        if name == "propose_edits":
            files = sorted({f for f, _ in st["ranked"]})
            shown = {ln for _, ln in st["valid"]}     # listed already, and the file still reads the same
            lines = _rank_order(st["ranked"], {ln for _, ln in st["ranked"]} - shown)
            if lines:
                out.append(_with_params(t, _object({"path": {"type": "string", "enum": files},
                                                    "line": {"type": "integer", "enum": lines}}, ["path", "line"])))
        elif name == "apply_edit":
            order = {ln: i for i, ln in enumerate(_rank_order(st["ranked"], [ln for _, ln in st["valid"]]))}
            branches = []
            for (p, ln), n in sorted(st["valid"].items(), key=lambda kv: (order.get(kv[0][1], 0), kv[0])):
                left = [i for i, _ in order_candidates(st["listed"][(p, ln)], view)
                        if not st["clean"] or (p, ln, i) not in st["tried"]]
                if left:
                    branches.append(_object({"path": {"type": "string", "enum": [p]},
                                             "line": {"type": "integer", "enum": [ln]},
                                             "index": {"type": "integer", "enum": left}},
                                            ["path", "line", "index"]))
            if branches:
                out.append(_with_params(t, branches[0] if len(branches) == 1 else {"anyOf": branches}))
        elif name == "run_tests" and fallback and not st["tested"]:
            out.append(_with_params(t, _object({}, [])))
        elif name == "submit" and fallback:
            texts = ([short_explanation(*st["applied"])] if st["applied"] else []) + [NO_FIX]
            out.append(_with_params(t, _object({"explanation": {"type": "string", "enum": texts}}, ["explanation"])))
        elif name == "submit" and st["attempts"] and st["clean"] and st["turns"] >= GIVE_UP_AFTER:
            out.append(_with_params(t, _object({"explanation": {"type": "string", "enum": [NO_FIX]}}, ["explanation"])))
    return out
