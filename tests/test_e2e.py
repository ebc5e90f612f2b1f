"""The whole graph in-process with a tiny configuration: what `make demo` runs, end to end."""
import json

import pytest

pytestmark = pytest.mark.e2e


def test_demo_lifecycle_runs_and_reruns_idempotently(home, capsys):
    from pipelines.demo import run_demo

    assert run_demo(home, quick=True, tasks=4) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["demo"] == "ok" and first["contamination_passed"] is True
    assert first["tasks"] > 0 and set(first["splits"]) == {"train", "val", "holdout"}
    assert first["trajectories"] >= 4 + 6  # agent logs + one of every foreign format
    assert {"atif", "mini_swe_agent", "swe_agent", "swebench_prediction", "openai_chat"} <= set(first["by_format"])
    assert first["quarantine"]  # the landing folder carries bad lines on purpose
    assert run_demo(home, quick=True, tasks=4) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["trajectories"] == first["trajectories"]  # nothing new: content-addressed ids
    assert second["holdout_sha256"] == first["holdout_sha256"]  # the holdout is locked
    assert second["quarantine"] == first["quarantine"]
