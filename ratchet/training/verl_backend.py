"""RL on VeRL for the rl_checkpoint asset: prepare the data, overrides and command; run it under
a wrapper that keeps `run_verl`'s process-group teardown (a Pipes client only stops its direct
child: the ray cluster below it would outlive a cancel); merge the result to an HF folder. Each
step's metrics go to the asset's MLflow run as the step ends (RATCHET_MLFLOW_RUN_ID at
MLFLOW_TRACKING_URI, set by the asset), so a run of hours shows its curves while it runs; a step
the wrapper could not log is logged by the asset when the run ends.

    python -m ratchet.training.verl_backend run -- CMD...   (the wrapper the asset launches)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# A test or a custom launcher puts its own script in place of `python -m verl.trainer.main_ppo`;
# the overrides are then passed to it as they are, and not composed against VeRL's config.
ENTRYPOINT_ENV = "RATCHET_VERL_ENTRYPOINT"
RUN_ID_ENV = "RATCHET_MLFLOW_RUN_ID"


def prepare(sft_path: str | Path, bundles: Iterable, out_dir: str | Path, *, steps: int, group_size: int,
            tasks_per_step: int, lr: float, beta: float, max_turns: int, max_tokens: int, gpus: int = 1,
            env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str], Path]:
    """(command, environment, checkpoints dir) of a VeRL GRPO run from `sft_path` on `bundles`.
    Raises VerlConfigError on an override VeRL's config does not take, before any GPU work."""
    from ratchet.training.verl_data import write_rl_parquet
    from ratchet.training.verl_launch import compose_config, grpo_overrides, launch_command, verl_env

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = write_rl_parquet(list(bundles), out / "verl-train.parquet", bundle_dir=out / "bundles")
    work = out / "verl"     # grpo_overrides puts the agent-loop file and `checkpoints/` here
    overrides = grpo_overrides(model_path=sft_path, train_files=[train], out_dir=work, rollout_n=group_size,
                               kl_coef=beta, lr=lr, train_batch_size=tasks_per_step, max_turns=max_turns,
                               max_response_length=max_tokens, total_steps=steps, save_freq=steps,
                               n_gpus_per_node=gpus)
    base = dict(os.environ if env is None else env)
    fake = base.get(ENTRYPOINT_ENV)
    if fake:
        cmd = [sys.executable, fake, *overrides]
    else:
        compose_config(overrides)
        cmd = launch_command(overrides)
    return cmd, verl_env(base), work / "checkpoints"


def finish(checkpoints: str | Path, target: str | Path, *, env: Mapping[str, str] | None = None) -> Path:
    """The latest actor checkpoint under `checkpoints` merged into the HF folder `target`."""
    from ratchet.training.verl_launch import latest_actor_dir, merge_checkpoint

    return merge_checkpoint(latest_actor_dir(checkpoints), target, env=env)


def history(messages: Iterable) -> list[dict]:
    """The wrapper's metric messages (Pipes custom messages) as one dict per step, in step order."""
    steps: dict[int, dict] = {}
    for m in messages:
        if isinstance(m, Mapping) and "step" in m:
            steps.setdefault(int(m["step"]), {"step": int(m["step"])}).update(m.get("metrics") or {})
    return [steps[k] for k in sorted(steps)]


def logged_steps(messages: Iterable) -> set[int]:
    """The steps whose every metric message says the wrapper logged it to MLflow itself."""
    ok: dict[int, bool] = {}
    for m in messages:
        if isinstance(m, Mapping) and "step" in m:
            ok[int(m["step"])] = ok.get(int(m["step"]), True) and m.get("mlflow") is True
    return {k for k, v in ok.items() if v}


def mlflow_logger(env: Mapping[str, str] = os.environ):
    """log(step, metrics) into the MLflow run named by RATCHET_MLFLOW_RUN_ID at MLFLOW_TRACKING_URI,
    or None when they are not set."""
    run_id, uri = env.get(RUN_ID_ENV), env.get("MLFLOW_TRACKING_URI")
    if not run_id or not uri:
        return None
    import time

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)

    def log(step: int, metrics: Mapping[str, float]) -> None:
        at = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, float(v), at, int(step)) for k, v in metrics.items()
                                          if isinstance(v, (int, float)) and not isinstance(v, bool)])
    return log


def run_wrapped(cmd: Sequence[str]) -> int:
    """Run `cmd` with run_verl under Dagster Pipes (open_dagster_pipes): each line goes to the Dagster log, each
    metrics line back as a custom message; SIGTERM/SIGINT (the client's cancel) tear the tree down."""
    import signal
    import threading

    from dagster_pipes import open_dagster_pipes

    from ratchet.training.verl_launch import run_verl

    cancel = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: cancel.set())
    with open_dagster_pipes() as pipes:
        try:
            log = mlflow_logger()
        except Exception as e:  # MLflow missing or unreachable: the asset logs the steps at the end
            pipes.log.warning(f"step metrics will reach MLflow when the run ends, not live: {e}")
            log = None

        def on_metrics(step: int, metrics: dict) -> None:
            nonlocal log
            live = False
            if log is not None:
                try:
                    log(step, metrics)
                    live = True
                except Exception as e:  # stop trying (each try may wait on a timeout): logged at the end
                    pipes.log.warning(f"step {step}: metrics not logged to MLflow ({e}); this and later steps "
                                      f"are logged when the run ends")
                    log = None
            pipes.report_custom_message({"step": step, "metrics": metrics, "mlflow": live})

        rc = run_verl(cmd, on_line=pipes.log.info, cancel=cancel, on_metrics=on_metrics)
        if cancel.is_set():
            pipes.log.warning("VeRL run cancelled: its process tree was stopped")
    return rc


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 3 or args[:2] != ["run", "--"]:
        sys.exit("usage: python -m ratchet.training.verl_backend run -- CMD...")
    rc = run_wrapped(args[2:])
    sys.exit(rc if rc >= 0 else 128 - rc)
