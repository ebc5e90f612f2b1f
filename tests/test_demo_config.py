"""The demo's candidate recipes are valid run config for the improvement job, for either base: a
misspelt field would otherwise surface only minutes into a demo run."""
import dagster as dg
import pytest

from pipelines.demo import BASES, candidate_ops


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("base", BASES)
def test_candidate_ops_are_valid_run_config(base, quick):
    from pipelines.definitions import defs

    job = defs.resolve_job_def("improvement_job")
    ops = candidate_ops(quick, base)
    dg.validate_run_config(job, {"ops": ops})
    spec = ops.get("base_policy", {}).get("config", {}).get("spec", "embedded")
    assert spec == base


def test_an_unknown_base_is_refused(tmp_path):
    from pipelines.demo import run_demo

    with pytest.raises(ValueError, match="base must be one of"):
        run_demo(None, base="gpt-9")
