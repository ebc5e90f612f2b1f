"""The embedded policy's chat format: one Jinja template (rendering tool calls, marking assistant
spans with `{% generation %}`), `render`, `parse_assistant`, and `prepare`, which puts stored
OpenAI-chat messages into the form the template renders.

    <|im_start|>system
    You are a code-repair agent ...

    # Tools
    localize(top?: integer, formula?: string, tests?: array)
    ...<|im_end|>
    <|im_start|>user
    Repository: ...<|im_end|>
    <|im_start|>assistant
    Let me read the issue first.
    <tool_call>{"name": "view_issue", "arguments": {}}</tool_call><|im_end|>
    <|im_start|>tool
    Issue HE-003 ...<|im_end|>

The assistant span (what the policy generates, what the loss sees) runs from after
`<|im_start|>assistant\\n` up to and including `<|im_end|>` (the stop token: the model must learn
to stop). Tools are shown as one-line signatures, not whole JSON schemas: the grammar
(`ratchet.policy.grammar`) enforces the schemas, and a small model pays for every prompt token.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# Long observations (a whole file, a pytest tail) are clipped to their head: what the expert acts
# on (counts, FAILED ids, ranked lines, candidates) comes first, and context length is the cost
# of every CPU training step. Applied in `prepare`, so training and inference see the same text.
MAX_TOOL_CHARS = 600
CLIP_MARK = "\n...[clipped]"

# transformers renders with trim_blocks/lstrip_blocks: a newline right after a tag is dropped, so
# the template has no whitespace-control dashes and writes each newline next to a tag as {{ NL }}.
CHAT_TEMPLATE = (
    "{% set NL = '\\n' %}"
    "{% set sys = messages[0].content if messages and messages[0].role == 'system' else '' %}"
    "{% if sys or tools %}<|im_start|>system{{ NL }}{{ sys }}"
    "{% if tools %}{{ NL ~ NL if sys else '' }}# Tools"
    "{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "{% set req = f.parameters.required if f.parameters.required is defined else [] %}"
    "{{ NL }}{{ f.name }}("
    "{% for name, spec in f.parameters.properties.items() %}"
    "{{ name }}{{ '' if name in req else '?' }}: {{ spec.type }}{{ '' if loop.last else ', ' }}"
    "{% endfor %})"
    "{% endfor %}"
    "{% endif %}<|im_end|>{{ NL }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant{{ NL }}"
    "{% set body %}"
    "{% if m.content %}{{ m.content }}{{ NL if m.tool_calls else '' }}{% endif %}"
    "{% for c in (m.tool_calls or []) %}"
    "<tool_call>{\"name\": {{ c.function.name | tojson }}, \"arguments\": {{ c.function.arguments }}}</tool_call>"
    "{% endfor %}<|im_end|>"
    "{% endset %}"
    "{% if m.train is not defined or m.train %}{% generation %}{{ body }}{% endgeneration %}"
    "{% else %}{{ body }}{% endif %}{{ NL }}"
    "{% elif m.role != 'system' or not loop.first %}"
    "<|im_start|>{{ m.role }}{{ NL }}{{ m.content }}<|im_end|>{{ NL }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ NL }}{% endif %}"
)


def _text(content: Any) -> str:
    """OpenAI content: a string, None, or a list of parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


# The policy's view of the structured tools' observations (a rendering, policy side: the env's
# text is unchanged). Why: the byte-level BPE splits `solution.py:12` into `:` `12` and `[3]` into
# `[` `3` `]`, but the call the policy writes holds ` 12` and ` 3` (`"line": 12`): other tokens, so
# "take the first-ranked line" meant learning a token-to-token map per number. With a space the
# observation holds the very token the call needs. Candidate rows are compacted to their kind
# (`sandboxes.agents.prior.kind_key`, a parse of the description) and the edit, first on the row:
# a 60-120 character row becomes ~30, so more of a list survives the clip and the kind the choice
# depends on sits right after the index.
_LOC_ROW = re.compile(r"^(\s*\d+\.\s+)(.+?):(\d+)\s+score=(\S+)\s+\| ?(.*)$")
_CAND_HEAD = re.compile(r"^(candidates for|no candidate edits for) (.+?):(\d+)(:?)$")
_CAND_ROW = re.compile(r"^\[(\d+)\] (.*)$")
_APPLIED = re.compile(r"^applied \[(\d+)\] to (.+?):(\d+): (.*)$")
_EDIT = re.compile(r"^replace `(.+?)` with `(.+?)`")
_COLUMN = re.compile(r" at column \d+")


def compact_candidate(description: str) -> str:
    """`replace `>` with `>=` at column 9 (comparison): `...`` -> `comparison_swap `>` -> `>=``."""
    from sandboxes.agents.prior import kind_key

    head = _COLUMN.sub("", description.split(": `", 1)[0]).strip()
    kind = kind_key(description)
    m = _EDIT.match(head)
    if m:
        return f"{kind} `{m.group(1)}` -> `{m.group(2)}`"
    return f"{kind}: {head}"


# The train-fit count prior as a FEATURE of the view (a checkpoint's `view` setting, saved with it
# by `decoding.write_decoding`): each `propose_edits` list is shown in the prior's order
# (`sandboxes.agents.prior.prior_order`: the count of the row's kind in TRAIN-split fixes, shared
# by the line's candidates of that kind; ties: the environment's order), each row keeping its own
# index label, so the call still names the environment's index, and the first listed row is the
# prior harness's choice on that line. Why: from ~50 demonstrations a 1M-parameter model did not
# learn the ranking of candidate kinds (SFT = the random harness, docs/experiments/); reading the
# first row of a list is a position it can learn. No view (or no prior in it): the env's order.
VIEW_PRIOR = "prior"
# `hide_task` (an experiment, off by default; measured by bench/learning.py, see docs/experiments/):
# the policy reads no text that names the task: the issue becomes TASK_HIDDEN_TEXT and the code
# quoted on localize's and apply_edit's rows is dropped (file, line, score, candidate kinds and
# edits stay). GRPO improved the tasks it trained on but not new ones; a policy that cannot tell
# tasks apart can only learn choices that transfer.
TASK_HIDDEN_TEXT = "Make the failing tests pass."


def make_view(prior, *, source: str = "", hide_task: bool = False, rank: bool = False,
              progress: bool = False, pick: bool = False, follow: bool = False) -> dict:
    """The view setting of a checkpoint whose lists are shown in `prior`'s order (a Prior fit on
    train-split data only: `sandboxes.agents.prior.fit_prior`; None: the env's order). `source`
    says what it was fit on. `hide_task`: the view also names no task (see TASK_HIDDEN_TEXT).
    `rank`: rank-relative actions (`ratchet.policy.rank_actions`); `progress` (with `rank` only):
    the tier-progress note after localize's and each propose_edits answer (`Ranks.progress`);
    `pick` (with `rank` and a prior only): the pick note on the clean file after each list and each
    undo (`Ranks.pick`); `follow` (with both notes): rank 0 names what the notes name
    (`Ranks.followed`)."""
    from ratchet.policy.rank_actions import FOLLOW_NOTES
    from sandboxes.agents.prior import as_prior

    view: dict = {}
    if prior is not None:
        p = as_prior(prior)
        view = {"candidates": VIEW_PRIOR, "prior": {"counts": dict(sorted(p.counts.items()))},
                "fit": {"tasks": len(p.task_ids), "source": source}}
    return {**view, **({"task": "hidden"} if hide_task else {}), **({"actions": "rank"} if rank else {}),
            **({"progress": PROGRESS_TIER} if progress and rank else {}),
            **({"pick": PICK_PRIOR} if pick and rank and view else {}),
            **({"follow": FOLLOW_NOTES} if follow and progress and pick and rank and view else {})}


def task_hidden(view: dict | None) -> bool:
    return bool(view) and view.get("task") == "hidden"


# the tier-progress note (`make_view(..., progress=True)`, rank-relative actions only):
# see `ratchet.policy.rank_actions.Ranks.progress`. A view without the key renders as before.
PROGRESS_TIER = "tier"
PROGRESS_AFTER = ("localize", "propose_edits")


def tier_progress(view: dict | None) -> bool:
    return bool(view) and view.get("progress") == PROGRESS_TIER


# the pick note (`make_view(..., pick=True)`, rank-relative actions and a prior only):
# see `ratchet.policy.rank_actions.Ranks.pick`. A view without the key renders as before.
PICK_PRIOR = "prior"
PICK_AFTER = ("propose_edits", "apply_edit")


def pick_note(view: dict | None) -> bool:
    return bool(view) and view.get("pick") == PICK_PRIOR


_PRIORS: dict = {}


def view_prior(view: dict | None):
    """The Prior a view orders candidates by, or None (no view, or the env's order)."""
    if not view or view.get("candidates") != VIEW_PRIOR:
        return None
    key = json.dumps(view["prior"]["counts"], sort_keys=True)
    if key not in _PRIORS:
        from sandboxes.agents.prior import Prior
        _PRIORS[key] = Prior.from_counts(view["prior"]["counts"])
    return _PRIORS[key]


def order_candidates(cands: list[tuple[int, str]], view: dict | None) -> list[tuple[int, str]]:
    """One line's (index, description) rows in the order the view lists them."""
    prior = view_prior(view)
    if prior is None or len(cands) < 2:
        return list(cands)
    from sandboxes.agents.prior import prior_order
    return prior_order(list(cands), prior)


def _ordered_rows(rows: list[str], view: dict | None) -> list[str]:
    """Runs of consecutive candidate rows (one list) reordered by the view's prior; with
    rank-relative actions each row is labelled with its place in the list (1, 2, ...)."""
    from ratchet.policy.rank_actions import rank_actions

    rank = rank_actions(view)
    if view_prior(view) is None and not rank:
        return rows
    out, run = [], []
    for row in rows + [None]:
        m = _CAND_ROW.match(row) if row is not None else None
        if m:
            run.append((int(m.group(1)), m.group(2)))
            continue
        out += [f"[{k if rank else i}] {d}" for k, (i, d) in enumerate(order_candidates(run, view), 1)]
        run = []
        if row is not None:
            out.append(row)
    return out


def _line_label(path: str, line: str, lines: tuple | None) -> str:
    """`solution.py: 12`, or with rank-relative actions `2. solution.py: 12` (its row on localize's
    list, the number the policy's call names) when the line was listed."""
    k = lines.index((path, int(line))) + 1 if lines and (path, int(line)) in lines else None
    return f"{k}. {path}: {line}" if k else f"{path}: {line}"


def _tiers(text: str) -> dict:
    """Localize row -> its tier: 1 for the rows of the top score, +1 at each change of score."""
    out, last, t = {}, None, 0
    for row in text.split("\n"):
        m = _LOC_ROW.match(row)
        if m:
            t += m.group(4) != last
            last = m.group(4)
            out[row] = t
    return out


def policy_view(text: str, view: dict | None = None, lines: tuple | None = None) -> str:
    """A tool observation as the embedded policy reads it (see above); other text unchanged.
    `view`: a checkpoint's view setting (`make_view`): candidate lists in the prior's order, and
    with rank-relative actions rows labelled by rank; `lines` (those actions only): localize's
    (path, line) rows so far, which label the lines that candidate lists and edits name."""
    from ratchet.policy.rank_actions import rank_actions

    out, hide, rank = [], task_hidden(view), rank_actions(view)
    lines = lines if rank else None
    tiers = _tiers(text) if rank else {}
    for row in _ordered_rows(text.split("\n"), view):
        m = _LOC_ROW.match(row)
        if m:
            # with ranks: the row's SBFL tier instead of its score (rows of equal score share a
            # tier; 1 = the most suspicious), the one thing about the score the demonstrator uses
            # (it lists a whole tier, then attempts): a small label, not a decimal to compare
            rank_of = f"tier {tiers[row]}" if rank else f"score={m.group(4)}"
            row = f"{m.group(1)}{m.group(2)}: {m.group(3)} {rank_of}" + ("" if hide else f" | {m.group(5)}")
        elif (m := _CAND_HEAD.match(row)):
            row = f"{m.group(1)} {_line_label(m.group(2), m.group(3), lines)}{m.group(4)}"
        elif (m := _CAND_ROW.match(row)):
            row = f"[ {m.group(1)}] {compact_candidate(m.group(2))}"
        elif (m := _APPLIED.match(row)):
            # with ranks the row's index is left out: it was the call's own number, one turn back
            head = f"applied to {_line_label(m.group(2), m.group(3), lines)}" if rank else \
                f"applied [ {m.group(1)}] to {m.group(2)}: {m.group(3)}"
            row = head + ("" if hide else f": {m.group(4)}")
        out.append(row)
    return "\n".join(out)


def clip(text: str, limit: int | None = MAX_TOOL_CHARS) -> str:
    return text if limit is None or len(text) <= limit else text[:limit] + CLIP_MARK


def canonical_arguments(name: str, arguments: Any, functions: dict[str, dict]) -> str | None:
    """Arguments as the grammar emits them (schema property order, json.dumps separators), or None
    when the call is not one the offered schemas allow (unknown tool, bad JSON, schema mismatch)."""
    from ratchet.policy.grammar import arguments_valid

    fn = functions.get(name)
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else (arguments or {})
    except json.JSONDecodeError:
        return None
    if fn is None or not arguments_valid(fn["parameters"], args):
        return None
    order = list(fn["parameters"].get("properties", {}))
    return json.dumps({k: args[k] for k in order if k in args})


MEMO = True        # prepare's per-message memo (bench/render.py turns it off for its baseline)


@functools.lru_cache(maxsize=64)
def _loads(key: str):
    """A view or schema map back from its memo key (a private copy: callers may mutate their own;
    nothing here mutates this one)."""
    return json.loads(key)


@functools.lru_cache(maxsize=4096)     # a worker's open episodes need ~30 x 24; raw texts can be long
def _tool_view(text: str, view_key: str, limit: int | None, lines: tuple | None = None) -> str:
    return clip(policy_view(text, _loads(view_key) if view_key else None, lines), limit)


@functools.lru_cache(maxsize=4096)
def _canonical_cached(name: str, raw: str, schemas_key: str) -> str | None:
    return canonical_arguments(name, raw, _loads(schemas_key))


def _functions(tools: Iterable[dict] | None) -> dict[str, dict]:
    return {(t.get("function") or t)["name"]: (t.get("function") or t) for t in tools or ()}


def prepare(messages: list[dict], tools: list[dict] | None, *, max_tool_chars: int | None = MAX_TOOL_CHARS,
            train_invalid_calls: bool = False, thoughts: bool = True, view: dict | None = None) -> list[dict]:
    """Stored messages -> template input: text content, canonical call arguments, clipped tool
    output, and `train: False` on assistant turns holding a call the offered schemas do not allow
    (the grammar could never emit it, so the loss must not teach it; `train_invalid_calls` keeps
    them). A turn whose call is invalid keeps its raw argument text, as logged. Without `tools`
    nothing can be checked: calls are rendered as logged and every turn trains. `thoughts=False`
    drops the text before a call (pair it with `Bounds(thought_chars=0)` in the grammar). `view`:
    the checkpoint's view setting (`make_view`; None: the env's candidate order)."""
    schemas = _functions(tools)
    # Every turn re-renders the whole conversation (the prompt is the template over all of it), so
    # the per-message work is memoised: profiled on 48 greedy episodes replayed from the completion
    # memo, `prepare` was 13.2 of the 25 s wall (policy_view, canonical_arguments' jsonschema
    # check, per message per turn: quadratic in turns). Both are pure functions of their inputs.
    # keys keep the dicts' order: the schema's property order is the canonical argument order
    from ratchet.policy.rank_actions import Ranks, rank_actions

    view_key = json.dumps(view) if MEMO and view else ""
    schemas_key = json.dumps(schemas) if tools and MEMO else ""
    # rank-relative actions: logged calls (the environment's numbers) are shown as the ranks the
    # policy writes, from the observations before each call; a call naming nothing listed keeps
    # its numbers and does not train (the policy could not have written it)
    ranks = Ranks(view) if rank_actions(view) else None
    progress = ranks is not None and tier_progress(view)
    pick = ranks is not None and pick_note(view)
    if progress or pick:
        from sandboxes.observations import is_error
    sent: dict = {}             # call id -> (name, arguments as the environment got them)
    out = []
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            calls, ok = [], True
            for c in m.get("tool_calls") or ():
                fn = c.get("function") or {}
                name, raw = fn.get("name") or "", fn.get("arguments")
                if ranks is not None:
                    raw, ranked = _ranked_call(name, raw, ranks, sent, c.get("id"))
                    ok = ok and ranked
                args = (None if not tools else _canonical_cached(name, raw, schemas_key)
                        if MEMO and isinstance(raw, str) else canonical_arguments(name, raw, schemas))
                if args is None and tools:
                    ok = False
                if args is None:
                    args = raw if isinstance(raw, str) else json.dumps(raw)
                calls.append({"type": "function", "function": {"name": name, "arguments": args}})
            text = _text(m.get("content")).strip() if thoughts or not calls else ""
            msg = {"role": "assistant", "content": text, "tool_calls": calls}
            if not ok and not train_invalid_calls:
                msg["train"] = False
            if m.get("token_ids") is not None:
                msg["token_ids"] = list(m["token_ids"])
            out.append(msg)
        elif role == "tool":
            text = _text(m.get("content"))
            lines = ranks.lines if ranks is not None else None
            out.append({"role": "tool", "content": _tool_view(text, view_key, max_tool_chars, lines) if MEMO
                        else clip(policy_view(text, view, lines), max_tool_chars)})
            if ranks is not None:
                name, args = sent.get(m.get("tool_call_id"), (m.get("name") or "", {}))
                ranks.observe(name, args, text)
                if progress and name in PROGRESS_AFTER and not is_error(text) and (note := ranks.progress()):
                    # after the clip, so a long list never hides it (Ranks.progress)
                    out[-1]["content"] += "\n" + note
                if pick and name in PICK_AFTER and not is_error(text) and (note := ranks.pick()):
                    out[-1]["content"] += "\n" + note      # clean file only (Ranks.pick)
        elif role == "user" and task_hidden(view) and not any(o["role"] == "assistant" for o in out):
            out.append({"role": role, "content": TASK_HIDDEN_TEXT})
        else:
            out.append({"role": role, "content": _text(m.get("content"))})
    return out


def _ranked_call(name: str, raw, ranks, sent: dict, call_id) -> tuple:
    """(arguments to render, whether they are the policy's ranks) for one logged call; records the
    call's environment arguments under its id for the observation that answers it."""
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        args = None
    args = args if isinstance(args, dict) else {}
    sent[call_id] = (name, args)
    ranked = ranks.to_rank(name, args)
    if ranked is None:
        return raw, False
    return (json.dumps(ranked) if ranked is not args else raw), True


def render_spans(messages: list[dict], tools: list[dict] | None = None, *, add_generation_prompt: bool = False,
                 prepared: bool = False, **prepare_kw) -> tuple[str, list[tuple[int, int]]]:
    """(text, assistant character spans) through the one template (transformers' own renderer,
    the code `apply_chat_template` runs)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    msgs = messages if prepared else prepare(messages, tools, **prepare_kw)
    texts, spans = render_jinja_template(conversations=[msgs], tools=tools or None, chat_template=CHAT_TEMPLATE,
                                         return_assistant_tokens_mask=True,
                                         add_generation_prompt=add_generation_prompt)
    return texts[0], [tuple(s) for s in spans[0]]


def render(messages: list[dict], tools: list[dict] | None = None, *, add_generation_prompt: bool = True,
           **prepare_kw) -> str:
    """The prompt text for the embedded policy (ends with `<|im_start|>assistant\\n` by default)."""
    return render_spans(messages, tools, add_generation_prompt=add_generation_prompt, **prepare_kw)[0]


_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


def parse_assistant(text: str) -> list[dict]:
    """Tool calls in one generated assistant turn, as OpenAI `tool_calls` entries (no ids: the
    runner numbers them). A call whose JSON is broken is returned with name "" and the raw text
    as arguments, so the environment answers it with an error instead of it vanishing."""
    calls = []
    for body in _CALL.findall(text):
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError(name)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            calls.append({"type": "function", "function": {"name": "", "arguments": body}})
            continue
        calls.append({"type": "function", "function": {
            "name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return calls


def parse_turn(text: str) -> dict:
    """One generated turn as an assistant message: the text before the first call is `content`."""
    text = text.split(IM_END, 1)[0]
    head = text.split(CALL_OPEN, 1)[0].strip()
    return {"role": "assistant", "content": head or None, "tool_calls": parse_assistant(text)}
