"""Economics: a rate card applied to measured quantities (tokens, sandbox seconds, policy seconds,
verifier runs, training compute), and the scorecard's cost views per policy.

    variable cost per accepted   = variable cost of every episode run / accepted runs
    sample-amortised / accepted  = (variable cost + training investment) / accepted runs
    production-amortised at N    = variable cost per accepted + training investment / N
    break-even runs vs baseline  = ceil(training investment / (baseline's variable per accepted
                                        - candidate's variable per accepted))

"Accepted" = an episode that passed (each seed's run is one unit of production work); infra
failures are not accepted but their compute is paid, so it is in the variable cost. Training
investment is the checkpoint's own measured compute; a warm start it was trained from (SFT before
RL) is reported beside it and left out of the amortisation unless `include_warm_start` (the
reference scorecard's arithmetic does the same: RL 0.94 + 1,180 / 10,000 = $1.06, break-even
1,180 / 0.54 -> 2,186).

Zero accepted runs: every per-accepted view is the string "not computable", never $0.00 (the
numeric columns are NULL). A candidate that is not cheaper per accepted run than the baseline
never breaks even ("never").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

NOT_COMPUTABLE = "not computable"
NEVER = "never"


@dataclass(frozen=True)
class TokenPrice:
    input_per_mtok: float        # USD per million prompt tokens
    output_per_mtok: float       # USD per million completion tokens


@dataclass(frozen=True)
class RateCard:
    """Prices, not results: edit them to your contracts (YAML: `RateCard.from_yaml`).

    `token_prices` keys are policy ids or engine prefixes ("openai" matches "openai:gpt-x"): a
    policy priced per token pays for tokens; any other policy is self-hosted and pays its
    measured policy seconds at the CPU or GPU hourly rate (`devices`, by id or prefix; CPU when
    unnamed). Sandbox seconds are wall seconds of one sandboxed process, billed as CPU-seconds.
    """
    name: str = "default-2026-11"
    token_prices: dict = field(default_factory=dict)      # id or prefix -> TokenPrice
    devices: dict = field(default_factory=dict)           # id or prefix -> "cpu" | "gpu"
    cpu_hour_usd: float = 0.048          # one vCPU-hour, on-demand cloud list price order
    gpu_hour_usd: float = 2.50           # one data-centre GPU-hour
    sandbox_cpu_s_usd: float = 0.048 / 3600
    verifier_run_usd: float = 0.0002     # one pristine verification (fresh sandbox + test run)

    def __post_init__(self):
        prices = {k: v if isinstance(v, TokenPrice) else TokenPrice(**v) for k, v in self.token_prices.items()}
        object.__setattr__(self, "token_prices", prices)
        for k, v in {"cpu_hour_usd": self.cpu_hour_usd, "gpu_hour_usd": self.gpu_hour_usd,
                     "sandbox_cpu_s_usd": self.sandbox_cpu_s_usd, "verifier_run_usd": self.verifier_run_usd,
                     **{f"{k}.input": p.input_per_mtok for k, p in prices.items()},
                     **{f"{k}.output": p.output_per_mtok for k, p in prices.items()}}.items():
            if v is None or v < 0:
                raise ValueError(f"rate card {self.name!r}: {k} = {v} must be a non-negative price")
        bad = {k: d for k, d in self.devices.items() if d not in ("cpu", "gpu")}
        if bad:
            raise ValueError(f"rate card {self.name!r}: devices must be 'cpu' or 'gpu', got {bad}")

    @classmethod
    def from_dict(cls, d: Mapping) -> "RateCard":
        unknown = set(d) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ValueError(f"rate card: unknown keys {sorted(unknown)}")
        return cls(**dict(d))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "RateCard":
        import yaml

        return cls.from_dict(yaml.safe_load(Path(path).read_text()) or {})

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def _lookup(table: Mapping, policy_id: str):
        if policy_id in table:
            return table[policy_id]
        return table.get(policy_id.split(":", 1)[0])

    def token_price(self, policy_id: str) -> TokenPrice | None:
        return self._lookup(self.token_prices, policy_id)

    def device(self, policy_id: str) -> str:
        return self._lookup(self.devices, policy_id) or "cpu"


def episode_cost(card: RateCard, *, policy_id: str, tokens_in: int, tokens_out: int, policy_s: float,
                 sandbox_s: float, verifier_runs: int = 1) -> float:
    """USD for one episode from what it measured."""
    price = card.token_price(policy_id)
    if price is not None:
        policy = tokens_in * price.input_per_mtok / 1e6 + tokens_out * price.output_per_mtok / 1e6
    else:
        hourly = card.gpu_hour_usd if card.device(policy_id) == "gpu" else card.cpu_hour_usd
        policy = max(policy_s, 0.0) * hourly / 3600
    return policy + max(sandbox_s, 0.0) * card.sandbox_cpu_s_usd + verifier_runs * card.verifier_run_usd


def training_investment(card: RateCard, *, cpu_s: float = 0.0, gpu_s: float = 0.0) -> float:
    """USD of a checkpoint's measured training compute."""
    return cpu_s * card.cpu_hour_usd / 3600 + gpu_s * card.gpu_hour_usd / 3600


CHECKPOINT_META = "ratchet_checkpoint.json"    # written by ratchet.training next to the weights


def checkpoint_investment(card: RateCard, folder: str | Path, _depth: int = 0) -> dict:
    """A checkpoint's training investment from the compute its trainer measured (`cpu_s`, and
    `gpu_s` where a GPU was used, in ratchet_checkpoint.json) priced by the card; the chain of
    parents it was warm-started from is the `warm_start_usd`. A folder without the file (a base
    model) cost nothing here."""
    import json

    meta_path = Path(folder) / CHECKPOINT_META
    if _depth > 16 or not meta_path.exists():
        return {"usd": 0.0, "warm_start_usd": 0.0, "cpu_s": 0.0, "gpu_s": 0.0, "stage": None}
    meta = json.loads(meta_path.read_text())
    cpu_s, gpu_s = float(meta.get("cpu_s") or 0.0), float(meta.get("gpu_s") or 0.0)
    parent = checkpoint_investment(card, meta["parent"], _depth + 1) if meta.get("parent") else None
    return {"usd": training_investment(card, cpu_s=cpu_s, gpu_s=gpu_s),
            "warm_start_usd": (parent["usd"] + parent["warm_start_usd"]) if parent else 0.0,
            "cpu_s": cpu_s, "gpu_s": gpu_s, "stage": meta.get("stage")}


@dataclass(frozen=True)
class PolicyCost:
    policy_id: str
    checkpoint_version: str
    episodes: int                 # every episode run (infra failures included: they were paid)
    accepted: int                 # episodes that passed
    variable_usd: float           # summed variable cost of those episodes
    training_usd: float = 0.0     # this checkpoint's own training compute
    warm_start_usd: float = 0.0   # the checkpoint it was trained from (reported beside)


def _per_accepted(pc: PolicyCost) -> float | None:
    return pc.variable_usd / pc.accepted if pc.accepted > 0 else None


def break_even_runs(candidate: PolicyCost, baseline: PolicyCost, *,
                    include_warm_start: bool = False) -> int | str:
    """Accepted runs after which the candidate's training has paid for itself against the
    baseline's variable cost: an int, "never" (not cheaper per run), or "not computable"."""
    vc, vb = _per_accepted(candidate), _per_accepted(baseline)
    if vc is None or vb is None:
        return NOT_COMPUTABLE
    invest = candidate.training_usd + (candidate.warm_start_usd if include_warm_start else 0.0)
    saving = vb - vc
    if invest <= 0:
        return 0 if saving >= 0 else NEVER
    if saving <= 0:
        return NEVER
    # round(., 9) first: 1180 / (1.48 - 0.94) is 2185.185..., but float noise must not push an
    # exact quotient such as 1000 / 0.5 up to 2001.
    return int(math.ceil(round(invest / saving, 9)))


def money(x: float | None) -> str:
    """$1,234.56; below a cent with 3 significant digits ($0.000412) so it never reads $0.00."""
    if x is None:
        return NOT_COMPUTABLE
    if x != 0 and abs(x) < 0.01:
        return f"${x:.3g}" if abs(x) >= 1e-4 else f"${x:.2e}"
    return f"${x:,.2f}"


def economics_row(pc: PolicyCost, baseline: PolicyCost | None = None, *, production_n: int = 10_000,
                  include_warm_start: bool = False) -> dict:
    """One `economics` row: numeric columns (NULL when not computable) + display strings."""
    if production_n <= 0:
        raise ValueError(f"production_n must be positive, got {production_n}")
    invest = pc.training_usd + (pc.warm_start_usd if include_warm_start else 0.0)
    per = _per_accepted(pc)
    sample = (pc.variable_usd + invest) / pc.accepted if pc.accepted > 0 else None
    prod = per + invest / production_n if per is not None else None
    if baseline is None or (baseline.policy_id, baseline.checkpoint_version) == (pc.policy_id, pc.checkpoint_version):
        be: int | str | None = None
    else:
        be = break_even_runs(pc, baseline, include_warm_start=include_warm_start)
    return {
        "policy_id": pc.policy_id, "checkpoint_version": pc.checkpoint_version,
        "episodes": pc.episodes, "accepted_runs": pc.accepted,
        "variable_usd_total": pc.variable_usd, "training_usd": pc.training_usd,
        "warm_start_usd": pc.warm_start_usd, "include_warm_start": include_warm_start,
        "production_n": production_n,
        "variable_per_accepted_usd": per, "sample_amortised_usd": sample, "production_amortised_usd": prod,
        "break_even_runs": be if isinstance(be, int) else None,
        "baseline_policy_id": baseline.policy_id if baseline else None,
        "computable": per is not None,
        "variable_per_accepted": money(per), "sample_amortised": money(sample),
        "production_amortised": money(prod),
        "training_investment": ("$0" if pc.training_usd == 0 else money(pc.training_usd))
                               + (f" (+{money(pc.warm_start_usd)} warm start)" if pc.warm_start_usd else ""),
        "break_even": ("baseline" if be is None and baseline is not None else "" if be is None
                       else f"{be:,} runs" if isinstance(be, int) else be),
    }


def policy_costs(rows, card: RateCard, training: Mapping[str, Mapping] | None = None) -> list[PolicyCost]:
    """PolicyCost per (policy_id, checkpoint_version) from eval_episodes rows. `training` maps a
    policy id (or "policy_id@checkpoint") to {"cpu_s", "gpu_s", "usd", "warm_start_usd"} measured
    by its trainer; "usd" wins over seconds when given."""
    from collections import defaultdict

    acc: dict = defaultdict(lambda: [0, 0, 0.0])
    for r in rows:
        k = (r["policy_id"], r.get("checkpoint_version") or "")
        cost = r.get("cost_usd")
        if cost is None:
            cost = episode_cost(card, policy_id=r["policy_id"], tokens_in=r.get("tokens_in") or 0,
                                tokens_out=r.get("tokens_out") or 0, policy_s=r.get("policy_s") or 0.0,
                                sandbox_s=r.get("sandbox_s") or 0.0)
        acc[k][0] += 1
        acc[k][1] += int(r["outcome"] == "pass")
        acc[k][2] += cost
    out = []
    for (pid, ver), (n, a, usd) in sorted(acc.items()):
        t = (training or {}).get(f"{pid}@{ver}") or (training or {}).get(pid) or {}
        own = t["usd"] if "usd" in t else training_investment(card, cpu_s=t.get("cpu_s", 0.0),
                                                              gpu_s=t.get("gpu_s", 0.0))
        out.append(PolicyCost(pid, ver, n, a, usd, float(own), float(t.get("warm_start_usd", 0.0))))
    return out
