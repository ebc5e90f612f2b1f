"""Launching VeRL (0.9) GRPO on Ratchet's tasks: the Hydra overrides, checked against VeRL's own
packaged config; the command; a runner that streams its metrics and tears it down on cancel.

    overrides = grpo_overrides(model_path=base, train_files=[train], val_files=[val], out_dir=run_dir)
    compose_config(overrides)                       # an unknown key or a bad value fails here
    cmd = launch_command(overrides)                 # python -m verl.trainer.main_ppo ...
    rc = run_verl(cmd, on_metrics=log, cancel=event, env=verl_env())

The rows come from `ratchet.training.verl_data.write_rl_parquet`, the rollouts from
`ratchet.training.verl_agent_loop` (named by the agent-loop file `write_agent_loop_config` writes),
the reward from Ratchet's composed verifier (the agent loop's `reward_score`; `compute_score` in
`verl_data` is the custom reward function for rows the loop did not score). VeRL itself (ray,
vLLM, FSDP) runs in the child process, never in the caller: this module imports no VeRL.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

CONFIG_NAME = "ppo_trainer"
ENTRY = "verl.trainer.main_ppo"
PROJECT_ROOT = Path(__file__).resolve().parents[2]   # ray workers import ratchet and sandboxes from here


class VerlConfigError(ValueError):
    """The overrides do not compose against VeRL's packaged config."""


def verl_config_dir() -> Path:
    """VeRL's packaged trainer config folder, found without importing `verl` (its `__init__`
    imports ray)."""
    mod = sys.modules.get("verl")
    paths = list(getattr(mod, "__path__", None) or []) if mod is not None else []
    if not paths:
        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.submodule_search_locations:
            raise VerlConfigError("VeRL is not installed: pip install 'ratchet[verl]' (the gpu extra)")
        paths = list(spec.submodule_search_locations)
    d = Path(paths[0]) / "trainer" / "config"
    if not (d / f"{CONFIG_NAME}.yaml").is_file():
        raise VerlConfigError(f"{d} has no {CONFIG_NAME}.yaml: not a VeRL 0.9 install")
    return d


def write_agent_loop_config(path: str | Path) -> Path:
    """The file `actor_rollout_ref.rollout.agent.agent_loop_config_path` names: VeRL's workers
    register the Ratchet loop from it (the `@register` in a module they never import would not)."""
    import json

    from ratchet.training.verl_agent_loop import agent_loop_config

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for entry in agent_loop_config():
        first = True
        for k, v in entry.items():
            lines.append(f"{'- ' if first else '  '}{k}: {json.dumps(v)}")   # JSON strings are YAML
            first = False
    path.write_text("\n".join(lines) + "\n")
    return path


_PLAIN = re.compile(r"^[A-Za-z0-9_./~+-]+$")


def hydra_value(v) -> str:
    """A Python value as a Hydra override value (strings quoted unless plainly safe)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in ("null", "true", "false") and not re.match(r"^[+-]?[\d.]", s):
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def grpo_overrides(*, model_path: str | Path, train_files: Sequence[str | Path], out_dir: str | Path,
                   val_files: Sequence[str | Path] | None = None, rollout_n: int = 8, lora_rank: int = 16,
                   lora_alpha: int = 32, target_modules: str | Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                   kl_coef: float = 0.001, lr: float = 1e-5, train_batch_size: int = 8,
                   max_prompt_length: int = 2048, max_response_length: int = 4096, max_turns: int = 14,
                   total_steps: int = 100, save_freq: int = 50, n_gpus_per_node: int = 1, nnodes: int = 1,
                   rollout_engine: str = "vllm", gpu_memory_utilization: float = 0.5,
                   project: str = "ratchet", experiment: str = "grpo",
                   extra: Mapping[str, object] | None = None) -> list[str]:
    """GRPO with LoRA on Ratchet's tasks: group-normalised advantages over `rollout_n` samples
    per task, KL to the reference as a loss term (not in the reward, so the reward stays Ratchet's
    own), the Ratchet agent loop, Ratchet's reward function. `extra`: more `key: value` overrides
    (checked like the rest by `compose_config`). Writes the agent-loop file under `out_dir`."""
    if not train_files:
        raise ValueError("no train_files: write them with ratchet.training.verl_data.write_rl_parquet")
    for f in [*train_files, *(val_files or ())]:
        if not Path(f).is_file():
            raise FileNotFoundError(f"VeRL data file {f} does not exist")
    if rollout_n < 2:
        raise ValueError(f"GRPO needs rollout_n >= 2 samples per task (a group), got {rollout_n}")
    out_dir = Path(out_dir).resolve()
    loop_cfg = write_agent_loop_config(out_dir / "agent_loop.yaml")
    files = lambda fs: [str(Path(f).resolve()) for f in fs]   # noqa: E731 - workers run elsewhere
    o: dict[str, object] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_files": files(train_files),
        "data.val_files": files(val_files or train_files),
        "data.train_batch_size": train_batch_size,
        "data.max_prompt_length": max_prompt_length,
        "data.max_response_length": max_response_length,
        "data.return_raw_chat": True,
        "actor_rollout_ref.model.path": str(Path(model_path).resolve()),
        "actor_rollout_ref.model.lora_rank": lora_rank,
        "actor_rollout_ref.model.lora_alpha": lora_alpha,
        "actor_rollout_ref.model.target_modules": (target_modules if isinstance(target_modules, str)
                                                   else list(target_modules)),
        "actor_rollout_ref.actor.optim.lr": lr,
        "actor_rollout_ref.actor.use_kl_loss": kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.actor.ppo_mini_batch_size": train_batch_size,
        "actor_rollout_ref.rollout.name": rollout_engine,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": rollout_n,
        "actor_rollout_ref.rollout.gpu_memory_utilization": gpu_memory_utilization,
        "actor_rollout_ref.rollout.multi_turn.enable": True,
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": max_turns,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(loop_cfg),
        "actor_rollout_ref.rollout.agent.default_agent_loop": "ratchet_repair",
        "reward.custom_reward_function.path": str(Path(__file__).with_name("verl_data.py")),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.project_name": project,
        "trainer.experiment_name": experiment,
        "trainer.logger": ["console"],          # the runner reads the console lines (parse_metrics)
        "trainer.n_gpus_per_node": n_gpus_per_node,
        "trainer.nnodes": nnodes,
        "trainer.total_training_steps": total_steps,
        "trainer.save_freq": save_freq,
        "trainer.default_local_dir": str(out_dir / "checkpoints"),
        "trainer.val_before_train": False,
    }
    o.update(extra or {})
    return [f"{k}={hydra_value(v)}" for k, v in o.items()]


def compose_config(overrides: Iterable[str], config_dir: str | Path | None = None):
    """VeRL's packaged `ppo_trainer` config with the overrides applied and resolved (what
    `main_ppo` would run with); raises VerlConfigError naming the override that does not fit."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    overrides = list(overrides)
    d = Path(config_dir) if config_dir else verl_config_dir()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(d), version_base=None):
            base = compose(config_name=CONFIG_NAME)
            cfg = compose(config_name=CONFIG_NAME, overrides=overrides)
        OmegaConf.resolve(cfg)
    except Exception as e:  # noqa: BLE001 - hydra/omegaconf raise several types: all are a bad override
        raise VerlConfigError(f"the VeRL overrides do not compose against {d / CONFIG_NAME}.yaml: "
                              f"{type(e).__name__}: {e}") from e
    finally:
        GlobalHydra.instance().clear()
    # VeRL's yaml is untyped until its workers build dataclasses from it (on the cluster, minutes
    # in): a number or flag given as text is caught here instead
    last = {o.split("=", 1)[0].lstrip("+~"): o for o in overrides}    # a later override wins
    for key, o in last.items():
        old, new = OmegaConf.select(base, key, default=None), OmegaConf.select(cfg, key, default=None)
        number = isinstance(old, (int, float)) and not isinstance(old, bool)
        if new is not None and ((isinstance(old, bool) and not isinstance(new, bool)) or
                                (number and (isinstance(new, bool) or not isinstance(new, (int, float))))):
            raise VerlConfigError(f"override {o!r}: VeRL's {key} is a {type(old).__name__} "
                                  f"(default {old!r}), got {new!r}")
    return cfg


def launch_command(overrides: Iterable[str], python: str = sys.executable) -> list[str]:
    return [python, "-m", ENTRY, *overrides]


def verl_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: Ratchet importable by the ray workers (they load the agent loop
    and the reward function by name), console output unbuffered so metrics stream as they come."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


_STEP = re.compile(r"^\s*(?:\([^)]*\)\s*)?step:(\d+)\s+-\s+(.*)$")


def parse_metrics(line: str) -> tuple[int, dict[str, float]] | None:
    """VeRL's console logger line `step:3 - actor/pg_loss:0.12 - ...` as (step, metrics)."""
    m = _STEP.match(line)
    if not m:
        return None
    out = {}
    for part in m.group(2).split(" - "):
        k, sep, v = part.rpartition(":")
        if not sep:
            continue
        try:
            out[k.strip()] = float(v)
        except ValueError:
            continue
    return int(m.group(1)), out


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc): ray's daemons start their own sessions, so the
    process group alone does not hold them."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def _signal_all(pids: Iterable[int], pgid: int | None, sig: int) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process, None when it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return f[0], f[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def terminate_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group and every descendant (ray's included), SIGKILL what is
    left after `grace_s`."""
    pids = [proc.pid, *_descendants(proc.pid)]
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    _signal_all(pids, pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        pids = [p for p in pids if _alive(p)]
        if not pids:
            break
        time.sleep(0.05)
    pids += [d for d in _descendants(proc.pid) if d not in pids] if proc.poll() is None else []
    _signal_all([p for p in pids if _alive(p)], pgid, signal.SIGKILL)
    proc.wait()


def run_verl(cmd: Sequence[str], *, on_line: Callable[[str], None] | None = None,
             on_metrics: Callable[[int, dict[str, float]], None] | None = None,
             cancel: threading.Event | None = None, env: Mapping[str, str] | None = None,
             cwd: str | Path | None = None, grace_s: float = 10.0) -> int:
    """Run the command in its own process group, passing each output line to `on_line` and each
    metrics line to `on_metrics`; when `cancel` is set, tear the whole tree down (ray included)
    and return the child's status (negative: killed by that signal). A failing child is the
    caller's to judge: the status is returned, the tail of its output went through `on_line`. A
    callback that raises does not stop the run: its error is raised once the child has exited."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                            errors="replace")

    failed: list[BaseException] = []

    def pump():
        # keeps reading after a callback fails: a full pipe would stall the training child
        for line in proc.stdout:
            if failed:
                continue
            line = line.rstrip("\n")
            try:
                if on_line:
                    on_line(line)
                if on_metrics and (m := parse_metrics(line)) is not None:
                    on_metrics(*m)
            except Exception as e:  # noqa: BLE001 - re-raised in the caller's thread below
                failed.append(e)

    reader = threading.Thread(target=pump, name="verl-output", daemon=True)
    reader.start()
    seen: dict[int, str] = {}        # descendant pid -> start time (a reused pid is not ours)
    last_scan = 0.0
    try:
        while proc.poll() is None:
            if time.monotonic() - last_scan > 1.0:
                seen.update({p: st[1] for p in _descendants(proc.pid) if (st := _stat(p))})
                last_scan = time.monotonic()
            if cancel is not None and cancel.wait(0.1):
                terminate_tree(proc, grace_s)
                break
            elif cancel is None:
                time.sleep(0.1)
    except BaseException:
        terminate_tree(proc, grace_s)     # the caller interrupted: never leave ray running
        raise
    finally:
        # what the child left behind in other sessions (a ray cluster it did not shut down, or
        # daemons it started before being killed) goes with it
        left = [p for p, t in seen.items() if (st := _stat(p)) and st[1] == t and st[0] not in ("Z", "X")]
        _signal_all(left, None, signal.SIGKILL)
        reader.join(timeout=5)
    rc = proc.wait()
    if failed:
        raise RuntimeError(f"a VeRL output callback failed (the run went on and exited {rc}); "
                           f"checkpoints are under its default_local_dir") from failed[0]
    return rc


# ---------------------------------------------------------------------------- the checkpoint

_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def latest_actor_dir(checkpoints: str | Path) -> Path:
    """The actor folder of VeRL's latest checkpoint under `trainer.default_local_dir`
    (`latest_checkpointed_iteration.txt`, else the highest `global_step_N`)."""
    root = Path(checkpoints)
    marker = root / "latest_checkpointed_iteration.txt"
    if marker.is_file():
        step = marker.read_text().strip()
        actor = root / f"global_step_{step}" / "actor"
    else:
        steps = sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else ())
                       if (m := _STEP_DIR.match(p.name)))
        if not steps:
            raise FileNotFoundError(f"no VeRL checkpoint (global_step_N) under {root}")
        actor = steps[-1][1] / "actor"
    if not (actor / "fsdp_config.json").is_file():
        raise FileNotFoundError(f"{actor} is not a VeRL FSDP actor checkpoint (no fsdp_config.json)")
    return actor


def merge_checkpoint(checkpoint: str | Path, target_dir: str | Path, *, env: Mapping[str, str] | None = None,
                     python: str = sys.executable, timeout_s: float = 3600) -> Path:
    """VeRL's FSDP checkpoint (an actor folder, or `default_local_dir` for the latest) as a plain
    HF folder, as the embedded path saves them: VeRL's own model merger (`verl.model_merger`,
    run in a child process where VeRL is installed) writes the weights and tokenizer; a LoRA
    adapter it writes beside them (`lora_adapter/`) is folded into the weights, so `load_policy`
    and the next stage load it with no peft. Register the folder with
    `ratchet.training.lineage.record_checkpoint` (stage "rl"), as the embedded trainers' are."""
    checkpoint, target = Path(checkpoint), Path(target_dir)
    actor = checkpoint if (checkpoint / "fsdp_config.json").is_file() else latest_actor_dir(checkpoint)
    work = target.with_name(target.name + ".merging")
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    cmd = [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor),
           "--target_dir", str(work)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                       env=dict(env) if env is not None else None)
    if r.returncode != 0 or not (work / "config.json").is_file():
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"VeRL's model merger failed on {actor} (exit {r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()[-1500:]}")
    adapter = work / "lora_adapter"
    if adapter.is_dir():
        _fold_adapter(work, adapter)
    shutil.rmtree(target, ignore_errors=True)
    work.replace(target)            # never a half-merged folder under the final name
    return target


def _fold_adapter(folder: Path, adapter: Path) -> None:
    """Fold the adapter into the weights; its own files stay in `lora_adapter/`, for audit
    (transformers loads the folder's top level only)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(folder)
