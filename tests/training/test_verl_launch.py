"""The VeRL launcher: the GRPO overrides against VeRL's own packaged config (composed by hydra),
and the runner (streams metrics, tears the whole process tree down), run on a stand-in
`main_ppo`: the real one needs ray and GPUs."""
import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

# hydra 1.3's calls into omegaconf 2.4 (the version VeRL's datasets are tested with) warn
pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
              pytest.mark.filterwarnings("ignore:Implicit conversion from Version:FutureWarning")]


@pytest.fixture(scope="module")
def verl_config():
    """VeRL's packaged config and hydra (installed by `verl_pkgs`, or the test skips)."""
    from tests.training.verl_pkgs import CONFIG, DATA, entered

    with entered(DATA, CONFIG, run_init=False):
        yield


@pytest.fixture
def data(tmp_path, tasks_one):
    from ratchet.training.verl_data import write_rl_parquet
    return write_rl_parquet(tasks_one, tmp_path / "train.parquet", bundle_dir=tmp_path / "bundles")


@pytest.fixture(scope="module")
def tasks_one(tmp_path_factory):
    from sandboxes.humaneval import build_suite
    return build_suite(seed=0, limit=1, per_problem=1, cache_dir=tmp_path_factory.mktemp("suite")).tasks


def test_the_grpo_overrides_compose_against_verls_packaged_config(verl_config, tmp_path, data):
    from omegaconf import OmegaConf

    from ratchet.training.verl_agent_loop import agent_loop_config
    from ratchet.training.verl_launch import compose_config, grpo_overrides, verl_config_dir

    out = tmp_path / "run dir, with=odd 'chars'"        # quoting: hydra must get the path back intact
    ov = grpo_overrides(model_path=tmp_path / "base", train_files=[data], out_dir=out, rollout_n=4, lora_rank=8,
                        lora_alpha=16, kl_coef=0.01, lr=2e-5, extra={"trainer.total_epochs": 2})
    cfg = compose_config(ov)
    assert verl_config_dir().parts[-3:] == ("verl", "trainer", "config")
    a = cfg.actor_rollout_ref
    assert cfg.algorithm.adv_estimator == "grpo" and a.rollout.n == 4 and not cfg.algorithm.use_kl_in_reward
    assert (a.model.lora_rank, a.model.lora_alpha) == (8, 16)
    assert list(a.model.target_modules) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert a.actor.use_kl_loss and a.actor.kl_loss_coef == 0.01 and a.actor.optim.lr == 2e-5
    assert list(cfg.data.train_files) == [str(Path(data).resolve())] and cfg.trainer.total_epochs == 2
    assert a.rollout.multi_turn.enable and a.rollout.agent.default_agent_loop == "ratchet_repair"
    # the interpolations VeRL resolves from data.* reach the rollout
    assert a.rollout.prompt_length == cfg.data.max_prompt_length == 2048
    assert cfg.trainer.default_local_dir == str(out.resolve() / "checkpoints")
    loop_file = Path(a.rollout.agent.agent_loop_config_path)
    assert loop_file.parent == out.resolve()
    assert OmegaConf.to_container(OmegaConf.load(loop_file)) == agent_loop_config()
    # VeRL loads the reward function from the file by path (get_custom_reward_fn)
    import importlib.util
    spec = importlib.util.spec_from_file_location("custom_module", cfg.reward.custom_reward_function.path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(getattr(mod, cfg.reward.custom_reward_function.name))


def test_a_bad_override_fails_at_compose_time_with_the_reason(verl_config, tmp_path, data):
    from ratchet.training.verl_launch import VerlConfigError, compose_config, grpo_overrides

    ov = grpo_overrides(model_path=tmp_path, train_files=[data], out_dir=tmp_path / "run")
    with pytest.raises(VerlConfigError, match=r"Could not override 'actor_rollout_ref\.rollout\.nn'"):
        compose_config([*ov, "actor_rollout_ref.rollout.nn=3"])
    with pytest.raises(VerlConfigError, match=r"rollout\.n is a int \(default 1\), got 'four'"):
        compose_config([*ov, "actor_rollout_ref.rollout.n=four"])
    with pytest.raises(VerlConfigError, match="use_kl_loss is a bool"):
        grpo = grpo_overrides(model_path=tmp_path, train_files=[data], out_dir=tmp_path / "run",
                              extra={"actor_rollout_ref.actor.use_kl_loss": "sometimes"})
        compose_config(grpo)
    with pytest.raises(ValueError, match="rollout_n >= 2"):
        grpo_overrides(model_path=tmp_path, train_files=[data], out_dir=tmp_path / "run", rollout_n=1)
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        grpo_overrides(model_path=tmp_path, train_files=[tmp_path / "nope.parquet"], out_dir=tmp_path / "run")


def test_metrics_lines_parse_as_verls_console_logger_prints_them(verl_config):
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    from ratchet.training.verl_launch import parse_metrics

    line = concat_dict_to_str({"actor/pg_loss": -0.25, "critic/score/mean": 0.5, "note": "text"}, step=3)
    assert parse_metrics(line) == (3, {"actor/pg_loss": -0.25, "critic/score/mean": 0.5})
    assert parse_metrics("(TaskRunner pid=12) " + line) == (3, {"actor/pg_loss": -0.25, "critic/score/mean": 0.5})
    assert parse_metrics("Training Progress: 10%") is None


# A stand-in for `python -m verl.trainer.main_ppo`: prints its argv and two metrics lines, starts a
# worker in its own process group and a daemon detached by setsid (as ray's raylet and gcs are),
# writes their pids, then sleeps (or exits, with `--exit`) leaving both behind.
FAKE_MAIN_PPO = textwrap.dedent(r"""
    import json, os, subprocess, sys, time
    print(json.dumps(sys.argv[1:]), flush=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    worker = subprocess.Popen(sleeper)
    graceful = ("import os, signal, sys, time\n"
                "def stop(*a):\n    open(os.environ['PIDS'] + '.term', 'w').write('x')\n    sys.exit(0)\n"
                "signal.signal(signal.SIGTERM, stop)\ntime.sleep(600)\n")
    daemon = subprocess.Popen([sys.executable, "-c", graceful], start_new_session=True)
    open(os.environ["PIDS"], "w").write(json.dumps([os.getpid(), worker.pid, daemon.pid]))
    time.sleep(1.5)          # the runner scans the tree once a second
    for step in (1, 2):
        print(f"step:{step} - actor/pg_loss:{0.5 / step} - critic/score/mean:{step / 4}", flush=True)
    if "--exit" in sys.argv:
        sys.exit(0)
    time.sleep(600)
""")


@pytest.fixture
def fake_verl(tmp_path):
    pkg = tmp_path / "fake" / "verl" / "trainer"
    pkg.mkdir(parents=True)
    for d in (pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "main_ppo.py").write_text(FAKE_MAIN_PPO)
    from ratchet.training.verl_launch import verl_env
    env = verl_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), env["PYTHONPATH"]])
    env["PIDS"] = str(tmp_path / "pids.json")
    return env


def _gone(pids, within_s=5.0) -> bool:
    from ratchet.training.verl_launch import _alive
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_cancel_tears_down_the_process_group_and_the_daemons(fake_verl, tmp_path):
    from ratchet.training.verl_launch import launch_command, run_verl

    cancel, lines, metrics = threading.Event(), [], []

    def on_metrics(step, m):
        metrics.append((step, m))
        if step == 2:
            cancel.set()

    overrides = ["algorithm.adv_estimator=grpo", "trainer.default_local_dir='/a b'"]
    t0 = time.monotonic()
    rc = run_verl(launch_command(overrides), on_line=lines.append, on_metrics=on_metrics, cancel=cancel,
                  env=fake_verl, grace_s=2.0)
    assert time.monotonic() - t0 < 30 and rc < 0           # killed, not finished
    assert json.loads(lines[0]) == overrides                # argv reaches main_ppo untouched
    assert metrics == [(1, {"actor/pg_loss": 0.5, "critic/score/mean": 0.25}),
                       (2, {"actor/pg_loss": 0.25, "critic/score/mean": 0.5})]
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert _gone(pids), f"left running: {pids}"
    assert (tmp_path / "pids.json.term").exists()           # the daemon was asked to stop first


def test_a_child_that_exits_leaves_no_daemon_behind(fake_verl, tmp_path):
    from ratchet.training.verl_launch import launch_command, run_verl

    metrics = []
    rc = run_verl(launch_command(["--exit"]), on_metrics=lambda s, m: metrics.append(s), env=fake_verl)
    assert rc == 0 and metrics == [1, 2]
    assert _gone(json.loads((tmp_path / "pids.json").read_text())[1:])


def test_a_failing_callback_neither_stalls_nor_hides(fake_verl):
    from ratchet.training.verl_launch import launch_command, run_verl

    def broken(step, metrics):
        raise ConnectionError("tracking server down")

    with pytest.raises(RuntimeError, match="callback failed .*exited 0") as e:
        run_verl(launch_command(["--exit"]), on_metrics=broken, env=fake_verl)
    assert isinstance(e.value.__cause__, ConnectionError)


def test_the_launch_command_runs_main_ppo_with_the_overrides():
    from ratchet.training.verl_launch import launch_command
    assert launch_command(["a=1", "b=x"], python="/py") == ["/py", "-m", "verl.trainer.main_ppo", "a=1", "b=x"]
    assert launch_command([])[0] == sys.executable
