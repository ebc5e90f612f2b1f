"""One candidate, SFT then RL, in one plain call (what the demo and the training assets run).

    res = train_candidate(base_path, rows, out_dir, RecipeSettings.demo(), bundles=train_bundles,
                          runtime=LocalRuntime())
    res.sft.checkpoint, res.rl.checkpoint, res.curves, res.cpu_s
    sft = sft_stage(base_path, rows, out_dir, settings)          # the same, one stage per asset
    rl = rl_stage(sft.checkpoint, curriculum(bundles, rows), out_dir, settings, runtime=rt)

The recipe that made the embedded policy learn (bench/learning.py; its history in docs/experiments/):
- structured calls only: the policy is offered localize, propose_edits, apply_edit, run_tests and
  submit, with the per-turn action mask (`ratchet.policy.action_mask`: the flow, the attempt
  structure that tests every attempt and undoes a failed one), and no free text; observations
  are rendered in the policy's view (`ratchet.policy.embedded.chat.policy_view`);
- SFT on the rows whose every call is one of those tools (the structured production agent's
  trajectories); if there are fewer than `min_structured`, on all rows (other calls are then
  masked out of the loss as calls the offered schemas do not allow);
- GRPO from the SFT checkpoint under the same mask, on `bundles` (train-split tasks: a curriculum
  of tasks the structured agent solved is the caller's choice), larger groups;
- the prior as a feature of the view (`prior_view=True`): each `propose_edits` list is shown in the
  order of a count prior over candidate kinds (`chat.make_view`), fit on TRAIN-split data only:
  `sft_stage(..., prior=fit_prior(train_tasks))` (the bench), or, when no prior is given, from the
  rows themselves (`trajectory_prior`: the kind of each accepted trajectory's passing edit; the
  tenant's `training_set` is consented train-split data). SFT renders with it, RL inherits it
  from the SFT checkpoint, and both checkpoints save it.
Both checkpoints carry `ratchet_decoding.json`, so `make_policy("embedded:<name>", path=...)`
decodes them under the mask and the view they were trained with.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ratchet.policy.runner import TURN_BUDGET


SFT_DATA = ("structured", "all")


@dataclass(frozen=True)
class RecipeSettings:
    # the defaults are the ones bench/learning.py measured (see docs/experiments/)
    sft_epochs: float = 3.0
    sft_lr: float = 3e-3
    sft_batch: int = 4
    sft_max_steps: int = -1            # > 0 overrides sft_epochs (smoke runs, tests)
    sft_max_length: int = 4096
    rl_steps: int = 12                 # 12 x 4 x 8: the best GRPO size bench/learning.py measured (~12 CPU-min)
    rl_tasks_per_step: int = 4
    rl_group_size: int = 8
    rl_lr: float = 1e-3              # bench/learning.py: +5.0 points over SFT (2e-4: +0.0)
    rl_beta: float = 0.04
    # GRPOSettings.turn_cost: among passes the shorter one is preferred (a fail keeps 0). 0.3: on 164
    # problems RL - SFT was +5.6 / +6.1 / +5.0 (recipe seeds 0-2) against +0.6 / -6.1 / -2.8 without
    # it (on 40 problems no gain); measured with bench/rl_variant.py --turn-cost and bench/learning.py,
    # see docs/experiments/
    rl_turn_cost: float = 0.3
    rl_kl_limit: float = 1.0           # a step past this KL to the reference stops the run (GRPOSettings.kl_limit)
    rl_updates_per_step: int = 1       # optimizer steps per batch of rollouts (GRPOSettings.updates_per_step)
    rl_minibatches: int = 1            # optimizer steps per pass over a batch, same CPU (GRPOSettings.minibatches)
    rl_temperature: float = 1.0
    # GRPO rollouts over worker processes (ratchet.policy.rollout_pool): the same records, about the
    # same CPU, generation on both cores (bench/rollout.py, median of 9: 4.41x one at a time
    # against 3.76x in one process; in bench/learning.py ~40 s a GRPO step against ~60)
    rl_rollout_workers: int = min(2, os.cpu_count() or 1)
    max_turns: int = TURN_BUDGET      # the evaluation's too (ratchet.policy.runner)
    max_tokens: int = 96
    min_structured: int = 8
    # which accepted trajectories SFT trains on: "structured" (the rows whose every call is one of
    # the five structured tools, decoded under the structured action mask: what the small
    # from-scratch model learns from) or "all" (every row, each call checked against the
    # environment's whole tool vocabulary, bash and str_replace_editor included; no action mask)
    sft_data: str = "structured"
    choice_only: bool = True           # GRPO loss on the tokens the grammar left a choice at
    masked_logprobs: bool = True       # GRPO's policy is the masked distribution (no mass pushed to invalid tokens)
    seed: int = 0
    threads: int = 1
    prior_view: bool = True            # candidate lists in the train-fit prior's order (chat.make_view)
    # the view names no task (chat.make_view). Off: over 3 recipe seeds its RL - SFT was +1.3
    # [-2.8, +5.4] points (bench/learning.py --hide-task; see docs/experiments/): no reliable gain to
    # trade the issue text for
    hide_task: bool = False
    # rank-relative actions (ratchet.policy.rank_actions): calls name the k-th listed line / row.
    # On: SFT 0.361 = the prior harness's 0.367, SFT - random +12.2 [+2.8, +21.7] (with environment
    # indices: 0.333, +9.4 [0.0, +18.3]; measured with bench/learning.py, see docs/experiments/)
    rank_actions: bool = True
    # the view's tier-progress note (chat.make_view(progress=True), Ranks.progress; rank actions
    # only): "next to list: k." / "tier t listed." after localize and each list
    tier_progress: bool = False
    # the view's pick note (chat.make_view(pick=True), Ranks.pick; rank actions and a prior only):
    # "best untried: line k, index i." on the clean file after each list and undo
    pick_note: bool = False
    # rank 0 names what the notes name (Ranks.followed; with tier_progress and pick_note only)
    follow_notes: bool = False
    sft_overrides: dict = field(default_factory=dict)

    @classmethod
    def demo(cls) -> "RecipeSettings":
        """Sized for `make demo`: a few CPU-minutes on 2 cores with the demo's largest tenant's
        ~36-52 trajectories (SFT ~1.7k tokens per CPU-second measured; RL ~22-33 CPU s per step of
        12 episodes), plus sandbox time."""
        return cls(rl_steps=4, rl_tasks_per_step=2, rl_group_size=6)

    def __post_init__(self):
        if self.sft_data not in SFT_DATA:
            raise ValueError(f"sft_data must be one of {SFT_DATA}, got {self.sft_data!r}")

    def sft(self):
        from ratchet.training.sft import SFTSettings
        return SFTSettings(epochs=self.sft_epochs, learning_rate=self.sft_lr, batch_size=self.sft_batch,
                           max_steps=self.sft_max_steps, max_length=self.sft_max_length, thoughts=False, seed=self.seed, threads=self.threads, overrides=dict(self.sft_overrides))

    def bounds(self):
        """The decoding bounds every stage writes and samples under (GRPO's); also for an SFT-only
        candidate (`rl_steps=0`, whose GRPO settings are not valid)."""
        return replace(self, rl_steps=max(1, self.rl_steps)).grpo().bounds()

    def grpo(self):
        from ratchet.training.grpo_loop import GRPOSettings
        return GRPOSettings(steps=self.rl_steps, tasks_per_step=self.rl_tasks_per_step, group_size=self.rl_group_size,
                            learning_rate=self.rl_lr, beta=self.rl_beta, temperature=self.rl_temperature,
                            max_turns=self.max_turns, max_tokens=self.max_tokens,
                            concurrency=self.rl_tasks_per_step * self.rl_group_size,
                            checkpoint_every=max(1, self.rl_steps // 3), seed=self.seed, threads=self.threads,
                            thought_chars=0, max_string=32,
                            action_mask="structured" if self.sft_data == "structured" else None,
                            choice_only=self.choice_only,
                            masked_logprobs=self.masked_logprobs, updates_per_step=self.rl_updates_per_step,
                            minibatches=self.rl_minibatches,
                            turn_cost=self.rl_turn_cost, kl_limit=self.rl_kl_limit,
                            rollout_workers=self.rl_rollout_workers)


@dataclass
class CandidateResult:
    sft: object                        # ratchet.training.sft.SFTResult
    rl: object                         # ratchet.training.grpo_loop.GRPOResult (None when rl_steps == 0)
    curves: dict                       # stage -> PNG path
    cpu_s: dict                        # stage -> CPU seconds (sft, rl, total)
    n_rows: int
    n_structured: int


def structured_rows(rows) -> list[dict]:
    """The rows whose every call is one of the structured tools, re-offered those tools only."""
    from ratchet.policy.action_mask import STRUCTURED, structured_tools
    from sandboxes.tools import TOOL_SCHEMAS

    tools = structured_tools(TOOL_SCHEMAS)
    out = []
    for r in rows:
        msgs = json.loads(r["messages"]) if isinstance(r["messages"], str) else r["messages"]
        names = [c["function"]["name"] for m in msgs if m.get("role") == "assistant" for c in m.get("tool_calls") or ()]
        if names and all(n in STRUCTURED for n in names):
            out.append({**r, "messages": msgs, "tools": tools})
    return out


def coverage(rows, tools) -> list[dict]:
    """Whether each row trains under `tools` and why not: {record_id, source_format, trains,
    reason ('' when it trains), turns, trainable_turns}. A turn trains unless its call is outside
    the tools or its arguments fail the tool's schema (`chat.prepare`: the grammar could never emit
    it); a row trains when one of its turns does."""
    from ratchet.policy.embedded.chat import prepare

    names = {(t.get("function") or t)["name"] for t in tools}
    out = []
    for r in rows:
        msgs = json.loads(r["messages"]) if isinstance(r["messages"], str) else list(r["messages"] or [])
        turns = [m for m in prepare(msgs, tools) if m["role"] == "assistant"]
        ok = sum(1 for m in turns if m.get("train", True))
        called = {c["function"]["name"] for m in turns for c in m.get("tool_calls") or ()}
        unknown = sorted(called - names)
        reason = "" if ok else "no assistant turn" if not turns else \
            f"calls tools outside the environment's: {', '.join(unknown)}" if unknown else \
            "no call matches its tool's schema"
        out.append({"record_id": r.get("record_id"), "source_format": r.get("source_format") or "unknown",
                    "trains": bool(ok), "reason": reason, "turns": len(turns), "trainable_turns": ok})
    return out


def coverage_summary(entries) -> dict:
    """{source_format: {"trains": n, "not": n, "reasons": {reason: n}}} for metadata and logs."""
    out: dict = {}
    for e in entries:
        f = out.setdefault(e["source_format"], {"trains": 0, "not": 0, "reasons": {}})
        if e["trains"]:
            f["trains"] += 1
        else:
            f["not"] += 1
            f["reasons"][e["reason"]] = f["reasons"].get(e["reason"], 0) + 1
    return dict(sorted(out.items()))


def _offer_structured(rows) -> list[dict]:
    from ratchet.policy.action_mask import structured_tools
    from sandboxes.tools import TOOL_SCHEMAS
    return [{**r, "tools": structured_tools(TOOL_SCHEMAS)} for r in rows]


def trajectory_prior(rows):
    """A count prior from accepted trajectories: per task, the kind of the edit whose tests passed
    (read from the `propose_edits` list it was applied from). For a caller holding only a tenant's
    `training_set` rows (consented, train split): no task outside them can shape it."""
    from ratchet.policy.action_mask import _observations
    from sandboxes.agents.prior import Prior, kind_key
    from sandboxes.observations import parse_applied, parse_candidates, tests_all_passed

    kinds: dict = {}
    for r in rows:
        if r.get("accepted") is False:
            continue
        msgs = json.loads(r["messages"]) if isinstance(r["messages"], str) else r["messages"]
        lists, last, fix = {}, None, None
        for name, args, obs in _observations(msgs):
            if name == "propose_edits" and not obs.startswith("error:"):
                lists[(args.get("path"), args.get("line"))] = dict(parse_candidates(obs))
            elif name == "apply_edit":
                a = parse_applied(obs)
                last = None if a is None else lists.get((a.path, a.line), {}).get(a.index)
            elif name == "run_tests" and last is not None and tests_all_passed(obs):
                fix = last
        if fix is not None and r.get("task_id"):
            kinds.setdefault(r["task_id"], kind_key(fix))
    counts: dict = {}
    for k in kinds.values():
        counts[k] = counts.get(k, 0) + 1
    return Prior.from_counts(counts, sorted(kinds))


def recipe_view(settings: "RecipeSettings", rows, prior=None) -> dict | None:
    """The view SFT renders with and saves: the prior's order (`prior`, fit on train-split tasks;
    else `trajectory_prior(rows)`), or None (the env's order) when `prior_view` is off. With
    `hide_task` the view also names no task, and with `rank_actions` calls name ranks (`chat.make_view`),
    with or without the prior's order."""
    from ratchet.policy.embedded.chat import make_view

    source = ""
    if settings.prior_view:
        if prior is None:
            prior, source = trajectory_prior(rows), "trajectory_prior: accepted train-split trajectories"
        else:
            source = f"fit_prior: {len(prior.task_ids)} train-split tasks"
    # a prior that counted nothing ranks nothing: the env's order, as a checkpoint without a view;
    # which other keys a view holds is make_view's rule alone
    view = make_view(prior if settings.prior_view and prior.counts else None, source=source,
                     hide_task=settings.hide_task, rank=settings.rank_actions, progress=settings.tier_progress,
                     pick=settings.pick_note, follow=settings.follow_notes)
    return view or None


def sft_stage(base_path, rows, out_dir, settings: RecipeSettings = RecipeSettings(), *, prior=None, on_log=None):
    """SFT under the recipe (`sft_data`: structured rows if enough, or every row with the
    environment's whole tool vocabulary; calls only) -> SFTResult with `coverage` (per row: trains
    or why not); the checkpoint carries its decoding config (the structured mask or none,
    calls-only bounds, the view: `recipe_view`).
    `prior`: a count prior fit on train-split tasks (`fit_prior`); None: fit from `rows`. `on_log`: each
    logging step's dict (train_sft)."""
    from ratchet.policy.embedded.decoding import write_decoding
    from ratchet.training.sft import train_sft

    from ratchet.policy.action_mask import structured_tools
    from sandboxes.tools import TOOL_SCHEMAS

    rows = list(rows)
    picked = structured_rows(rows)
    if settings.sft_data == "all":
        # every row with the environment's whole vocabulary: each call is checked against its own
        # tool's schema (bash, str_replace_editor, Ratchet's own); a turn that fails stays context
        offered, action_mask = TOOL_SCHEMAS, None
        data = [{**r, "tools": TOOL_SCHEMAS} for r in rows]
        entries = coverage(rows, TOOL_SCHEMAS)
    else:
        offered, action_mask = structured_tools(TOOL_SCHEMAS), "structured"
        data = picked if len(picked) >= settings.min_structured else _offer_structured(rows)
        kept = {r["record_id"] for r in data}
        entries = [e if e["record_id"] in kept or not e["trains"] else
                   {**e, "trains": False, "reason": "a call outside the structured tools (sft_data: structured)"}
                   for e in coverage(rows, offered)]
    view = recipe_view(settings, rows, prior)
    res = train_sft(base_path, data, out_dir, settings.sft(), view=view, on_log=on_log)
    write_decoding(res.checkpoint, action_mask=action_mask, bounds=settings.bounds(), view=view)
    res.n_structured = len(picked)
    res.view = view
    res.coverage = entries
    res.offered = [t["function"]["name"] for t in offered]
    return res


def rl_stage(sft_path, bundles, out_dir, settings: RecipeSettings = RecipeSettings(), *, runtime=None, judge=None,
             weights=None, on_step=None, resume: bool = True, validation=()):
    """GRPO under the recipe from the SFT checkpoint on `bundles` (train-split tasks; a curriculum
    of tasks the tenant's agents solved gives groups with passes) -> GRPOResult; resumes. The view
    is the SFT checkpoint's (train_grpo reads it from its decoding file). `validation`: val-split
    tasks that choose the step to register (GRPOResult.best)."""
    from ratchet.training.grpo_loop import train_grpo

    return train_grpo(sft_path, list(bundles), out_dir, settings.grpo(), runtime=runtime, judge=judge,
                      weights=weights, resume=resume, on_step=on_step, validation=list(validation))


def curriculum(bundles, rows) -> list:
    """The bundles whose task has an accepted trajectory among `rows` (solved by an agent sometimes:
    GRPO groups on them hold passes); all bundles if none does."""
    solved = {r["task_id"] for r in rows if r.get("task_id")}
    picked = [b for b in bundles if b.task_id in solved]
    return picked or list(bundles)


def train_candidate(base_path, rows, out_dir, settings: RecipeSettings = RecipeSettings(), *, bundles=(),
                    runtime=None, judge=None, weights=None, on_step=None, resume: bool = True,
                    prior=None) -> CandidateResult:
    """SFT on `rows` (one tenant's governed training rows: record_id, messages, tools, ...) from
    `base_path`, then GRPO on `bundles` (train-split TaskBundles) from the SFT checkpoint, both
    under the structured action mask and the recipe's view (`prior`: see `sft_stage`). Writes
    out_dir/sft, out_dir/rl and out_dir/*_curve.png."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    sft = sft_stage(base_path, rows, out / "sft", settings, prior=prior)
    curves = {"sft": str(plot_curve([{"step": i + 1, "loss": v} for i, v in enumerate(sft.losses)],
                                    out / "sft_curve.png", "SFT", ("loss",)))}
    rl = None
    if settings.rl_steps > 0 and bundles:
        rl = rl_stage(sft.checkpoint, bundles, out / "rl", settings, runtime=runtime, judge=judge, weights=weights,
                      on_step=on_step, resume=resume)
        curves["rl"] = str(plot_curve(rl.history, out / "rl_curve.png", "GRPO", ("reward", "pass_rate", "kl", "entropy")))
    cpu = {"sft": sft.cpu_s, "rl": rl.cpu_s if rl else 0.0}
    cpu["total"] = round(cpu["sft"] + cpu["rl"], 3)
    return CandidateResult(sft, rl, curves, cpu, len(rows), sft.n_structured)


def plot_curve(history: list[dict], path, title: str, keys) -> Path:
    """One panel per metric over steps (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(isinstance(h.get(k), (int, float)) for h in history)] or list(keys)[:1]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 2.6), squeeze=False)
    for ax, k in zip(axes[0], keys):
        pts = [(h["step"], h[k]) for h in history if isinstance(h.get(k), (int, float))]
        if pts:
            ax.plot(*zip(*pts), marker=".")
        ax.set_title(f"{title}: {k}", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def with_overrides(settings: RecipeSettings, **kw) -> RecipeSettings:
    return replace(settings, **kw)
