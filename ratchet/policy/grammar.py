"""Constrained decoding: the embedded policy can only emit a valid call of an offered tool.

A turn is `[thought "\\n"] <tool_call>{"name": N, "arguments": A}</tool_call>` then the stop token,
where N is an offered tool and A matches N's JSON schema (the format of
`ratchet.policy.embedded.chat`). So an untrained model is a random-but-valid agent, and what
training adds shows as the margin above it.

Engine: xgrammar (0.2.x). Chosen because it installs as a CPU wheel for Python 3.11 from PyPI,
compiles JSON schemas (anyOf, const, enum, integer ranges, maxLength, maxItems) to a pushdown
automaton with a per-tokenizer token-mask cache, ships a transformers `LogitsProcessor`, and is the
engine vLLM and SGLang use by default, so the same grammar carries over to a served model.
(llguidance and outlines-core would also do; xgrammar was the first maintained one that
installed here and covers the schema subset the tools use.)

Termination by construction: free-form parts are bounded in the grammar (thought length,
`maxLength` on strings, `maxItems` on arrays, a `maximum` on integers) where the tool schema
leaves them open, so every turn ends within a known number of characters: a random model cannot
ramble past `max_new_tokens` and leave a truncated (invalid) call.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass

from ratchet.policy.embedded.chat import CALL_CLOSE, CALL_OPEN


@dataclass(frozen=True)
class Bounds:
    """Limits the grammar adds where a tool schema sets none (see the module doc)."""
    thought_chars: int = 160      # one line of free text before the call; 0 = no thought
    max_string: int = 320         # the expert's submit explanations run to ~250 chars
    max_items: int = 4
    max_int: int = 99_999
    max_escapes: int = 8          # escapes per string (the expert's edits carry up to 6 "\n")


def arguments_valid(parameters: dict, args) -> bool:
    """Whether `args` matches a tool's parameter schema (jsonschema, the reference validator)."""
    import jsonschema

    return isinstance(args, dict) and jsonschema.Draft202012Validator(parameters).is_valid(args)


def _functions(tool_schemas) -> list[dict]:
    return [t.get("function") or t for t in tool_schemas]


def bounded(schema: dict, b: Bounds) -> dict:
    """A copy of a JSON schema with the grammar's bounds added where the schema has none."""
    s = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        t = node.get("type")
        if t == "string" and not {"enum", "const", "pattern"} & set(node):
            node.setdefault("maxLength", b.max_string)
        elif t == "array":
            node.setdefault("maxItems", b.max_items)
            node.setdefault("items", {"type": "string"})
        elif t == "integer":
            node.setdefault("maximum", b.max_int)
            node.setdefault("minimum", -b.max_int)
        for key in ("properties",):
            for child in (node.get(key) or {}).values():
                walk(child)
        walk(node.get("items"))
        for key in ("anyOf", "oneOf", "allOf"):
            for child in node.get(key) or ():
                walk(child)
    walk(s)
    return s


def call_schema(tool_schemas, bounds: Bounds = Bounds()) -> dict:
    """One JSON schema for `{"name": ..., "arguments": ...}` over the offered tools."""
    fns = _functions(tool_schemas)
    if not fns:
        raise ValueError("no tools offered: a tool-call grammar needs at least one schema")
    return {"anyOf": [{
        "type": "object",
        "properties": {"name": {"const": f["name"]},
                       "arguments": bounded(f.get("parameters") or {"type": "object", "properties": {}}, bounds)},
        "required": ["name", "arguments"], "additionalProperties": False} for f in fns]}


def tool_call_grammar(tool_schemas, bounds: Bounds = Bounds()):
    """The xgrammar Grammar of one assistant turn (without the stop token: the matcher adds it)."""
    import xgrammar as xgr

    call = _json_grammar(call_schema(tool_schemas, bounds), bounds)
    parts = []
    if bounds.thought_chars > 0:
        parts.append(xgr.Grammar.from_ebnf(f'root ::= ([^\\x00-\\x1f]{{1,{bounds.thought_chars}}} "\\n")?'))
    parts += [xgr.Grammar.from_ebnf(f"root ::= {json.dumps(CALL_OPEN)}"), call,
              xgr.Grammar.from_ebnf(f"root ::= {json.dumps(CALL_CLOSE)}")]
    return xgr.Grammar.concat(*parts)


# xgrammar (0.2.9) writes a maxLength string as `"\"" X_characters{0, N} "\""` with
# X_characters ::= [^"\\\r\n]: raw control characters in (strict JSON rejects them, and so does
# the environment's parser) and escapes out (the expert's `edit` reverts carry "\n"). Each such
# rule is rewritten to JSON's characters. Speed decides the shape: a bounded repetition of an
# alternation (character | escape) costs xgrammar O(position) per token (measured 14-24 ms a
# token at 200 characters into a 320 bound, vs 0.005 ms for a repeated single class), so the
# escapes sit in their own short segments: `plain{0,N} (escape plain{0,N/4}){0,max_escapes}`
# where plain is one character class (0.1-0.2 ms a token, flat; docs/experiments/2026-11-30-grammar-bounded-strings.md).
# Still bounded, so termination holds. Checked by tests/training/test_grammar.py.
_BOUNDED_CHARS = re.compile(r'^(\w+_characters) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)
_BOUNDED_USE = re.compile(r'(\w+_characters)\{(\d+), (\d+)\}')
_JSON_PLAIN = r'\1 ::= (([^\\0-\\x1f\\"\\\\]))'


def _json_grammar(schema: dict, bounds: Bounds = Bounds()):
    import xgrammar as xgr

    text = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
    fixed, n = _BOUNDED_CHARS.subn(_JSON_PLAIN, text)
    if "_characters ::=" in text and n != text.count("_characters ::="):
        raise RuntimeError("xgrammar's bounded-string rule changed shape; update _BOUNDED_CHARS")
    escaped: set[str] = set()

    def use(m):
        escaped.add(m.group(1))
        return f"{m.group(0)} {m.group(1)}_escaped{{0, {bounds.max_escapes}}}"
    fixed = _BOUNDED_USE.sub(use, fixed)
    tail = max(1, bounds.max_string // 4)
    fixed += "".join(f'\n{r}_escaped ::= (("\\\\" [\\"\\\\/bfnrt] {r}{{0, {tail}}}))' for r in sorted(escaped))
    return xgr.Grammar.from_ebnf(fixed)


_COMPILERS: dict = {}   # id(tokenizer), vocab -> (tokenizer kept alive so the id stays unique, compiler)
_COMPILED: dict = {}


def _compiler(tokenizer, vocab_size: int | None):
    import xgrammar as xgr

    key = (id(tokenizer), vocab_size)
    if key not in _COMPILERS:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=[tokenizer.eos_token_id])
        _COMPILERS[key] = (tokenizer, xgr.GrammarCompiler(info))
    return _COMPILERS[key][1]


def compiled_tool_call_grammar(tokenizer, tool_schemas, *, vocab_size: int | None = None,
                               bounds: Bounds = Bounds()):
    """Compiled once per (tokenizer, schemas, bounds); compiling costs more than a decode step."""
    key = (id(tokenizer), vocab_size, json.dumps(tool_schemas, sort_keys=True), bounds)
    if key not in _COMPILED:
        _COMPILED[key] = _compiler(tokenizer, vocab_size).compile_grammar(tool_call_grammar(tool_schemas, bounds))
    return _COMPILED[key]


def tool_call_logits_processor(tokenizer, tool_schemas, *, vocab_size: int | None = None,
                               bounds: Bounds = Bounds()):
    """A fresh transformers LogitsProcessor for one `generate` call (it keeps per-row matcher
    state; make a new one per call). `vocab_size`: the model's logits width when it is larger
    than the tokenizer's. The tokenizer's eos token must be the turn's stop token (`<|im_end|>`)."""
    from xgrammar.contrib.hf import LogitsProcessor

    return LogitsProcessor(compiled_tool_call_grammar(tokenizer, tool_schemas, vocab_size=vocab_size, bounds=bounds))


class TokenMatcher:
    """One sequence's grammar state for the engine's decode loop: which tokens may come next.

    The engine's own loop uses this instead of xgrammar's transformers LogitsProcessor because it
    asks for the allowed set *without logits*: when exactly one token is allowed (the grammar
    forces it: `{"name": "`, the closing braces, the stop token) the engine appends it without a
    forward pass and feeds the whole forced run at the next one (jump-forward). The contrib
    processor fills a mask only when handed logits, and rebuilds the whole sequence as a tensor per
    token to find the one it should accept."""

    def __init__(self, compiled, vocab_size: int):
        import xgrammar as xgr

        self._m = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.vocab_size = vocab_size

    def allowed(self):
        """Bool tensor [vocab]: the tokens the grammar allows next."""
        import torch
        import xgrammar as xgr

        scores = torch.zeros(1, self.vocab_size)
        if not self._m.is_terminated():
            self._m.fill_next_token_bitmask(self._bitmask, 0)
            xgr.apply_token_bitmask_inplace(scores, self._bitmask)
        return torch.isfinite(scores[0])

    def accept(self, token: int) -> None:
        if not self._m.is_terminated() and not self._m.accept_token(int(token)):
            raise ValueError(f"token {token} is not allowed by the grammar here")


def token_matcher(tokenizer, tool_schemas, *, vocab_size: int | None = None, bounds: Bounds = Bounds()) -> TokenMatcher:
    """A fresh TokenMatcher over the offered tools (one per sequence)."""
    compiled = compiled_tool_call_grammar(tokenizer, tool_schemas, vocab_size=vocab_size, bounds=bounds)
    return TokenMatcher(compiled, compiled.tokenizer_info.vocab_size)
