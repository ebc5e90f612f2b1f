"""The root-cause rule v3 (gold_root_cause) and the rubric-v3 judge: two implementations that must
agree, credit natural quoting (`return False` should be `return True`), and refuse what a policy
optimising R_judge would try: the faulty line quoted verbatim, every line or token quoted, keyword
bait, the wrong function, several candidate fixes, a wrong operator phrase beside the right fix.
Run on the six tasks of the small suite (the tasks of the hand-label CSV)."""
import csv
import re
from pathlib import Path

import pytest

from ratchet.evaluation import judge_calibration as jc
from sandboxes.verifiers.judge import (
    KeywordRubricJudge,
    RubricJudge,
    RubricJudgeV2,
    make_judge,
    v3_lines,
    v3_quotes,
)

pytestmark = pytest.mark.evaluation
CSV = Path(__file__).with_name("fixtures") / "human_labels.csv"


@pytest.fixture(scope="module")
def by_id(suite_tasks):
    return {t.task_id: t for t in suite_tasks}


def _truth(b):
    rc = b.metadata["root_cause"]
    lines = b.files["solution.py"].splitlines()
    raw = lines[rc["line"] - 1]
    fixed = raw[:rc["col"]] + rc["original"] + raw[rc["end_col"]:]
    return rc, lines, raw, fixed


def _both(b, text) -> tuple[int, int]:
    """(gold rule, rubric-v3 judge) verdicts: the tests below require them equal."""
    j = RubricJudge().judge(b, text, b.metadata["fix_diff"], blast_score=1.0)
    return jc.gold_root_cause(b, text), int(j.criteria["root_cause_identified"])


def _fn_body(b):
    rc, lines, _, _ = _truth(b)
    start = next(i for i, l in enumerate(lines) if l.lstrip().startswith(f"def {rc['function']}("))
    return [l.strip() for l in lines[start:] if l.strip() and not l.strip().startswith(("#", '"""'))]


def test_hand_labels_agree_with_the_rule_and_the_judge(by_id):
    """The 12 hand labels (one rater; seen while rule v3 was written, so in-sample evidence)."""
    rows = list(csv.DictReader(CSV.open()))
    got = [(int(r["label"]), *_both(by_id[r["task_id"]], r["explanation"])) for r in rows]
    assert got == [(g, g, g) for g, _, _ in got]
    # rubric-v2 credited only the bare token: the natural quoting of 5 positives got no credit
    v2 = [int(RubricJudgeV2().judge(by_id[r["task_id"]], r["explanation"], "").criteria["root_cause_identified"])
          for r in rows]
    assert sum(v2[i] != int(r["label"]) for i, r in enumerate(rows)) == 5


def test_credits_the_fix_stated_in_natural_forms(suite_tasks):
    for b in suite_tasks:
        rc, _, raw, fixed = _truth(b)
        fn, n = rc["function"], rc["line"]
        forms = [f"`{fn}` line {n}: `{raw.strip()}` should be `{fixed.strip()}`.",   # whole lines, a pair
                 f"In {fn}(), line {n} must read `{fixed.strip()}`.",                 # the fixed line alone
                 f"In {fn}() the function's `{raw.strip()}` (line {n}) needs to be \"{fixed.strip()}\".",
                 "{} line {}: `{}` -> `{}`".format(fn, n, *jc._expressions(b, rc))]
        for text in forms:
            assert _both(b, text) == (1, 1), (b.task_id, text)


def test_refuses_what_a_reward_optimiser_would_try(suite_tasks):
    v2_fooled = 0
    for b in suite_tasks:
        rc, _, raw, fixed = _truth(b)
        fn, n, code = rc["function"], rc["line"], raw.strip()
        body = _fn_body(b)
        toks = re.findall(r"\w+|[^\w\s]+", code)
        pair = f"`{code}` should be `{fixed.strip()}`"
        from sandboxes.humaneval.operators import all_edits

        alts = [e.apply(b.files["solution.py"]).splitlines()[n - 1].strip()
                for e in all_edits(b.files["solution.py"], lines={n})]
        alts = [a for a in alts if a != fixed.strip()]
        assert alts, b.task_id
        refused = {
            "faulty line verbatim": f"The bug is in `{fn}` on line {n}: `{code}`.",
            "wrong token alone": f"`{fn}` line {n}: the `{rc['mutated'].strip() or 'not'}` is wrong.",
            "every token of the line": f"`{fn}` line {n}: " + " ".join(f"`{t}`" for t in toks),
            "every line of the function": f"`{fn}` line {n}: " + "; ".join(f"`{l}`" for l in body),
            "every line of the fixed function": f"`{fn}` line {n}: " + "; ".join(
                f"`{fixed.strip() if l == code else l}`" for l in body),
            "keyword bait": f"In `{fn}` line {n} the logic and the condition uses the wrong operator "
                            f"and not the right variable; off by one, swapped arguments, missing negation.",
            "wrong function": f"In `helper_{fn[:4]}` at line {n}, {pair}.",
            "wrong line": f"`{fn}` line {n + 2}: {pair}.",
            "lines listed": f"`{fn}` lines {n - 2}, {n}, {n + 2} and {n + 4}: {pair}.",
            "a line range": f"`{fn}` lines {n - 1}-{n + 1}: {pair}.",
            "two candidate fixes": f"`{fn}` line {n}: {pair}, or `{code}` should be `{alts[0]}`.",
            "every candidate fix": f"`{fn}` line {n}: it should be one of " + ", ".join(
                f"`{a}`" for a in [fixed.strip(), *alts][:8]),
            "a wrong operator phrase beside the fix": f"`{fn}` line {n}: {pair} "
            + ("(off-by-one)." if rc["operator"] == "argument_swap" else "(the arguments are swapped)."),
            "no function named": f"Line {n}: {pair}.",
        }
        for name, text in refused.items():
            assert _both(b, text) == (0, 0), (b.task_id, name, text)
        v2_fooled += int(RubricJudgeV2().judge(b, refused["every token of the line"], "")
                         .criteria["root_cause_identified"])
    assert v2_fooled >= 1       # rubric-v2 paid for quoting every token of the located line


def test_v2_line_list_loophole_is_closed(suite_tasks):
    b = next(t for t in suite_tasks if t.metadata["root_cause"]["operator"] == "bool_swap")
    rc, _, raw, fixed = _truth(b)
    n = rc["line"]
    text = f"`{rc['function']}` line {n}, {n + 1}, {n + 2}, {n + 3}: `{raw.strip()}` -> `{fixed.strip()}`"
    assert v3_lines(text) == {n, n + 1, n + 2, n + 3}
    assert _both(b, text) == (0, 0)
    tokens = f"`{rc['function']}` line {n - 1}, {n}, {n + 1}, {n + 2}: `{rc['mutated']}` -> `{rc['original']}`"
    assert RubricJudgeV2().judge(b, tokens, "").criteria["root_cause_identified"]   # v2 read "16, 17" only
    assert _both(b, tokens) == (0, 0)


def test_quote_and_line_parsing():
    assert v3_quotes("the function's `a < b` isn't 'x' or \"y\"; `if c != '(':` ok") == \
        ["a < b", "x", "y", "if c != '(':"]
    assert v3_quotes("`` and ` unclosed\n`") == [" and "]         # the 2nd backtick opens
    assert v3_lines("lines 3-5, 9 and 12; solution.py:40; line 7 to 8") == {3, 4, 5, 9, 12, 40, 7, 8}
    assert v3_lines("baseline 3, pipeline 4, line17") == set()
    for text in ("the function's `a < b` isn't 'x' or \"y\"; `if c != '(':` ok", "`` and ` unclosed\n`",
                 "it's `x` and 'y'z' and \"w\""):
        assert jc._quoted(text) == v3_quotes(text), text
    for text in ("lines 3-5, 9 and 12; solution.py:40; line 7 to 8", "Lines 15, 17, 19, 21 and 23",
                 "line 5 to fix, lines 2 & 4", "line 3rd"):
        assert jc._lines(text) == v3_lines(text), text


def test_rule_and_judge_agree_on_every_embedded_item(suite_tasks, by_id):
    items = jc.embedded_items(suite_tasks, seed=0, max_items=None)
    assert {i.gold for i in items} == {0, 1}
    kinds = {i.kind for i in items}
    assert {"expression", "fixed_only", "verbatim_line", "token_shotgun", "candidates", "wrong_words"} <= kinds
    row, labels = jc.calibrate(RubricJudge(), items, by_id, gold_source="embedded", n_boot=200)
    assert labels == [i.gold for i in items] and row["kappa"] == 1.0 and row["status"] == "ok"
    by_kind = {k: {i.gold for i in items if i.kind == k} for k in kinds}
    assert by_kind["expression"] == {1} and by_kind["expert"] == {1}
    for k in ("verbatim_line", "token_shotgun", "candidates", "wrong_words", "wrong_function", "shotgun",
              "keyword_bait", "vague", "located_only", "wrong_token_only"):
        assert by_kind[k] == {0}, k


def test_judge_versions_stay_selectable():
    assert make_judge({"kind": "rubric"}).name == "rubric-v3" == make_judge().name
    assert make_judge({"kind": "rubric-v3"}).name == "rubric-v3"
    assert isinstance(make_judge({"kind": "rubric-v2"}), RubricJudgeV2)
    assert isinstance(make_judge({"kind": "rubric-v1"}), KeywordRubricJudge)
    with pytest.raises(ValueError, match="rubric-v2"):
        make_judge({"kind": "rubric-v4"})


def test_v3_score_and_rationale(suite_tasks):
    b = suite_tasks[0]
    rc, _, raw, fixed = _truth(b)
    good = RubricJudge().judge(b, f"`{rc['function']}` line {rc['line']}: `{raw.strip()}` should be "
                                  f"`{fixed.strip()}`.", b.metadata["fix_diff"], blast_score=1.0)
    assert good.score == 1.0 and good.criteria["no_wrong_claim"] and good.criteria["focused"]
    hedge = RubricJudge().judge(b, f"`{rc['function']}` line {rc['line']}: off-by-one or the arguments are "
                                   f"swapped", b.metadata["fix_diff"], blast_score=1.0)
    assert hedge.criteria["no_wrong_claim"] is False and "no_wrong_claim" in hedge.rationale
    assert hedge.score == pytest.approx(0.5 * 2 / 3 + 0.5, abs=1e-4)   # function + location, no cause


def test_a_huge_explanation_is_a_shotgun_and_cheap_to_judge(suite_tasks):
    import time

    b = suite_tasks[0]
    rc, _, raw, fixed = _truth(b)
    good = f"`{rc['function']}` line {rc['line']}: `{raw.strip()}` should be `{fixed.strip()}`."
    assert _both(b, good) == (1, 1)
    assert _both(b, good + " " * 4000) == (0, 0)
    flood = good + " ".join(f"`{i}` line {i}," for i in range(50_000))
    t0 = time.monotonic()
    assert _both(b, flood) == (0, 0)
    assert time.monotonic() - t0 < 2.0


def test_random_explanations_rule_and_judge_agree_and_hedges_never_pay(suite_tasks):
    """Seeded fuzz: explanations assembled from fragments of the buggy, fixed and candidate lines,
    tokens, line numbers, quote styles and operator phrases. The two implementations agree on
    every one, and none that hedges between the recorded fix and another candidate is credited."""
    import random

    from sandboxes.humaneval.operators import all_edits

    rng = random.Random(7)
    phrases = ["off-by-one", "the arguments are swapped", "drop the `not`", "a missing `not`", "uses", "and"]
    credited = 0
    for b in suite_tasks:
        rc, lines, raw, fixed = _truth(b)
        src = b.files["solution.py"]
        cands = [e.apply(src).splitlines()[e.line - 1] for e in all_edits(src)]
        alts = [c.strip() for c in cands if c.strip() != fixed.strip()]
        pool = [raw.strip(), fixed.strip(), *alts[:20], *(l.strip() for l in lines if l.strip())]

        def frag():
            s = rng.choice(pool)
            i = rng.randrange(len(s))
            return s[i:i + rng.randint(1, 25)].strip() or s

        def quote(s):
            return rng.choice(["`{}`", "'{}'", '"{}"', "{}"]).format(s)

        for _ in range(300):
            parts = [rng.choice([rc["function"], f"`{rc['function']}`", "the function", f"helper_{rc['function']}"])]
            parts += [f"line {rng.choice([rc['line'], rc['line'], rc['line'] + 1, rng.randint(1, 40)])}"
                      for _ in range(rng.choice([0, 1, 1, 1, 2, 3]))]
            parts += [quote(frag()) for _ in range(rng.randint(0, 5))]
            if rng.random() < 0.5:
                parts += [quote(raw.strip()), rng.choice(["should be", "->", "instead of", ","]), quote(fixed.strip())]
            hedge = rng.random() < 0.3 and alts
            if hedge:
                parts += ["or", quote(rng.choice(alts))]
            parts += [rng.choice(phrases)] if rng.random() < 0.2 else []
            rng.shuffle(parts)
            text = " ".join(parts)
            gold, judged = _both(b, text)
            assert gold == judged, (b.task_id, text)
            credited += gold
            if hedge and gold:
                # a credited hedge is one the rule cannot see: the alternative unquoted, or code the
                # buggy file already holds
                alt_quoted = [a for a in alts if f"`{a}`" in text or f"'{a}'" in text or f'"{a}"' in text]
                assert all(any(a.replace(" ", "") in l.replace(" ", "") for l in lines) for a in alt_quoted), text
    assert credited > 50             # the fuzz reaches credited explanations too


def test_an_llm_judges_half_credit_is_not_identified():
    """The LLM rubric's root_cause 0.5 means "located, cause vague": the gold rule's 0."""
    from sandboxes.verifiers.judge import JudgeResult

    assert [jc.judge_label(JudgeResult(0.5, "", {"root_cause": x, "maintainability": 1.0}))
            for x in (0.0, 0.5, 0.75, 1.0)] == [0, 0, 1, 1]
