"""The whole graph in-process with a tiny configuration: what `make demo` runs, end to end."""
import json

import pytest

pytestmark = pytest.mark.e2e


def test_demo_lifecycle_runs_and_reruns_idempotently(home, capsys):
    from pipelines.demo import run_demo

    from pipelines.demo import DEMO_POLICIES
    from ratchet.warehouse import Warehouse

    assert run_demo(home, quick=True, tasks=4, eval_tasks=2) == 0
    out = capsys.readouterr()
    first = json.loads(out.out.strip().splitlines()[-1])
    assert set(first["pass_rates"]) == set(DEMO_POLICIES)               # every demo policy evaluated...
    assert all("/ 2 tasks" in d for d in first["pass_rates"].values())   # ...on the 2 holdout tasks asked for
    assert "| task success (majority of seeds, 95% CI) |" in out.err     # the scorecard is printed
    assert (home.root / "scorecard.md").exists()
    episodes = Warehouse(home.warehouse).store().count("eval_episodes")
    assert episodes == len(DEMO_POLICIES) * 3 * 2
    assert first["demo"] == "ok" and first["contamination_passed"] is True
    assert first["tasks"] > 0 and set(first["splits"]) == {"train", "val", "holdout"}
    assert first["trajectories"] >= 4 + 6  # agent logs + one of every foreign format
    assert {"atif", "mini_swe_agent", "swe_agent", "swebench_prediction", "openai_chat"} <= set(first["by_format"])
    assert first["quarantine"]  # the landing folder carries bad lines on purpose
    assert run_demo(home, quick=True, tasks=4, eval_tasks=2) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert Warehouse(home.warehouse).store().count("eval_episodes") == episodes  # resumed: nothing re-run
    assert second["pass_rates"] == first["pass_rates"]
    assert second["trajectories"] == first["trajectories"]  # nothing new: content-addressed ids
    assert second["holdout_sha256"] == first["holdout_sha256"]  # the holdout is locked
    assert second["quarantine"] == first["quarantine"]
