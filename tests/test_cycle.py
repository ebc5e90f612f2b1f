"""The improvement cycle's settings, schedule and sensor wiring, without running episodes (the
e2e test in test_e2e.py runs whole cycles)."""
import pytest

pytestmark = pytest.mark.promotion


def test_settings_refuse_nonsense_with_a_fix(tmp_path, monkeypatch):
    from ratchet.cycle import CycleSettings

    for bad, msg in (({"cron": "weekly"}, "5-field cron"), ({"candidate": "expert"}, "policy id"),
                     ({"seeds": ["3"]}, "subset of the holdout seeds"), ({"tenant": "a b"}, "letters"),
                     ({"eval_task_limit": 0}, ">= 1"), ({"cadence": "x"}, "unknown cycle setting")):
        with pytest.raises(ValueError, match=msg):
            CycleSettings.from_dict(bad)
    (tmp_path / "cycle.yaml").write_text("tenant: globex\nseeds: [0, 1]\ncron: '0 4 * * 2'\n")
    monkeypatch.delenv("RATCHET_CYCLE_CRON", raising=False)
    s = CycleSettings.load(tmp_path)
    assert (s.tenant, s.seeds, s.cron, s.trains) == ("globex", ("0", "1"), "0 4 * * 2", True)
    monkeypatch.setenv("RATCHET_CYCLE_CRON", "30 2 * * *")
    assert CycleSettings.load(tmp_path).cron == "30 2 * * *"
    assert CycleSettings.load(tmp_path / "nowhere").cron == "30 2 * * *"


def test_schedule_adds_one_candidate_per_tick(home):
    from datetime import UTC, datetime

    import dagster as dg

    from assets.training import CANDIDATES
    from pipelines.cycle import improvement_schedule

    (home.root / "cycle.yaml").write_text("tenant: initech\n")
    with dg.DagsterInstance.get() as instance:      # a schedule context needs a persistent instance
        when = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)
        reqs = [improvement_schedule(dg.build_schedule_context(instance=instance, scheduled_execution_time=t))
                for t in (when, when, datetime(2026, 11, 30, 3, 0, tzinfo=UTC))]
        assert reqs[0].run_key == reqs[1].run_key != reqs[2].run_key
        assert reqs[0].job_name == "improvement_job" and reqs[0].partition_key == "initech:cycle-20261123-0300"
        assert instance.get_dynamic_partitions(CANDIDATES.name) == ["initech:cycle-20261123-0300",
                                                                    "initech:cycle-20261130-0300"]
        (home.root / "cycle.yaml").write_text("candidate: harness:sbfl\nlifecycle: true\n")
        cfg = improvement_schedule(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))
        assert cfg.job_name == "lifecycle_job" and cfg.partition_key is None   # nothing to train


def test_runs_outside_a_cycle_request_nothing(home):
    import dagster as dg

    from pipelines.cycle import followups

    with dg.DagsterInstance.ephemeral() as instance:
        run = instance.create_run_for_job(dg.JobDefinition(graph_def=dg.GraphDefinition(name="lifecycle_job")),
                                          tags={"ratchet/trigger": "demo"})
        assert followups(instance, run) == []


def test_policy_registry_keeps_paths_relative_to_the_home(tmp_path):
    from ratchet.cycle import policy_kwargs, register_policy

    ckpt = tmp_path / "checkpoints" / "acme_c1" / "rl"
    ckpt.mkdir(parents=True)
    register_policy(tmp_path, "embedded:ratchet-acme-c1@2", {"path": str(ckpt), "sampling": {"max_tokens": 8}})
    assert "checkpoints/acme_c1/rl" in (tmp_path / "policies.json").read_text()
    assert str(tmp_path) not in (tmp_path / "policies.json").read_text()
    assert policy_kwargs(tmp_path, "embedded:ratchet-acme-c1@2")["path"] == str(ckpt)
    assert policy_kwargs(tmp_path, "harness:sbfl") == {}
    with pytest.raises(KeyError, match="not in"):
        policy_kwargs(tmp_path, "embedded:never@1")


def test_a_cycle_candidate_maps_to_its_checkpoint_row():
    from ratchet.cycle import checkpoint_policy_id
    from ratchet.promotion.evidence import checkpoint_ids

    pid = checkpoint_policy_id("ratchet-acme-cycle-20261123-0300", 2)
    assert pid == "embedded:ratchet-acme-cycle-20261123-0300@2"
    assert "ratchet-acme-cycle-20261123-0300/2" in checkpoint_ids(pid, "2")


def test_a_trained_cycle_evaluates_its_references_after_the_candidate(home):
    """champion -> candidate -> references (the cycle's SFT checkpoint and the prompted baseline,
    tagged as references so no promotion is requested for them) -> reports; a configuration-change
    candidate has no references."""
    import dagster as dg

    from pipelines.cycle import followups
    from ratchet.cycle import CycleSettings, policy_kwargs, write_pointer

    cycle, cand = "acme:cycle-20261123-0300", "embedded:ratchet-acme-c@2"
    base_dir, sft_dir = home.checkpoints / "base-0123456789abcdef", home.checkpoints / "sft-dir"
    write_pointer(home.checkpoints, {"path": str(base_dir)}, "base")
    write_pointer(home.checkpoints, {"path": str(sft_dir), "model_name": "ratchet-acme-c", "version": "1",
                                     "checkpoint_id": "ratchet-acme-c/1"}, cycle, "sft")
    settings = CycleSettings(seeds=("0", "1"))
    job = dg.JobDefinition(graph_def=dg.GraphDefinition(name="holdout_eval_job"))

    def done(phase: str, source: str = "train", n: int = 2, **extra):
        tags = {"ratchet/cycle": cycle, "ratchet/stage": "holdout_eval", "ratchet/cycle_phase": phase,
                "ratchet/cycle_evals": str(n), "ratchet/candidate": cand, "ratchet/champion": "harness:sbfl",
                "ratchet/candidate_source": source, **extra}
        return instance.create_run_for_job(job, tags=tags, status=dg.DagsterRunStatus.SUCCESS)

    with dg.DagsterInstance.ephemeral() as instance:
        done("candidate")
        assert followups(instance, done("candidate"), settings)[0].tags["ratchet/cycle_phase"] == "reference"
        refs = followups(instance, done("candidate"), settings)
        pids = sorted({r.partition_key.keys_by_dimension["policy"] for r in refs})
        assert pids == ["embedded:base_policy@0123456789ab", "embedded:ratchet-acme-c@1"]
        assert len(refs) == 4 and {r.tags["ratchet/role"] for r in refs} == {"reference"}
        assert {r.tags["ratchet/cycle_evals"] for r in refs} == {"4"}          # 2 references x 2 seeds
        assert policy_kwargs(home.root, "embedded:ratchet-acme-c@1")["path"] == str(sft_dir)
        last = None
        for _ in range(3):
            last = done("reference", n=4, **{"ratchet/role": "reference"})
            assert followups(instance, last, settings) == []                    # the phase is not complete
        report = followups(instance, done("reference", n=4, **{"ratchet/role": "reference"}), settings)
        assert [r.job_name for r in report] == ["evaluation_report_job"]
        # no references configured, or a configuration-change candidate: straight to the reports
        assert [r.job_name for r in followups(instance, done("candidate"), CycleSettings(references=[]))] == [
            "evaluation_report_job"]
        assert [r.job_name for r in followups(instance, done("candidate", "harness:sbfl-top3"), settings)] == [
            "evaluation_report_job"]
    with pytest.raises(ValueError, match="references"):
        CycleSettings.from_dict({"references": ["rl"]})
