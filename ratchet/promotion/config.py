"""Gate and canary thresholds: frozen dataclasses, loadable from a dict or a YAML file, that
refuse nonsense with a message saying how to fix it."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# Gates a config may never make soft (an owner cannot wave them through).
ALWAYS_HARD = frozenset({"comparable", "evaluation_complete", "beats_champion", "hard_gate_violations",
                         "judge_kappa", "contamination", "consent", "reward_hacking"})
GATES = ("comparable", "evaluation_complete", "beats_champion", "slice_regression", "hard_gate_violations",
         "latency_p95", "judge_kappa", "contamination", "consent", "reward_hacking", "pretraining_membership")
# Gates that warn: reported with their numbers, never in the verdict or in what blocks approval.
# A pretrained base that has read the holdout's solutions makes the numbers recall as well as
# repair, which an owner must know, but a membership test is evidence, not proof.
WARNINGS = frozenset({"pretraining_membership"})
DEFAULT_SLICES = ("slice", "family", "difficulty", "category", "tenant_id")
COMPONENTS = ("reward_tests", "reward_hygiene", "reward_judge")


def _from_mapping(cls, d: Mapping[str, Any] | None):
    d = dict(d or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown setting(s) {unknown}; known: {sorted(known)}")
    for k, v in d.items():
        if isinstance(v, list):
            d[k] = tuple(v)
    return cls(**d)


def _load_yaml(path: str | Path, key: str) -> Mapping:
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    return data.get(key, data) if isinstance(data, Mapping) else {}


@dataclass(frozen=True)
class GatePolicy:
    name: str = "default"
    margin: float = 0.0                  # beats_champion: CI lower bound of the pass-rate difference must exceed this
    ci_level: float = 0.95
    n_boot: int = 2000
    seed: int = 0
    slice_columns: tuple[str, ...] = DEFAULT_SLICES
    slice_tolerance: float = 0.0         # a slice may drop by at most this (0.0: delta >= 0 on every slice)
    hard_gate_tolerance: float = 0.0     # candidate violation rate <= champion's + this
    latency_tolerance: float = 0.10      # candidate p95 <= champion p95 * (1 + this)
    min_kappa: float = 0.80
    max_contamination: float = 0.0
    hacking_tolerance: float = 0.0       # a pass rate / component may drop this much while reward rises
    max_infra_rate: float = 0.10         # share of a side's episodes that may be infrastructure failures
    min_seeds: int = 3                   # seeds every task needs on each side (the holdout evaluates 3 seeds)
    require_lineage: bool = True         # a learned checkpoint needs a consent lineage record
    soft_gates: tuple[str, ...] = ()     # gates an owner may approve past (never those in ALWAYS_HARD)
    auto_approve: bool = True            # the pre-authorised policy approves when every gate passes
    owners: tuple[str, ...] = ()         # who may approve by name (empty: any named owner)

    def __post_init__(self):
        if not 0.5 < self.ci_level < 1.0:
            raise ValueError(f"ci_level {self.ci_level} must be in (0.5, 1), e.g. 0.95")
        if self.n_boot < 200:
            raise ValueError(f"n_boot {self.n_boot} is too few for a {self.ci_level:.0%} interval: use >= 1000")
        if self.margin < 0:
            raise ValueError(f"margin {self.margin} < 0 would let a worse candidate through: use >= 0")
        for k in ("slice_tolerance", "hard_gate_tolerance", "latency_tolerance", "hacking_tolerance",
                  "max_contamination", "max_infra_rate"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k} must be >= 0, got {getattr(self, k)}")
        if not 0.0 <= self.min_kappa <= 1.0:
            raise ValueError(f"min_kappa {self.min_kappa} must be in [0, 1] (the judge gate blocks below 0.80)")
        bad = sorted(set(self.soft_gates) - (set(GATES) - WARNINGS))
        if bad:
            raise ValueError(f"soft_gates {bad} are not gates; gates are {list(GATES)}")
        hard = sorted(set(self.soft_gates) & ALWAYS_HARD)
        if hard:
            raise ValueError(f"soft_gates {hard} must stay hard: only {sorted(set(GATES) - ALWAYS_HARD)} may be soft")
        if self.min_seeds < 1:
            raise ValueError(f"min_seeds {self.min_seeds} must be >= 1 (the holdout evaluates 3 seeds)")
        if not self.slice_columns:
            raise ValueError("slice_columns is empty: name at least one (e.g. 'slice')")

    def is_hard(self, gate: str) -> bool:
        return gate not in self.soft_gates and gate not in WARNINGS

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> GatePolicy:
        return _from_mapping(cls, d)

    @classmethod
    def from_yaml(cls, path: str | Path) -> GatePolicy:
        """A YAML mapping, or one under a `gates:` key."""
        return cls.from_dict(_load_yaml(path, "gates"))

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class CanaryPolicy:
    share: float = 0.10                  # fraction of fresh tasks routed to the candidate
    min_tasks: int = 20                  # per arm before a decision is made (else "wait")
    max_pass_drop: float = 0.0           # candidate pass rate may trail the champion's by at most this
    hard_gate_tolerance: float = 0.0
    latency_tolerance: float = 0.10
    seed: int = 0                        # routing salt

    def __post_init__(self):
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"canary share {self.share} must be in (0, 1), e.g. 0.1")
        if self.min_tasks < 1:
            raise ValueError(f"min_tasks {self.min_tasks} must be >= 1")
        for k in ("max_pass_drop", "hard_gate_tolerance", "latency_tolerance"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k} must be >= 0, got {getattr(self, k)}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> CanaryPolicy:
        return _from_mapping(cls, d)

    @classmethod
    def from_yaml(cls, path: str | Path) -> CanaryPolicy:
        return cls.from_dict(_load_yaml(path, "canary"))


DEFAULT_BASELINE = "harness:sbfl"
POLICY_FILE = "promotion.yaml"


def policy_file(path: str | Path) -> dict:
    """A promotion policy file (RATCHET_HOME/promotion.yaml by default) as a mapping ({} when
    absent): `gates:`, `canary:`, `baseline:` (the champion while nothing has been promoted) and
    `canary_skip:`."""
    import yaml

    path = Path(path)
    data = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path} must hold a mapping (gates:, canary:, baseline:, canary_skip:)")
    return dict(data)


def baseline_policy_id(root: str | Path) -> str:
    """The champion while nothing has been promoted: promotion.yaml's `baseline`, else the
    SBFL-guided harness (the strongest no-weights baseline Ratchet ships)."""
    return str(policy_file(Path(root) / POLICY_FILE).get("baseline") or DEFAULT_BASELINE)
