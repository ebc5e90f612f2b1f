"""rl_checkpoint on the VeRL backend, with a stand-in for VeRL (no GPU here): a fake entry point
(RATCHET_VERL_ENTRYPOINT) that prints VeRL's metric lines and writes a checkpoint in VeRL's FSDP
layout, and a fake `verl.model_merger` on PYTHONPATH. The real merge of that layout is tested in
test_verl_merge.py, the overrides against VeRL's config in test_verl_launch.py."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.training.test_training_assets import warehouse_home  # noqa: F401 - the fixture

pytestmark = pytest.mark.training

FAKE_MAIN_PPO = textwrap.dedent(r"""
    import json, os, subprocess, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    root = args["trainer.default_local_dir"].strip("'")
    if os.environ.get("FAKE_VERL_PIDS"):     # the cancel test: a grandchild under setsid, out of the process group
        d = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open(os.environ["FAKE_VERL_PIDS"], "w").write(json.dumps([os.getpid(), d.pid]))
        time.sleep(600)
    for step in (1, 2):
        print(f"step:{step} - actor/pg_loss:{0.5 / step} - critic/score/mean:{step / 4}", flush=True)
        if step == 1 and os.environ.get("FAKE_VERL_WAIT_LIVE"):  # step 1 must be in MLflow before step 2 runs
            from mlflow.tracking import MlflowClient
            c = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
            for _ in range(600):
                if c.get_metric_history(os.environ["RATCHET_MLFLOW_RUN_ID"], "actor/pg_loss"):
                    break
                time.sleep(0.1)
            else:
                sys.exit("step 1's metrics did not reach the MLflow run while the run went on")
    actor = os.path.join(root, "global_step_2", "actor")
    os.makedirs(os.path.join(actor, "huggingface"), exist_ok=True)
    open(os.path.join(actor, "fsdp_config.json"), "w").write(json.dumps({"FSDP_version": 2, "world_size": 1}))
    open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w").write("2")
""")

FAKE_MERGER = textwrap.dedent(r"""
    import json, os, sys
    target = sys.argv[sys.argv.index("--target_dir") + 1]
    os.makedirs(target, exist_ok=True)
    open(os.path.join(target, "config.json"), "w").write(json.dumps({"model_type": "fake"}))
""")


@pytest.fixture
def fake_verl(tmp_path, monkeypatch):
    entry = tmp_path / "fake_main_ppo.py"
    entry.write_text(FAKE_MAIN_PPO)
    merger = tmp_path / "fakeverl" / "verl" / "model_merger"
    merger.mkdir(parents=True)
    (merger.parent / "__init__.py").write_text("")
    (merger / "__init__.py").write_text("")
    (merger / "__main__.py").write_text(FAKE_MERGER)
    monkeypatch.setenv("RATCHET_VERL_ENTRYPOINT", str(entry))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(merger.parent.parent),
                                                                   os.environ.get("PYTHONPATH")])))
    return entry


def _with_sft(home, wh):
    """A registered SFT checkpoint for acme:c1 without training one (the RL backend is under test)."""
    import dagster as dg

    from assets.training import _set_pointer, register_candidate
    from resources import WarehouseResource

    instance = dg.DagsterInstance.ephemeral()
    key = register_candidate(instance, "acme", "c1")
    sft = home / "sft"
    sft.mkdir()
    (sft / "config.json").write_text("{}")
    (sft / "ratchet_checkpoint.json").write_text(json.dumps({"record_ids": ["r1"], "consent_ids": ["C-ACME"]}))
    _set_pointer(WarehouseResource(home=str(home)), {"path": str(sft), "checkpoint_id": "sft-1", "version": "1",
                                                    "model_name": "ratchet-acme-c1", "curve": ""}, key, "sft")
    return instance, key, sft


def _materialize(home, instance, key, rl_config):
    import dagster as dg

    from assets.training import rl_checkpoint
    from resources import MlflowTracking, WarehouseResource

    resources = {"warehouse": WarehouseResource(home=str(home)), "tracking": MlflowTracking(home=str(home))}
    return dg.materialize([rl_checkpoint], instance=instance, resources=resources, partition_key=key,
                          raise_on_error=False, run_config={"ops": {"rl_checkpoint": {"config": rl_config}}})


def test_rl_on_verl_registers_the_merged_checkpoint_with_metrics_and_lineage(warehouse_home, fake_verl, monkeypatch):
    """Also: each step's metrics are in the MLflow run while VeRL still runs (the fake waits for
    step 1's before it goes on), and logged once (not again at registration)."""
    from mlflow.tracking import MlflowClient

    from ratchet import store
    from ratchet.home import get_home

    home, wh = warehouse_home
    instance, key, sft = _with_sft(home, wh)
    monkeypatch.setenv("FAKE_VERL_WAIT_LIVE", "1")
    r = _materialize(home, instance, key, {"backend": "verl", "steps": 2, "tasks_per_step": 1, "group_size": 2,
                                           "task_limit": 2, "validation_tasks": 0})
    assert r.success, [e.message for e in r.all_events if e.is_failure]
    md = r.asset_materializations_for_node("rl_checkpoint")[0].metadata
    assert md["backend"].value == "verl" and md["steps"].value == 2
    assert md["lineage"].value["parent_checkpoint"] == "sft-1" and md["lineage"].value["stage"] == "rl"
    merged = get_home(home).root / md["checkpoint"].value
    assert merged.name == "merged"
    assert json.loads((merged / "ratchet_checkpoint.json").read_text())["lineage"]["consent_ids"] == ["C-ACME"]
    c = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    hist = c.get_metric_history(md["mlflow_run_id"].value, "actor/pg_loss")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.5), (2, 0.25)]
    with wh.connect() as con:
        rows = store.fetch(con, "SELECT checkpoint_id FROM checkpoints")
    assert md["checkpoint_id"].value in {r["checkpoint_id"] for r in rows}


@pytest.mark.parametrize("config, says", [
    ({"backend": "vllm"}, "unknown RL backend 'vllm'"),
    ({"backend": "verl", "verl_launcher": "docker"}, "needs verl_image")])
def test_a_bad_backend_config_fails_before_any_work(warehouse_home, config, says):
    home, wh = warehouse_home
    instance, key, _ = _with_sft(home, wh)
    r = _materialize(home, instance, key, config)
    assert not r.success
    msg = " ".join(str(e.event_specific_data) for e in r.all_events if e.is_failure)
    assert says in msg
    assert not any((home / "checkpoints").rglob("verl-train.parquet"))


def _alive(pid):
    try:
        st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return st not in ("Z", "X")


def test_cancel_stops_the_whole_verl_tree(tmp_path, fake_verl):
    """The Pipes client's cancel sends SIGINT to its direct child (the wrapper) only: the wrapper
    must take VeRL's tree down, a grandchild started with setsid included."""
    pids_file = tmp_path / "pids.json"
    env = {**os.environ, "FAKE_VERL_PIDS": str(pids_file)}
    cmd = [sys.executable, "-m", "ratchet.training.verl_backend", "run", "--",
           sys.executable, str(fake_verl), f"trainer.default_local_dir={tmp_path / 'ck'}"]
    wrapper = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not pids_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)                  # run_verl scans the tree once a second
    pids = json.loads(pids_file.read_text())
    assert all(_alive(p) for p in pids)
    wrapper.send_signal(signal.SIGINT)
    try:
        wrapper.wait(timeout=20)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)]
    finally:                         # a failing run leaves nothing behind either
        for p in [wrapper.pid, *pids]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_prepare_composes_the_real_overrides_and_launches_verls_entry(tmp_path, monkeypatch):
    """Without the stand-in, `prepare` checks its overrides against VeRL's packaged config (the
    pinned packages from verl_pkgs, or the test skips) and launches VeRL's own entry point."""
    from ratchet.training.verl_backend import prepare
    from ratchet.training.verl_launch import ENTRY
    from sandboxes.humaneval import build_suite
    from tests.training.verl_pkgs import CONFIG, DATA, entered

    monkeypatch.delenv("RATCHET_VERL_ENTRYPOINT", raising=False)
    bundles = build_suite(seed=0, limit=1, per_problem=1, cache_dir=tmp_path / "suite").tasks
    with entered(DATA, CONFIG, run_init=False):
        cmd, env, ckpts = prepare(tmp_path / "sft", bundles, tmp_path / "out", steps=2, group_size=2,
                                  tasks_per_step=1, lr=1e-5, beta=0.001, max_turns=2, max_tokens=64)
    assert cmd[1:3] == ["-m", ENTRY] and "actor_rollout_ref.rollout.n=2" in cmd
    assert ckpts == (tmp_path / "out" / "verl" / "checkpoints").resolve() and env["PYTHONUNBUFFERED"] == "1"


def test_steps_the_wrapper_could_not_log_are_logged_at_registration():
    from ratchet.training.lineage import log_history
    from ratchet.training.verl_backend import history, logged_steps

    msgs = [{"step": 1, "metrics": {"a": 1.0}, "mlflow": True}, {"step": 2, "metrics": {"a": 2.0}, "mlflow": False},
            {"step": 3, "metrics": {"a": 3.0}}, "not a step", {"step": 1, "metrics": {"b": 0.5}, "mlflow": True}]
    assert logged_steps(msgs) == {1}
    assert history(msgs) == [{"step": 1, "a": 1.0, "b": 0.5}, {"step": 2, "a": 2.0}, {"step": 3, "a": 3.0}]

    class Run:
        logged = []

        def log_metrics(self, metrics, step):
            self.logged.append((step, metrics))
    log_history(Run(), history(msgs), skip=logged_steps(msgs))
    assert Run.logged == [(2, {"a": 2.0}), (3, {"a": 3.0})]
