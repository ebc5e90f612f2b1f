"""The embedded policy's view of the structured tools' observations (`chat.policy_view`): the
numbers a call must name appear as the very tokens the call writes, candidate rows are compacted
to their kind, and the view is what both training (`prepare`) and inference render."""
import pytest

from ratchet.policy.embedded.chat import compact_candidate, policy_view, prepare

pytestmark = pytest.mark.training

LOC = ("suspicious lines (ochiai; 2 failing test(s)):\n"
       " 1. solution.py:13  score=0.816  | mean = sum(numbers) / len(numbers)\n"
       " 2. solution.py:4  score=0.500  | def f(numbers):")
CANDS = ("candidates for solution.py:13:\n"
         "[0] replace `/` with `*` at column 24 (arithmetic): `mean = sum(numbers) * len(numbers)`\n"
         "[1] remove `not` at column 7: `if x:`\n"
         "[12] replace `numbers` with `mean` at column 15 (variable): `mean = sum(mean) / len(numbers)`")


def _contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_numbers_in_the_view_are_the_tokens_the_call_writes(tokenizer):
    view = policy_view(LOC) + "\n" + policy_view(CANDS)
    seen = tokenizer.encode(view, add_special_tokens=False)
    for key, n in (("line", 13), ("line", 4), ("index", 0), ("index", 12)):
        call = tokenizer.encode(f'{{"{key}": {n}}}', add_special_tokens=False)
        num = tokenizer.encode(f" {n}", add_special_tokens=False)
        assert _contains(call, num) and _contains(seen, num), (key, n)
    # the env's text held them as other tokens (`:13`, `[0]`): the reason for the view
    raw = tokenizer.encode(LOC, add_special_tokens=False)
    assert not _contains(raw, tokenizer.encode(" 13", add_special_tokens=False))


def test_candidate_rows_are_compacted_to_their_kind_and_edit():
    rows = policy_view(CANDS).splitlines()
    assert rows == ["candidates for solution.py: 13:", "[ 0] arithmetic_swap `/` -> `*`",
                    "[ 1] negation_drop: remove `not`", "[ 12] variable_swap `numbers` -> `mean`"]
    assert compact_candidate("swap arguments `a, b` -> `b, a`: `f(b, a)`") == "argument_swap: swap arguments `a, b` -> `b, a`"
    assert policy_view("applied [3] to solution.py:13: `x = 1`") == "applied [ 3] to solution.py: 13: `x = 1`"
    other = "3 failed\nFAILED test_solution.py::test_check_00"
    assert policy_view(other) == other                         # other observations are unchanged


def test_training_and_inference_render_the_same_view():
    msgs = [{"role": "user", "content": "fix it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "localize", "arguments": '{"top": 10}'}}]},
            {"role": "tool", "tool_call_id": "c0", "name": "localize", "content": LOC}]
    (tool,) = [m for m in prepare(msgs, None) if m["role"] == "tool"]
    assert tool["content"] == policy_view(LOC) and msgs[2]["content"] == LOC     # stored text untouched
