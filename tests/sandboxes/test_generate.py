"""The landing-folder generator: real agent runs in the sandbox, written as contract JSONL that
ingests cleanly (malformed lines quarantined with the expected codes), with tenants, consent
cases, duplicates and a consent registry the governance loader reads."""
import json
from pathlib import Path

import pytest

from ratchet.contract import RecordError, normalise
from sandboxes.generate import count_tokens, generate, usage
from sandboxes.humaneval import build_suite
from sandboxes.runtime import SandboxUnavailable

pytestmark = pytest.mark.governance


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from sandboxes.runtime import LocalRuntime
    root = tmp_path_factory.mktemp("gen")
    try:
        LocalRuntime(root / "probe")
    except SandboxUnavailable as e:
        pytest.skip(f"sandbox unavailable: {e}")
    suite = build_suite(seed=0, limit=8, per_problem=2, cache_dir=root / "suite")
    summary = generate(root / "landing", n_tasks=10, seed=0, suite=suite, workers=2,
                       sandbox_root=root / "sandbox")
    return root, summary


def _lines(out: Path):
    for f in sorted(out.rglob("*.jsonl")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            yield f.relative_to(out).as_posix(), n, line


def test_every_wellformed_line_normalises_and_malformed_fail_with_codes(generated):
    root, s = generated
    bad = {(d["file"], d["line"]): d["expected_code"] for d in s["defects"] if "expected_code" in d}
    assert set(bad.values()) == {"truncated_json", "orphan_tool_result", "wrong_type"}
    seen_bad, good = {}, 0
    for f, n, line in _lines(root / "landing"):
        try:
            row = normalise(json.loads(line))
            good += 1
            assert row["tenant_id"] and row["task_id"] and row["environment_digest"].startswith("sha256:")
            assert row["n_tool_calls"] > 0 and row["prompt_tokens"] > row["completion_tokens"] > 0
        except (RecordError, json.JSONDecodeError) as e:
            seen_bad[(f, n)] = getattr(e, "code", "truncated_json")
    assert seen_bad == bad
    assert good == s["lines"] - len(bad) and good >= s["trajectories"]


def test_real_ingest_quarantines_only_the_malformed(generated, wh):
    from ratchet.ingest import ingest
    root, s = generated
    summary = ingest([root / "landing"], wh)
    expected = {}
    for d in s["defects"]:
        if "expected_code" in d:
            expected[d["expected_code"]] = expected.get(d["expected_code"], 0) + 1
    assert summary.quarantine_reasons == expected
    assert summary.duplicates >= 2       # the exact duplicate lines
    assert summary.read == s["lines"]


def test_tenants_consent_cases_and_registry(generated):
    from ratchet.governance.consent import load_grants
    root, s = generated
    assert len(s["by_tenant"]) >= 2 and set(s["by_consent"]) == {"valid", "expired", "revoked", "missing", "unknown"}
    assert Path(s["registry"]) == root / "consent_registry.yaml"
    grants = load_grants(s["registry"])
    recs = [json.loads(l) for _, _, l in _lines(root / "landing") if l.endswith("}")]
    recs = [r for r in recs if isinstance(r.get("outcome", {}).get("tests_passed"), (bool, type(None)))]
    referenced = {r["consent_id"] for r in recs if r.get("consent_id")}
    unknown = referenced - set(grants)
    assert unknown and all(c.endswith("-2026-13") for c in unknown)          # the unknown id
    assert set(grants) == referenced - unknown                              # exactly the grants referenced
    assert any(r.get("consent_id") is None for r in recs)                   # missing consent
    assert any(g.revoked_at is not None for g in grants.values())
    for g in grants.values():
        assert g.retention_days == 90 and {"execute", "train", "eval"} <= set(g.scopes)
        assert all(r["tenant_id"] == g.tenant_id for r in recs if r.get("consent_id") == g.consent_id)


def test_records_carry_outcome_usage_approvals_and_duplicates(generated):
    root, s = generated
    recs = [json.loads(l) for _, _, l in _lines(root / "landing") if l.endswith("}")]
    ok = [r for r in recs if r["outcome"]["tests_passed"] in (True, False)]
    assert any(r["outcome"]["accepted"] for r in ok) and any(not r["outcome"]["accepted"] for r in ok)
    for r in ok:
        if r["outcome"]["accepted"]:
            assert r["outcome"]["tests_passed"] and r["extra"]["reward"]["status"] == "scored"
        assert r["usage"]["cost_usd"] > 0 and r["usage"]["latency_s"] > 0
        assert r["approvals"] and r["approvals"][-1]["approver"].startswith("lead@")
        assert r["environment"]["id"].startswith("env://") and r["agent_id"]
    assert s["reruns"] >= 1
    ids = [r["trajectory_id"] for r in ok]
    assert len(ids) > len(set(ids))       # exact and whitespace-only re-logs share the id
    assert {d["kind"] for d in s["defects"]} >= {"exact_duplicate", "whitespace_copy"}


def test_token_counts_and_cost_are_deterministic():
    msgs = [{"role": "system", "content": "a b"}, {"role": "user", "content": "c d e"},
            {"role": "assistant", "content": "f", "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "x", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "g h"}, {"role": "assistant", "content": "i j"}]
    assert count_tokens("  a  b\nc ") == 3
    prompt, completion, cost = usage(msgs, 0.2)
    assert (prompt, completion) == (5 + 11, 4 + 2)
    assert cost == pytest.approx(16 * 3e-6 + 6 * 15e-6 + 1e-4)
