"""Judge calibration: the gold rule, kappa of the older judges (keyword rubric-v1, token rubric-v2)
vs the rubric judge (rubric-v3), the human
label CSV, and the OpenAI-compatible judge against a tiny local HTTP server standing in for a
remote LLM API (nothing else can run here: no model, no network)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ratchet.evaluation import judge_calibration as jc
from sandboxes.verifiers.judge import (
    JudgeError,
    KeywordRubricJudge,
    OpenAIJudge,
    RubricJudge,
    RubricJudgeV2,
    make_judge,
)

pytestmark = pytest.mark.evaluation


@pytest.fixture(scope="module")
def bundles(suite_tasks):
    return {t.task_id: t for t in suite_tasks}


def test_gold_rule_by_hand(suite_tasks):
    b = next(t for t in suite_tasks if t.metadata["root_cause"]["operator"] == "bool_swap")
    rc = b.metadata["root_cause"]
    fn, n, mut, org = rc["function"], rc["line"], rc["mutated"].strip(), rc["original"].strip()
    assert jc.gold_root_cause(b, f"`{fn}` line {n}: `{mut}` should be `{org}`.") == 1
    assert jc.gold_root_cause(b, f"In {fn}, `{rc['line_text']}` should be `return {org}`.") == 1
    assert jc.gold_root_cause(b, f"In {fn}, `{rc['line_text']}` has the wrong `{mut}`.") == 0   # no fix stated
    assert jc.gold_root_cause(b, f"`{fn}` line {n + 2}: `{mut}` should be `{org}`.") == 0     # wrong line
    assert jc.gold_root_cause(b, f"`{fn}` line {n}.") == 0                                    # no cause
    assert jc.gold_root_cause(b, f"line {n}: `{mut}` should be `{org}`.") == 0                # no function
    assert jc.gold_root_cause(b, f"`{fn}` lines {n - 1} to {n + 1}: `{mut}` -> `{org}`") == 0  # shotgun
    assert jc.gold_root_cause(b, f"`{fn}` line {n}: `{mut}` -> `{org}`, off-by-one") == 0      # a wrong claim too
    assert jc.gold_root_cause(b, "Fixed the bug.") == 0
    no_truth = type("B", (), {"metadata": {}})()
    assert jc.gold_root_cause(no_truth, "anything") is None


def test_keyword_judge_drifts_and_the_rubric_judge_passes_the_gate(suite_tasks, bundles):
    items = jc.embedded_items(suite_tasks, seed=0)
    assert {i.gold for i in items} == {0, 1} and len({i.kind for i in items}) >= 15
    old, _ = jc.calibrate(KeywordRubricJudge(), items, bundles, gold_source="embedded", n_boot=300)
    v2, _ = jc.calibrate(RubricJudgeV2(), items, bundles, gold_source="embedded", n_boot=300)
    new, labels = jc.calibrate(RubricJudge(), items, bundles, gold_source="embedded", n_boot=300)
    assert old["status"] == "drift" and old["kappa"] < jc.WARN_BELOW
    assert "shotgun" in old["disagreements"]["by_kind"]          # any line number credited the location
    assert "token_shotgun" in v2["disagreements"]["by_kind"] and v2["kappa"] < new["kappa"]
    assert new["status"] == "ok" and new["kappa"] >= jc.BLOCK_BELOW and new["kappa_ci_lo"] <= new["kappa"]
    assert new["items"] == len(items) == len(labels)
    assert sum(new["confusion"].values()) == len(items)


def test_status_thresholds():
    assert jc.status(0.80) == "ok" and jc.status(0.7999) == "blocked" and jc.status(0.78) == "blocked"
    assert jc.status(0.7799) == "drift" and jc.status(None) == "no_labels"


def test_human_label_csv(tmp_path, suite_tasks, bundles):
    b = suite_tasks[0]
    rc = b.metadata["root_cause"]
    good = f"`{rc['function']}` line {rc['line']}: `{rc['mutated'].strip() or 'not'}` is wrong"
    p = tmp_path / "labels.csv"
    p.write_text("task_id,explanation,label,rater\n"
                 f"{b.task_id},\"{good}\",yes,ann\n{b.task_id},\"{good}\",1,bob\n{b.task_id},\"{good}\",0,cy\n"
                 f"{b.task_id},Fixed it.,no,ann\n"
                 f"{b.task_id},Tie here.,1,ann\n{b.task_id},Tie here.,0,bob\n"
                 f"{b.task_id},Bad label,maybe,ann\n")
    items, problems = jc.load_human_labels(p)
    assert sorted((i.explanation[:5], i.gold) for i in items) == [("Fixed", 0), (good[:5], 1)]
    assert len(problems) == 2 and any("tie" in x for x in problems) and any("maybe" in x for x in problems)
    row, _ = jc.calibrate(RubricJudge(), items, bundles, gold_source="human:labels.csv", n_boot=100)
    assert row["items"] == 2 and row["gold_source"] == "human:labels.csv"
    bad = tmp_path / "bad.csv"
    bad.write_text("task,explanation\nx,y\n")
    with pytest.raises(ValueError, match="missing column"):
        jc.load_human_labels(bad)


def test_a_judge_never_grades_its_own_items(bundles):
    tid = next(iter(bundles))
    for judge in (RubricJudge(), RubricJudgeV2()):
        items = [jc.Item(tid, "trajectory", "x", "", 0, source=judge.name)]
        with pytest.raises(ValueError, match="wrote itself"):
            jc.calibrate(judge, items, bundles, gold_source="t")


class StandIn(BaseHTTPRequestHandler):
    """Stands in for a remote OpenAI-compatible LLM API: a deterministic grader that reads the
    prompt it is sent (root cause = the explanation has a quoted token and a line number)."""
    requests: list = []
    reply: str | None = None

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        user = body["messages"][-1]["content"]
        expl = user.split("## Root-cause explanation\n", 1)[1]
        rc = 1.0 if ("`" in expl and "line" in expl) else 0.0
        content = StandIn.reply or json.dumps({"root_cause": rc, "maintainability": 1.0, "rationale": "stand-in"})
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def llm_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    StandIn.requests, StandIn.reply = [], None
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_openai_judge_protocol_and_calibration(llm_server, monkeypatch, suite_tasks, bundles):
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test")
    judge = make_judge({"kind": "openai", "base_url": llm_server, "model": "judge-m", "api_key_env": "TEST_JUDGE_KEY"})
    assert judge.name == "openai:judge-m"
    b = suite_tasks[0]
    r = judge.judge(b, "`f` line 3 is wrong", "--- a/x\n+++ b/x\n")
    assert r.score == 1.0 and r.criteria == {"root_cause": 1.0, "maintainability": 1.0}
    req = StandIn.requests[-1]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    assert req["body"]["model"] == "judge-m" and req["body"]["temperature"] == 0
    system = req["body"]["messages"][0]["content"]
    assert "root_cause" in system and "Rubric" in system          # prompt + rubric files were sent
    assert "--- a/x" in req["body"]["messages"][1]["content"]
    items = jc.embedded_items(suite_tasks[:2], seed=1)
    row, labels = jc.calibrate(judge, items, bundles, gold_source="embedded", n_boot=200)
    assert row["judge_id"] == "openai:judge-m" and row["items"] == len(items) == len(StandIn.requests) - 1
    assert row["status"] in ("ok", "blocked", "drift") and row["kappa"] is not None


def test_openai_judge_failures_raise_never_score(llm_server, suite_tasks):
    b = suite_tasks[0]
    StandIn.reply = "I think it is fine."
    with pytest.raises(JudgeError, match="without a valid verdict"):
        OpenAIJudge(llm_server, "m").judge(b, "x", "y")
    StandIn.reply = json.dumps({"root_cause": 3, "maintainability": 1})
    with pytest.raises(JudgeError, match="out of 0..1"):
        OpenAIJudge(llm_server, "m").judge(b, "x", "y")
    with pytest.raises(JudgeError):
        OpenAIJudge("http://127.0.0.1:9/v1", "m", timeout_s=2).judge(b, "x", "y")


def test_a_judge_outage_is_an_infra_failure_of_the_episode(suite_tasks):
    from ratchet.evaluation.episodes import run_policy_episode

    row = run_policy_episode("scripted:expert", "", suite_tasks[0], 0,
                             judge=OpenAIJudge("http://127.0.0.1:9/v1", "m", timeout_s=2))
    assert row["outcome"] == "infra_failure" and row["reward"] is None


def test_items_from_logged_agent_runs(suite_tasks, bundles):
    import json as _json

    from sandboxes.agents import run_agent

    b = suite_tasks[0]
    runs = [run_agent(a, b, seed=0) for a in ("expert", "noisy")]
    recs = [{"task_id": b.task_id, "messages": _json.dumps(r.messages), "patch": r.patch, "agent_id": r.agent_id}
            for r in runs] + [{"task_id": "unknown-task", "messages": "[]", "patch": "", "agent_id": "x"}]
    items = jc.transcript_items(recs, bundles)
    assert [i.source for i in items] == [r.agent_id for r in runs] and all(i.kind == "transcript" for i in items)
    assert items[0].explanation == runs[0].explanation and items[1].explanation == runs[1].explanation
    # the expert fixed this one with an equivalent edit ("insert `not`") instead of the planted
    # token's fix: gold requires the recorded fix stated, and "insert `not`" names another edit
    rc = b.metadata["root_cause"]
    assert all(i.gold == jc.gold_root_cause(b, i.explanation) for i in items)
    assert (f"`{rc['mutated'].strip()}`" in items[0].explanation) == bool(items[0].gold)
