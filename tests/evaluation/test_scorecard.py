"""Scorecard Markdown (the reference scorecard's rows, CIs, denominators, economics) and the PNG."""
import pytest

from ratchet.evaluation import economics as ec
from ratchet.evaluation.scorecard import scorecard_markdown, scorecard_png, slice_markdown
from ratchet.evaluation.summary import summary_rows
from tests.evaluation.test_summary import BASE, CAND

pytestmark = pytest.mark.evaluation


def test_markdown_has_spec_rows_denominators_and_not_computable(tmp_path):
    summary = summary_rows(CAND + BASE, baseline_policy_id="base", n_boot=300)
    eco = [ec.economics_row(ec.PolicyCost("base", "", 12, 9, 0.9), ec.PolicyCost("base", "", 12, 9, 0.9)),
           ec.economics_row(ec.PolicyCost("rl", "", 12, 0, 0.5, training_usd=3.0), ec.PolicyCost("base", "", 12, 9, 0.9))]
    md = scorecard_markdown(summary, eco, order=["base", "rl"])
    lines = md.splitlines()
    assert lines[2].startswith("|  | base | rl |")
    for row in ("task success", "vs baseline", "infra failures", "seed spread", "hard gate violations",
                "human edits needed", "latency p50 / p95", "mean tool turns", "variable cost / accepted",
                "training investment", "sample-amortised / accepted", "at 10,000 accepted runs"):
        assert f"| {row}" in md, row
    assert "2 / 3 tasks; 1 task infra-failed, excluded" in md and "3 / 4 tasks" in md
    assert "4 / 12 runs" in md                         # rl's infra failures, beside the rate
    assert "not computable" in md and "$0.00" not in md
    assert "4 tasks x 3 seeds" in md
    sl = slice_markdown(summary, "family")
    assert "| arithmetic |" in sl and "| comparison |" in sl
    png = scorecard_png(summary, tmp_path / "sc.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
