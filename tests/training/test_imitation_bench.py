"""bench/imitation.py's episode reading: attempts are told from undos, and the summary counts
what the checkpoint loses against the demonstrator (hand-written episodes)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.training

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def imitation():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("imitation_bench", BENCH / "imitation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def episode(*calls):
    msgs = [{"role": "user", "content": "fix it"}]
    for name, args in calls:
        msgs.append({"role": "assistant", "content": "",
                     "tool_calls": [{"function": {"name": name, "arguments": json.dumps(args)}}]})
        msgs.append({"role": "tool", "content": "..."})
    return msgs


LOC = ("localize", {"top": 10})
P = lambda line: ("propose_edits", {"path": "solution.py", "line": line})          # noqa: E731
A = lambda line, i: ("apply_edit", {"path": "solution.py", "line": line, "index": i})   # noqa: E731
T = ("run_tests", {})
S = ("submit", {"explanation": "x"})

# demonstrator: propose 17, 18, try 18/0 (fails, undone by 18/2), then 17/0, which passes
DEMO = episode(LOC, P(17), P(18), A(18, 0), T, P(18), A(18, 2), A(17, 0), T, S)
# checkpoint: proposes 17, 19, 18, tries 17/1 (fails, undone), then gives up
POLICY = episode(LOC, P(17), P(19), P(18), A(17, 1), T, P(17), A(17, 4), S)


def test_shape_tells_attempts_from_undos(imitation):
    s = imitation.shape(DEMO)
    assert s["proposals"] == [17, 18]                  # the undo's P(18) is not one
    assert s["attempts"] == [(18, 0), (17, 0)]          # the undo A(18, 2) is not an attempt
    assert s["proposals_before_attempt"] == 2
    p = imitation.shape(POLICY)
    assert p["attempts"] == [(17, 1)] and p["proposals_before_attempt"] == 3 and not p["gave_up"]
    assert imitation.shape(episode(LOC, P(3), S))["gave_up"]


def test_compare_counts_the_lost_tasks_and_skips_infra(imitation):
    demo = [{"task_id": "a", "passed": True, "infra": False, "messages": DEMO},
            {"task_id": "b", "passed": True, "infra": False, "messages": DEMO},
            {"task_id": "c", "passed": False, "infra": True, "messages": []}]
    policy = [{"task_id": "a", "passed": False, "infra": False, "messages": POLICY},
              {"task_id": "b", "passed": True, "infra": False, "messages": DEMO},
              {"task_id": "c", "passed": True, "infra": False, "messages": DEMO}]
    r = imitation.compare(demo, policy)
    assert r["n"] == 2                                   # the infra failure is never scored
    assert r["demonstrator_pass"] == 1.0 and r["policy_pass"] == 0.5
    assert r["demo_only"] == 1 and r["policy_only"] == 0
    assert r["same_first_attempt"] == 0.5 and r["same_proposals"] == 0.5
    assert r["lost_other_first"] == 1 and r["lost_other_first_line"] == 1 and r["lost_more_proposals"] == 1


def test_decision_kinds(imitation):
    names = [n for n, _ in [LOC, P(17), P(18), A(18, 0), T, P(18), A(18, 2), A(17, 0), T, S]]
    kinds = [imitation.decision(n, names[:i]) for i, n in enumerate(names)]
    assert kinds == ["localize", "list", "list", "attempt", "run_tests", "undo", "undo", "attempt", "run_tests",
                     "submit"]
