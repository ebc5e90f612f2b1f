"""Verifiers: R_tests, R_hygiene (secrets, forbidden paths, blast radius), R_judge, composition."""
from __future__ import annotations

import pytest

from sandboxes.bundle import TaskBundle
from sandboxes.humaneval import build_suite
from sandboxes.verifiers import (JudgeResult, Reward, RewardWeights, RubricJudge, apply_diff,
                                 blast_radius, cohen_kappa, compose_reward, make_diff, r_hygiene,
                                 r_tests, scan_diff, touched_paths)

pytestmark = pytest.mark.evaluation


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> TaskBundle:
    suite = build_suite(seed=0, limit=1, per_problem=3, cache_dir=tmp_path_factory.mktemp("c"))
    return next(t for t in suite.tasks if t.metadata["root_cause"]["family"] != "variable")


def _fixed(task):
    return apply_diff(task.files, task.metadata["fix_diff"])


def _all_pass(task):
    return {t: "passed" for t in (*task.fail_to_pass, *task.pass_to_pass)}


def _explain(task):
    rc = task.metadata["root_cause"]
    raw = task.files["solution.py"].splitlines()[rc["line"] - 1]
    fixed = raw[:rc["col"]] + rc["original"] + raw[rc["end_col"]:]
    return (f"`{rc['function']}` is wrong on line {rc['line']}: `{raw.strip()}` "
            f"should be `{fixed.strip()}` ({rc['family']} bug).")


def test_r_tests():
    f2p, p2p = ("a::t1",), ("a::t2", "a::t3")
    assert r_tests({"a::t1": "passed", "a::t2": True, "a::t3": "passed"}, f2p, p2p).score == 1.0
    assert r_tests({"a::t1": "failed", "a::t2": True, "a::t3": "passed"}, f2p, p2p).score == 0.0
    broke = r_tests({"a::t1": "passed", "a::t2": "passed"}, f2p, p2p)   # a regression test vanished
    assert broke.score == 0.0 and broke.missing == ("a::t3",)
    assert r_tests({"a::t1": "skipped", "a::t2": 1 == 1, "a::t3": "passed"}, f2p, p2p).score == 0.0


def test_diff_roundtrip(task):
    fixed = _fixed(task)
    assert fixed["solution.py"] != task.files["solution.py"]
    diff = make_diff(task.files, fixed)
    assert touched_paths(diff) == ["solution.py"]
    assert apply_diff(task.files, diff) == fixed


@pytest.mark.security
def test_planted_aws_key_is_caught(task):
    diff = ("--- a/solution.py\n+++ b/solution.py\n@@ -1,1 +1,2 @@\n"
            f"+AWS_ACCESS_KEY_ID = 'AKIAIOSFODNN7EXAMPLE'\n {task.files['solution.py'].splitlines()[0]}\n")
    found = scan_diff(diff)
    assert [(f.file, f.type) for f in found] == [("solution.py", "AWS Access Key")]
    res = r_hygiene(diff, task)
    assert res.gate_violation and res.score == 0.0
    reward = compose_reward(task, outcomes=_all_pass(task), diff=diff, explanation=_explain(task))
    assert reward.status == "gate_violation" and reward.value == 0.0
    assert scan_diff(make_diff(task.files, _fixed(task))) == []


@pytest.mark.security
def test_touching_the_test_file_is_forbidden(task):
    tests = task.files["test_solution.py"]
    cheat = {**task.files, "test_solution.py": tests.replace("assert ", "assert True or ", 1)}
    res = r_hygiene(make_diff(task.files, cheat), task)
    assert res.forbidden == ("test_solution.py",) and res.score == 0.0
    reward = compose_reward(task, outcomes=_all_pass(task), diff=make_diff(task.files, cheat))
    assert reward.value == 0.0 and reward.components["tests"] == 1.0
    soft = compose_reward(task, outcomes=_all_pass(task), diff=make_diff(task.files, cheat),
                          weights=RewardWeights(hard_gates=False))
    assert soft.status == "gate_violation" and 0 < soft.value < 0.8


def test_blast_radius_prefers_the_minimal_fix(task):
    fixed = _fixed(task)
    minimal = r_hygiene(make_diff(task.files, fixed), task)
    assert minimal.score == 1.0 and not minimal.gate_violation
    assert minimal.blast.statements == minimal.reference_blast.statements >= 1
    sprawl = dict(fixed)
    sprawl["solution.py"] += "\n\ndef helper(x):\n    y = x + 1\n    return y\n"
    sprawl["notes.txt"] = "reformatted everything\n"
    wide = r_hygiene(make_diff(task.files, sprawl), task)
    assert wide.score < 0.25 and wide.blast.statements > minimal.blast.statements
    # reformatting only (comments / blank lines) is not a semantic change
    cosmetic = {**fixed, "solution.py": fixed["solution.py"] + "\n# trailing note\n"}
    assert blast_radius(fixed, cosmetic).statements == 0
    broken = {**task.files, "solution.py": task.files["solution.py"] + "\ndef (:\n"}
    assert r_hygiene(make_diff(task.files, broken), task).score == 0.0


@pytest.mark.badinput
def test_malformed_or_stale_diff(task):
    assert r_hygiene("--- a/solution.py\n+++ b/solution.py\n@@ -1,2 +1,2 @@\n-nope\n+yes\n", task).score == 0.0
    assert r_hygiene("@@ garbage", task).score == 0.0
    assert r_hygiene("", task).score == 1.0        # no change: nothing unhygienic


def test_rubric_judge_scores_explanation_and_patch(task):
    judge = RubricJudge()
    diff = make_diff(task.files, _fixed(task))
    good = judge.judge(task, _explain(task), diff, blast_score=1.0)
    vague = judge.judge(task, "I changed some code until the tests passed.", diff, blast_score=1.0)
    assert good.score == 1.0 and good.label == 1 and "root cause 1.00" in good.rationale
    assert vague.score < good.score and "missed" in vague.rationale
    debris = dict(_fixed(task))
    debris["solution.py"] = debris["solution.py"].replace("\n    ", "\n    print('debug')  # TODO\n    ", 1)
    messy = judge.judge(task, _explain(task), make_diff(task.files, debris), blast_score=0.5)
    assert messy.score < good.score and messy.criteria["no_debris"] is False
    assert judge.judge(task, _explain(task), "", blast_score=1.0).score == 0.5   # no patch


def test_cohen_kappa():
    assert cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert cohen_kappa("abab", "abab") == 1.0
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
    assert cohen_kappa([1, 1], [1, 1]) == 1.0
    with pytest.raises(ValueError):
        cohen_kappa([1], [1, 0])


def test_compose_reward_weights_and_infra_failure(task):
    diff = make_diff(task.files, _fixed(task))
    full = compose_reward(task, outcomes=_all_pass(task), diff=diff, explanation=_explain(task))
    assert full.status == "scored" and full.value == pytest.approx(1.0)
    assert full.components == {"tests": 1.0, "hygiene": 1.0, "judge": 1.0}
    assert full.details["judge"]["name"] == "rubric-v3" and full.details["judge"]["criteria"]["root_cause_identified"]
    failing = {**_all_pass(task), task.fail_to_pass[0]: "failed"}
    part = compose_reward(task, outcomes=failing, diff=diff, explanation=_explain(task))
    # hygiene and judge grade a working fix only: a failing one earns nothing from them
    assert part.value == 0.0 and part.components == {"tests": 0.0, "hygiene": 1.0, "judge": 1.0}
    assert any("not paid" in r for r in part.reasons)
    w = RewardWeights(tests=1.0, hygiene=0.0, judge=0.0)
    assert compose_reward(task, outcomes=failing, diff=diff, weights=w).value == 0.0
    even = RewardWeights(tests=1.0, hygiene=1.0, judge=2.0)       # normalised by the total weight
    r = compose_reward(task, outcomes=_all_pass(task), diff=diff, explanation="", weights=even)
    assert r.value == pytest.approx((1.0 + r.components["hygiene"] + 2 * r.components["judge"]) / 4)
    assert 0.25 <= r.value < 1.0
    empty = compose_reward(task, outcomes=_all_pass(task), diff="", explanation=_explain(task))
    assert empty.value == 0.0 and "empty submission" in " ".join(empty.reasons)
    for infra in (compose_reward(task, outcomes=None, diff=diff),
                  compose_reward(task, outcomes=_all_pass(task), infra_error="sandbox OOM-killed")):
        assert infra.value is None and infra.status == "infra_failure" and infra.infra_failure
    with pytest.raises(ValueError):
        RewardWeights(tests=-1)


def test_pluggable_judge(task):
    class Always:
        name = "always-half"

        def judge(self, bundle, explanation, diff, *, blast_score=None):
            return JudgeResult(0.5, "constant")

    r = compose_reward(task, outcomes=_all_pass(task), diff=make_diff(task.files, _fixed(task)),
                       judge=Always())
    assert isinstance(r, Reward) and r.components["judge"] == 0.5
    assert r.value == pytest.approx(0.55 + 0.25 + 0.1) and r.details["judge"]["name"] == "always-half"
