"""The recurring improvement cycle's settings and its small policy registry (no Dagster here; the
schedule and sensors that use them live in pipelines/cycle.py).

Settings come from `RATCHET_HOME/cycle.yaml` (every key optional), read at each schedule tick:

    cron: "0 3 * * 1"        # weekly, Monday 03:00 UTC (read when the code location loads;
                             #   RATCHET_CYCLE_CRON overrides it)
    tenant: acme             # whose consented training_set the candidate learns from
    candidate: train         # "train": SFT then RL from base_policy; or a policy id (a harness,
                             #   prompt or tool-schema variant: a configuration change as candidate)
    seeds: ["0", "1", "2"]   # holdout seeds per policy
    eval_task_limit: null    # first N holdout tasks (small deployments, tests); null = all
    lifecycle: true          # ingest -> governance before training in the same run
    ops: {}                  # run config per op of improvement_job, e.g. {rl_checkpoint: {config: {steps: 4}}}
    holdout_eval: {}         # extra holdout_eval config (workers, judge, rate_card_path, ...)
    policy_kwargs: {}        # extra engine arguments for a trained candidate, e.g. {sampling: {max_tokens: 64}}
    references: [sft, base]  # also evaluated after the candidate, for the scorecard's columns (never
                             #   promoted): the cycle's SFT checkpoint and the prompted baseline
                             #   (base_policy, no weight change); [] skips them
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

DEFAULT_CRON = "0 3 * * 1"
CYCLE_FILE = "cycle.yaml"
REGISTRY_FILE = "policies.json"
REFERENCES = ("sft", "base")


@dataclass(frozen=True)
class CycleSettings:
    cron: str = DEFAULT_CRON
    tenant: str = "acme"
    candidate: str = "train"
    seeds: tuple[str, ...] = ("0", "1", "2")
    eval_task_limit: int | None = None
    lifecycle: bool = True
    ops: dict = field(default_factory=dict)
    holdout_eval: dict = field(default_factory=dict)
    policy_kwargs: dict = field(default_factory=dict)
    references: tuple[str, ...] = REFERENCES

    def __post_init__(self):
        if len(self.cron.split()) != 5:
            raise ValueError(f"cron {self.cron!r} is not a 5-field cron expression (e.g. {DEFAULT_CRON!r}: weekly)")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.tenant):
            raise ValueError(f"tenant {self.tenant!r}: letters, digits, '_', '.', '-' only")
        if self.candidate != "train" and ":" not in self.candidate:
            raise ValueError(f"candidate {self.candidate!r} is neither 'train' nor a policy id '<engine>:<name>'")
        if not self.seeds or any(s not in ("0", "1", "2") for s in self.seeds):
            raise ValueError(f"seeds {self.seeds!r} must be a non-empty subset of the holdout seeds 0, 1, 2")
        if any(r not in REFERENCES for r in self.references) or len(set(self.references)) != len(self.references):
            raise ValueError(f"references {list(self.references)!r} must be distinct items of {list(REFERENCES)} "
                             "(the cycle's SFT checkpoint, the prompted baseline), or [] for none")
        if self.eval_task_limit is not None and self.eval_task_limit < 1:
            raise ValueError(f"eval_task_limit {self.eval_task_limit} must be >= 1 (or null for the whole holdout)")

    @property
    def trains(self) -> bool:
        return self.candidate == "train"

    @classmethod
    def from_dict(cls, d: dict | None) -> CycleSettings:
        d = dict(d or {})
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown cycle setting(s) {unknown}; known: {[f.name for f in fields(cls)]}")
        if "seeds" in d:
            d["seeds"] = tuple(str(s) for s in d["seeds"])
        if "references" in d:
            d["references"] = tuple(str(r) for r in d["references"] or ())
        return cls(**d)

    @classmethod
    def load(cls, root: str | os.PathLike) -> CycleSettings:
        """RATCHET_HOME/cycle.yaml (defaults where absent), RATCHET_CYCLE_CRON over its cron."""
        import yaml

        path = Path(root) / CYCLE_FILE
        data = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of cycle settings")
        if os.environ.get("RATCHET_CYCLE_CRON"):
            data["cron"] = os.environ["RATCHET_CYCLE_CRON"]
        return cls.from_dict(data)


def candidate_key(tenant: str, when: datetime) -> str:
    """The candidate partition a cycle adds: one per tenant and tick time, so a re-tick of the same
    scheduled time names the same candidate (idempotent) and the next week's is new."""
    return f"{tenant}:cycle-{when:%Y%m%d-%H%M}"


def checkpoint_policy_id(model_name: str, version: str | int) -> str:
    """How a trained checkpoint is evaluated: "embedded:<registered model>@<version>" (the promotion
    layer maps it back to the `checkpoints` row "<registered model>/<version>")."""
    return f"embedded:{model_name}@{version}"


def base_policy_id(path: str | os.PathLike) -> str:
    """How the prompted baseline (base_policy, no weight change) is evaluated:
    "embedded:base_policy@<content key>" from its folder `base-<content key>` (a new corpus or
    config is a new key, so rows of different bases never mix)."""
    name = Path(path).name
    return f"embedded:base_policy@{name.removeprefix('base-')[:12] or name}"


def checkpoint_dir(checkpoints: str | os.PathLike, *parts: str) -> Path:
    """Where a candidate's stage keeps its checkpoints and `latest.json` pointer (names sanitised:
    a candidate key holds ':')."""
    return Path(checkpoints).joinpath(*[re.sub(r"[^A-Za-z0-9_.-]+", "_", p) for p in parts])


def read_pointer(checkpoints: str | os.PathLike, *parts: str) -> dict:
    """The `latest.json` of a stage ({"path", "checkpoint_id", "model_name", "version"})."""
    p = checkpoint_dir(checkpoints, *parts) / "latest.json"
    if not p.exists():
        raise FileNotFoundError(f"no {'/'.join(parts)} checkpoint yet ({p}): materialise it first")
    return json.loads(p.read_text())


def write_pointer(checkpoints: str | os.PathLike, info: dict, *parts: str) -> None:
    d = checkpoint_dir(checkpoints, *parts)
    d.mkdir(parents=True, exist_ok=True)
    (d / "latest.tmp").write_text(json.dumps(info, default=str))
    (d / "latest.tmp").replace(d / "latest.json")


def register_policy(root: str | os.PathLike, policy_id: str, kwargs: dict[str, Any]) -> None:
    """Remember how to build a policy (its engine arguments, e.g. the checkpoint folder relative to
    the home), so a later cycle can re-evaluate a learned champion under a new environment."""
    path = Path(root) / REGISTRY_FILE
    reg = json.loads(path.read_text()) if path.exists() else {}
    reg[policy_id] = _relative(root, kwargs)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(reg, indent=1, sort_keys=True))
    tmp.replace(path)


def policy_kwargs(root: str | os.PathLike, policy_id: str) -> dict[str, Any]:
    """The engine arguments `register_policy` stored ({} for harness/scripted policies, which need
    none). A learned policy that was never registered raises: evaluating it would fail later."""
    path = Path(root) / REGISTRY_FILE
    reg = json.loads(path.read_text()) if path.exists() else {}
    if policy_id in reg:
        kw = dict(reg[policy_id])
        if "path" in kw and not Path(kw["path"]).is_absolute():
            kw["path"] = str(Path(root) / kw["path"])
        return kw
    if policy_id.startswith(("harness:", "scripted:")):
        return {}
    raise KeyError(f"policy {policy_id!r} is not in {path}: evaluate it once through a cycle (or register_policy)")


def registered_checkpoints(root: str | os.PathLike) -> dict[str, str]:
    """policy id -> checkpoint folder of every registered learned policy (what the economics stage
    reads the measured training compute from)."""
    path = Path(root) / REGISTRY_FILE
    reg = json.loads(path.read_text()) if path.exists() else {}
    return {pid: policy_kwargs(root, pid)["path"] for pid, kw in sorted(reg.items()) if "path" in kw}


def _relative(root, kwargs: dict) -> dict:
    out = dict(kwargs)
    if "path" in out:
        try:
            out["path"] = str(Path(out["path"]).resolve().relative_to(Path(root).resolve()))
        except ValueError:
            pass
    return out
