"""Multi-turn GRPO in the sandbox: rollouts through the policy runner, one update per batch.

    res = train_grpo(start_checkpoint, bundles, out_dir, GRPOSettings(steps=20), runtime=rt)
    res.checkpoint, res.history, res.cpu_s, res.batches

Each step: `tasks_per_step` tasks (a seeded, epoch-wise shuffle of the task ids: the data order is a
function of (seed, step) only) x `group_size` episodes through `ratchet.policy.runner.run_episodes`
with a `TransformersPolicy` over the live model (constrained decoding: every call valid);
the composed verifier's reward from each record; `grpo.group_advantages` per task (infra
failures excluded and counted); each episode's exact sampled ids (`training_sequence`: no
re-tokenising) with tool output masked; `grpo.token_loss` (clipped surrogate + k3 KL to a frozen
reference) and one AdamW step. Every `checkpoint_every` steps: model, tokenizer, optimizer, RNG
states, step and data cursor, written atomically; `resume=True` continues from the last one, and
the next batch is the one an uninterrupted run would have drawn (tests/training/test_grpo_loop.py).

Why a hand-written loop and not TRL's GRPOTrainer(rollout_func) (TRL 1.16, checked here):
- `rollout_func(prompts, trainer)` receives only the prompts, already repeated `num_generations`
  times; other dataset columns never reach it (verified against TRL 1.16). A sandbox episode needs its
  task bundle and an episode seed, which would have to be smuggled through the message text and
  parsed back, and the per-episode seeds would come from the HF sampler's hidden state rather
  than from an explicit cursor that a resume test can compare.
- Measured on a 2-core CPU machine (TRL 1.16, 0.8M-param model, batch 8): TRL GRPO
  0.6-0.7 steps/s, generation ~75% of the step, and a hand-written loop 10-15% faster. Here the
  rollout is the sandbox runner's batched multi-turn engine anyway, so TRL would contribute the
  ~30 lines of `token_loss` we already test by hand, at the cost of an experimental API.
- TRL 1.16 does mask all-None reward rows out of the group baseline (grpo_trainer.py,
  `unscorable_mask`), so infra failures are handled the same way in both; this loop also counts
  them per step.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

CHECKPOINT_META = "ratchet_checkpoint.json"
STATE = "trainer_state.pt"
LAST = "LAST"
ADAPTER = "adapter"                    # a LoRA run's adapter inside each step checkpoint (what resume loads)


@dataclass(frozen=True)
class GRPOSettings:
    steps: int = 20
    tasks_per_step: int = 4
    group_size: int = 4
    learning_rate: float = 1e-4
    beta: float = 0.04                 # KL weight to the frozen reference
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    max_tokens: int = 128              # per turn; must cover the grammar's longest call (else truncated calls:
                                       # measured 56 of ~400 calls cut at 64 tokens with 64-char strings)
    max_turns: int = 12                # episode turn budget (the expert needs ~7 calls)
    concurrency: int = 16
    checkpoint_every: int = 5
    seed: int = 0
    threads: int = 1                   # see docs/training.md: 1 thread beat 2 here
    thought_chars: int = 0             # grammar bounds (calls only by default; docs/training.md)
    max_string: int = 32
    max_items: int = 2
    max_int: int = 99_999              # a smaller bound puts line numbers / indices within reach
    action_mask: str | None = None     # "structured": ratchet.policy.action_mask narrows each turn's grammar
    choice_only: bool = False          # loss only on tokens where the grammar left a choice (build_update)
    masked_logprobs: bool = False      # policy = the grammar-masked distribution (sampler and trainer)
    # GRPO's reward for a passing episode, scaled by (1 - turn_cost * turns / max_turns): among
    # passes, the shorter one is preferred (a fix found sooner leaves turns for another attempt
    # under the same budget). A failing episode keeps its 0: a pass always beats a fail, and
    # ending a failing episode sooner earns nothing. 0 = the verifier's value unchanged.
    turn_cost: float = 0.0
    updates_per_step: int = 1          # optimizer steps per batch of rollouts (TRL's num_iterations, PPO's
                                       # epochs): after the first the ratio to the sampler's logprobs moves
                                       # off 1 and the clip bounds how far the batch can pull the policy
    # optimizer steps per pass over a batch of rollouts: its sequences in this many consecutive
    # chunks (whole groups when it divides tasks_per_step), each its own token-mean loss and AdamW
    # step (TRL's steps_per_generation, PPO's minibatches). The same forward and backward passes as
    # one step, so the same CPU, but k times the optimizer steps; after the first chunk the ratio to
    # the sampler's logprobs leaves 1 and the clip bounds how far a chunk pulls the policy.
    minibatches: int = 1
    # "auto": a peft LoRA adapter (no dropout: the update's forward must give the sampler's logprobs)
    # when the start has > 50M parameters, full training otherwise; "on" / "off" force it. With an
    # adapter the reference is the same model with the adapter off (no second copy), the rollouts run
    # on a merged copy, and each checkpoint holds merged weights plus the adapter (for resume).
    lora: str = "auto"
    rollout_workers: int = 1           # >1: each step's episodes over that many worker processes
                                       # (ratchet.policy.rollout_pool: the same records, generation on
                                       # every core; bench/rollout.py)
    # A step whose KL to the reference exceeds `kl_limit` (or whose mean entropy falls under
    # `entropy_floor`) stops the run before anything of it is saved: the policy has left the region
    # the reference vouches for (a run that collapsed was seen to jump from KL 0.0 to 1.79 in one
    # step while its reward fell to 0). 0 turns either check off.
    kl_limit: float = 1.0
    entropy_floor: float = 0.0
    # "auto": CUDA when torch sees a GPU (the update's forward and backward in bf16 autocast where
    # the GPU has it, the rollouts in-process on the same GPU), else the CPU; "cpu" / "cuda" force it
    # (ratchet.training.device: "cuda" without a GPU is an error, never a silent CPU run)
    device: str = "auto"

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: a group of one has no baseline")
        if min(self.steps, self.tasks_per_step, self.checkpoint_every, self.max_tokens, self.max_turns,
               self.updates_per_step, self.minibatches, self.rollout_workers) < 1:
            raise ValueError("steps, tasks_per_step, checkpoint_every, max_tokens, max_turns, updates_per_step, "
                             "minibatches and rollout_workers must be >= 1")
        from ratchet.policy.embedded.model import LORA_MODES
        if self.lora not in LORA_MODES:
            raise ValueError(f"lora must be one of {LORA_MODES}")
        if not 0.0 <= self.turn_cost < 1.0:
            raise ValueError("turn_cost must be in [0, 1): a passing episode must keep a positive reward")
        if self.learning_rate <= 0 or self.temperature <= 0 or self.beta < 0:
            raise ValueError("learning_rate and temperature must be > 0, beta >= 0")
        if self.kl_limit < 0 or self.entropy_floor < 0:
            raise ValueError("kl_limit and entropy_floor must be >= 0 (0: off)")
        from ratchet.training.device import DEVICES
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")

    def bounds(self):
        from ratchet.policy.grammar import Bounds
        return Bounds(thought_chars=self.thought_chars, max_string=self.max_string, max_items=self.max_items,
                      max_int=self.max_int)


@dataclass
class GRPOResult:
    checkpoint: Path
    history: list[dict]                # one row per step: loss, reward, kl, pass_rate, entropy, ...
    checkpoints: list[Path]
    batches: list[list[tuple[str, int]]]    # (task_id, episode seed) per step run in this call
    cpu_s: float                       # this process + its sandboxes, all steps so far (resumes add up)
    wall_s: float
    parent: str
    task_ids: list[str] = field(default_factory=list)
    # the step checkpoint to register: the best greedy pass rate on the validation tasks (ties: the
    # earliest step), or the last one when no validation tasks were given
    best: Path | None = None
    stopped: str | None = None         # why the run stopped early (KL or entropy), None if it did not


# ---------------------------------------------------------------- data order
def step_batch(task_ids: Sequence[str], settings: GRPOSettings, step: int) -> list[tuple[str, int]]:
    """The (task_id, episode seed) jobs of `step`: tasks drawn in order from a stream of seeded
    shuffles of the sorted ids (one per epoch), each repeated `group_size` times with its own
    seeds. A pure function of (ids, seed, step): the data cursor is the step."""
    ids = sorted(task_ids)
    if not ids:
        raise ValueError("no tasks to train on")
    k = settings.tasks_per_step
    jobs = []
    for pos in range(step * k, (step + 1) * k):
        epoch, i = divmod(pos, len(ids))
        order = list(ids)
        random.Random(settings.seed * 1_000_003 + epoch).shuffle(order)
        for j in range(settings.group_size):
            jobs.append((order[i], (settings.seed * 7919 + pos * 101 + j) % (2**31 - 1)))
    return jobs


# ---------------------------------------------------------------- one update
def shaped_reward(record, turn_cost: float = 0.0, max_turns: int | None = None) -> float | None:
    """The reward GRPO's advantages use: the verifier's value (None for an infra failure), and for
    a scored pass (value > 0) scaled by 1 - turn_cost * min(turns, max_turns) / max_turns."""
    v = record.reward
    if v is None or v <= 0 or not turn_cost or not max_turns:
        return v
    return v * (1.0 - turn_cost * min(record.turns, max_turns) / max_turns)


def build_update(records, group_size: int, choice_only: bool = False, turn_cost: float = 0.0,
                 max_turns: int | None = None) -> tuple[list[dict], dict]:
    """Episodes of one step -> the sequences to train on and the step's counts. Each sequence:
    `input_ids` (prompt + completion), `mask` (1 at sampled tokens, over input_ids), `old_logprobs`
    (the sampler's, aligned with input_ids), `advantage`, `task_id`, `seed`. Infra failures get no
    advantage and are left out (counted); so are episodes without token ids (counted).
    `choice_only`: train only on tokens where the grammar left a choice (the policy decided
    nothing at a forced token; under the action mask most sampled tokens are forced, and their
    gradients, the same in passing and failing episodes, carry no signal about a decision).
    `turn_cost`: the advantages come from `shaped_reward` (the step's `reward` stays the verifier's)."""
    from ratchet.policy.runner import training_sequence
    from ratchet.training.grpo import group_advantages

    adv, counts = group_advantages([shaped_reward(r, turn_cost, max_turns) for r in records], group_size)
    seqs, no_tokens = [], 0
    for r, a in zip(records, adv):
        if a is None:
            continue
        s = training_sequence(r)
        m = None if s is None else (s["choice_mask"] if choice_only else s["env_mask"])
        if s is None or not any(m):
            no_tokens += 1
            continue
        p = len(s["prompt_ids"])
        seqs.append({"input_ids": s["prompt_ids"] + s["completion_ids"], "mask": [0] * p + m,
                     "allowed": [None] * p + s["allowed"] if s.get("allowed") is not None else None,
                     "old_logprobs": [0.0] * p + s["logprobs"], "advantage": a, "task_id": r.task_id,
                     "seed": r.seed})
    scored = [r for r in records if r.reward is not None]
    counts.update(no_tokens=no_tokens, trained=len(seqs),
                  reward=sum(r.reward for r in scored) / len(scored) if scored else None,
                  pass_rate=sum(r.passed for r in scored) / len(scored) if scored else None)
    return seqs, counts


def _token_logprobs(model, ids, temperature: float, allowed=None):
    """log p(ids[t] | ids[<t]) at every position t >= 1 (position 0 gets 0), and the entropy of
    each predictive distribution, at the sampler's temperature. `allowed[t]` (ids, or None): at
    those positions the distribution is the grammar-masked one, renormalised over the allowed ids
    (what the constrained sampler drew from, when it recorded them)."""
    import torch

    dev = next(model.parameters()).device
    x = torch.tensor([ids], device=dev)
    with _autocast(dev):
        logits = model(input_ids=x).logits[0, :-1].float() / temperature
    if allowed is not None:
        rows = [t - 1 for t in range(1, len(ids)) if allowed[t]]
        if rows:
            keep = torch.zeros(len(rows), logits.shape[-1], dtype=torch.bool)
            for i, t in enumerate(rows):
                keep[i, allowed[t + 1]] = True
            keep, idx = keep.to(dev), torch.tensor(rows, device=dev)
            logits = logits.index_put((idx,), logits[idx].masked_fill(~keep, float("-inf")))
    logp_all = torch.log_softmax(logits, -1)
    lp = logp_all.gather(1, x[0, 1:].unsqueeze(1)).squeeze(1)
    ent = -(logp_all.exp() * logp_all.clamp_min(-1e30)).sum(-1)
    zero = torch.zeros(1, device=dev)
    return torch.cat([zero, lp]), torch.cat([zero, ent.detach()])


def _autocast(dev):
    """bf16 autocast on a GPU that has it (the logits are taken back to float32); nothing on the CPU,
    where the update stays float32 as every test measures it."""
    import torch

    if dev.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def minibatches(seqs: list[dict], k: int) -> list[list[dict]]:
    """`seqs` in at most `k` consecutive, non-empty chunks of near-equal size (build_update keeps
    each group's sequences together, so chunks hold whole groups when k divides the groups)."""
    n = len(seqs)
    return [c for c in (seqs[i * n // k:(i + 1) * n // k] for i in range(k)) if c]


def grpo_update(model, ref_model, optimizer, seqs: list[dict], settings: GRPOSettings) -> dict:
    """`ref_model` None: `model` is a peft model and its reference is itself with the adapter off.
    `settings.updates_per_step` passes over `seqs` (from build_update), each in
    `settings.minibatches` chunks with one optimizer step per chunk: token-mean loss over the
    chunk's policy tokens, accumulated one sequence at a time (memory stays one sequence). The
    reference's logprobs are computed once per batch (its weights are frozen). Stats: loss, KL
    and entropy of the first pass (token-weighted over the batch), logprob gap and grad norm of the
    first chunk (ratio 1: the sampler's weights); `clip_fraction` over every later chunk and pass
    (0 with one update of one chunk); `optimizer_steps`."""
    import torch

    from ratchet.training.grpo import token_loss

    n_tok = sum(sum(s["mask"]) for s in seqs)
    stats = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "policy_tokens": n_tok,
             "logprob_gap": 0.0, "grad_norm": 0.0, "optimizer_steps": 0}
    if not seqs or n_tok == 0:
        return stats
    model.train()
    refs: dict = {}
    chunks = minibatches(seqs, settings.minibatches)
    clipped = later_tok = 0.0
    for it in range(settings.updates_per_step):
        for ci, chunk in enumerate(chunks):
            first = it == 0 and ci == 0
            c_tok = sum(sum(s["mask"]) for s in chunk)
            if c_tok == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            for s in chunk:
                k = sum(s["mask"])
                lp, ent = _token_logprobs(model, s["input_ids"], settings.temperature, s.get("allowed"))
                if id(s) not in refs:
                    ref = model if ref_model is None else ref_model
                    with torch.no_grad(), (model.disable_adapter() if ref_model is None else nullcontext()):
                        refs[id(s)] = _token_logprobs(ref, s["input_ids"], settings.temperature, s.get("allowed"))[0]
                mask = torch.tensor([s["mask"]], device=lp.device)
                old = torch.tensor([s["old_logprobs"]], dtype=lp.dtype, device=lp.device)
                loss, st = token_loss(lp.unsqueeze(0), old, refs[id(s)].unsqueeze(0),
                                      torch.tensor([float(s["advantage"])], device=lp.device), mask,
                                      clip_eps=settings.clip_eps,
                                      beta=settings.beta)
                (loss * (k / c_tok)).backward()
                if not first:
                    clipped += st["clip_fraction"] * k
                    later_tok += k
                if it:
                    continue
                w, m = k / n_tok, mask[0].bool()
                stats["loss"] += float(loss.detach()) * w
                stats["kl"] += st["kl"] * w
                stats["entropy"] += float(ent[m].mean()) * w
                if first:
                    # the sampler's logprobs vs this forward pass on the same weights (should be ~0)
                    stats["logprob_gap"] = max(stats["logprob_gap"], float((lp.detach()[m] - old[0][m]).abs().max()))
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm))
            if first:
                stats["grad_norm"] = norm
            optimizer.step()
            stats["optimizer_steps"] += 1
    stats["clip_fraction"] = clipped / later_tok if later_tok else 0.0
    model.eval()
    return stats


# ---------------------------------------------------------------- checkpoints
def _cpu_now() -> float:
    """CPU seconds of this process and of every sandbox it ran, including the pytest workers that
    die unwaited-for or are reaped by the zygote (`sandboxes.cpu_meter`): rusage alone missed 10-40
    of 90-120 machine CPU-s over 2 GRPO steps."""
    from sandboxes.cpu_meter import tree_cpu_s
    return tree_cpu_s()


def save_checkpoint(out_dir: Path, step: int, model, tokenizer, optimizer, meta: dict) -> Path:
    """out_dir/step-NNNNN: weights + tokenizer + optimizer + RNG + step/cursor + meta; written to a
    temporary folder and renamed, then LAST points at it (a kill leaves the previous one intact)."""
    import torch

    final = out_dir / f"step-{step:05d}"
    tmp = out_dir / f".tmp-step-{step:05d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    from ratchet.policy.embedded.model import has_adapter, merged

    merged(model).save_pretrained(str(tmp))       # plain weights: evaluation loads them without peft
    if has_adapter(model):
        model.save_pretrained(str(tmp / ADAPTER))  # the adapter alone: what resume continues from
    tokenizer.save_pretrained(str(tmp))
    torch.save({"step": step, "cursor": step, "optimizer": optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}, tmp / STATE)
    (tmp / CHECKPOINT_META).write_text(json.dumps(meta, indent=1, default=str))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (out_dir / (LAST + ".tmp")).write_text(final.name)
    (out_dir / (LAST + ".tmp")).replace(out_dir / LAST)
    return final


def last_checkpoint(out_dir: str | Path) -> Path | None:
    p = Path(out_dir) / LAST
    return Path(out_dir) / p.read_text().strip() if p.exists() else None


# ---------------------------------------------------------------- the loop
def train_grpo(start: str | Path, bundles: Sequence, out_dir: str | Path, settings: GRPOSettings = GRPOSettings(),
               *, runtime=None, judge=None, weights=None, resume: bool = True, stop_after: int | None = None,
               on_step: Callable[[dict], None] | None = None, validation: Sequence = ()) -> GRPOResult:
    """GRPO from checkpoint `start` on `bundles` (train-split tasks). `stop_after=k` ends the call
    after step k (as a kill would after that step's checkpoint); `resume` continues from out_dir's
    last checkpoint. `on_step(row)` gets each step's metrics (MLflow logging). The observation view
    is the start checkpoint's (`decoding.read_view`): RL samples and saves what SFT rendered.
    `validation`: tasks never trained on (the val split, never the holdout); at each checkpoint the
    weights' greedy pass rate on them is its row's `val_pass`, and `GRPOResult.best` is the step
    to register. A step that blows up (`blown_up`) ends the run unsaved (`GRPOResult.stopped`)."""
    import copy

    import torch

    from ratchet.policy.embedded.decoding import read_view
    from ratchet.policy.embedded.model import load_policy, maybe_lora, merged
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from ratchet.policy.rollout_pool import RolloutPool
    from ratchet.policy.runner import Sampling, run_episodes
    from ratchet.training.device import resolve_device
    from ratchet.training.quiet import quiet_libraries

    quiet_libraries()          # no weight-loading bars here or in the rollout workers
    device = resolve_device(settings.device)
    torch.set_num_threads(settings.threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_id = {b.task_id: b for b in bundles}
    view = read_view(start)
    task_ids = sorted(by_id)
    last = last_checkpoint(out) if resume else None
    model, tok = load_policy(start)
    model, lora = maybe_lora(model.to(device), settings.lora, seed=settings.seed, dropout=0.0)
    if lora:
        ref_model = None                              # the adapter off (grpo_update)
        if last:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file
            set_peft_model_state_dict(model, load_file(str(last / ADAPTER / "adapter_model.safetensors")))
    else:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if last:
            model, _ = load_policy(last)
            model = model.to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate,
                                  weight_decay=0.0)
    first, history, cpu_before, wall_before = 0, [], 0.0, 0.0
    if last:
        st = torch.load(last / STATE, weights_only=False)
        optimizer.load_state_dict(st["optimizer"])
        torch.set_rng_state(st["torch_rng"])
        random.setstate(st["python_rng"])
        first = st["cursor"]
        meta = json.loads((last / CHECKPOINT_META).read_text())
        history, cpu_before, wall_before = meta["history"], meta["cpu_s"], meta["wall_s"]
    model.eval()
    c0, t0 = _cpu_now(), time.monotonic()
    batches, saved = [], []
    sampling = Sampling(temperature=settings.temperature, max_tokens=settings.max_tokens)
    rkw = {"concurrency": settings.concurrency, "sampling": sampling, "judge": judge, "weights": weights,
           "max_turns": settings.max_turns, "min_batch": settings.concurrency}
    # worker processes share the CPU's cores; on a GPU the rollouts batch on the GPU in this process
    pool = RolloutPool(settings.rollout_workers, runtime=runtime) \
        if settings.rollout_workers > 1 and device == "cpu" else None
    try:
        for step in range(first, settings.steps):
            s0, w0 = _cpu_now(), time.monotonic()
            jobs = step_batch(task_ids, settings, step)
            batches.append(jobs)
            # a fresh engine per step: its KV caches hold activations of the weights before the update
            engine = {"policy_id": f"grpo:{step}", "constrained": True, "chat": "embedded",
                      "grammar": {"bounds": settings.bounds()}, "action_mask": settings.action_mask,
                      "masked_logprobs": settings.masked_logprobs, **({"view": view} if view else {})}
            ep_jobs = [(by_id[t], s) for t, s in jobs]
            actor = merged(model)          # with an adapter: a plain copy to sample from (and ship to workers)
            recs = pool.run(actor, tok, engine, ep_jobs, runtime=runtime, **rkw) if pool else \
                run_episodes(TransformersPolicy(actor, tok, **engine), ep_jobs, runtime=runtime, **rkw)
            del actor
            r0 = time.monotonic()
            seqs, counts = build_update(recs, settings.group_size, settings.choice_only,
                                        settings.turn_cost, settings.max_turns)
            stats = grpo_update(model, ref_model, optimizer, seqs, settings)
            row = {"step": step + 1, **counts, **stats, "rollout_s": round(r0 - w0, 3),
                   "update_s": round(time.monotonic() - r0, 3), "step_s": round(time.monotonic() - w0, 3),
                   "cpu_s": round(_cpu_now() - s0, 3), "task_ids": sorted({t for t, _ in jobs})}
            stopped = blown_up(stats, settings, step + 1)
            if stopped:
                row["stopped"] = stopped
            history.append(row)
            if on_step:
                on_step(row)
            if stopped:
                break
            done = step + 1
            if done % settings.checkpoint_every == 0 or done == settings.steps or done == stop_after:
                if validation:
                    row["val_pass"] = validation_pass(model, tok, engine, validation, settings, runtime=runtime,
                                                      judge=judge, weights=weights)
                meta = {"stage": "rl", "parent": str(start), "settings": asdict(settings), "step": done,
                        "history": history, "cpu_s": round(cpu_before + _cpu_now() - c0, 3),
                        "wall_s": round(wall_before + time.monotonic() - t0, 3), "task_ids": task_ids}
                saved.append(save_checkpoint(out, done, model, tok, optimizer, meta))
                from ratchet.policy.embedded.decoding import write_decoding
                write_decoding(saved[-1], action_mask=settings.action_mask, bounds=settings.bounds(), view=view)
            if stop_after is not None and done >= stop_after:
                break
    except BaseException:
        if pool is not None:
            pool.terminate()            # Ctrl-C mid-step: do not wait for the workers' shares
        raise
    finally:
        if pool is not None:
            pool.close()
    final = last_checkpoint(out) or Path(start)
    stopped = next((h["stopped"] for h in history if h.get("stopped")), None)
    return GRPOResult(checkpoint=final, history=history, checkpoints=saved, batches=batches,
                      cpu_s=round(cpu_before + _cpu_now() - c0, 3), wall_s=round(wall_before + time.monotonic() - t0, 3),
                      parent=str(start), task_ids=task_ids, best=best_checkpoint(out) or final, stopped=stopped)


def blown_up(stats: dict, settings: GRPOSettings, step: int) -> str | None:
    """Why this step's statistics say the run left the reference's region (None: they do not)."""
    if settings.kl_limit and stats.get("kl", 0.0) > settings.kl_limit:
        return f"stopped at step {step}: KL to the reference {stats['kl']:.3g} > kl_limit {settings.kl_limit}"
    if settings.entropy_floor and stats.get("policy_tokens") and stats.get("entropy", 0.0) < settings.entropy_floor:
        return f"stopped at step {step}: entropy {stats['entropy']:.3g} < entropy_floor {settings.entropy_floor}"
    return None


def validation_pass(model, tok, engine: dict, bundles: Sequence, settings: GRPOSettings, *, runtime=None,
                    judge=None, weights=None) -> float | None:
    """Greedy pass rate of the current weights on `bundles` (seed 0, the training turn budget and
    decoding): what picks the step to register. None when every episode was an infra failure."""
    from ratchet.policy.embedded.model import merged
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from ratchet.policy.runner import Sampling, run_episodes

    actor = merged(model)
    policy = TransformersPolicy(actor, tok, **{**engine, "policy_id": "grpo:validation"})
    recs = run_episodes(policy, [(b, 0) for b in bundles], runtime=runtime, judge=judge, weights=weights,
                        sampling=Sampling(temperature=0.0, max_tokens=settings.max_tokens),
                        max_turns=settings.max_turns, concurrency=settings.concurrency)
    scored = [r for r in recs if r.reward is not None]
    return round(sum(bool(r.passed) for r in scored) / len(scored), 4) if scored else None


def best_checkpoint(out_dir: str | Path) -> Path | None:
    """The saved step with the highest validation pass rate (ties: the earliest step: the fewest
    updates away from the reference), or None when no step has one."""
    best = None
    for d in sorted(Path(out_dir).glob("step-*")):
        meta_file = d / CHECKPOINT_META
        if not d.is_dir() or not meta_file.exists():
            continue
        meta = json.loads(meta_file.read_text())
        row = next((h for h in meta.get("history", []) if h.get("step") == meta.get("step")), {})
        v = row.get("val_pass")
        if v is not None and (best is None or v > best[0]):
            best = (v, d)
    return best[1] if best else None


def main(argv=None) -> int:
    """Measure GRPO from a checkpoint on train-split HumanEval repair tasks (even problem numbers,
    as ratchet.training.measure_sft splits them); prints one line per step and a JSON summary.

        .venv/bin/python -m ratchet.training.grpo_loop --start /tmp/trn/measure4/sft --steps 12
    """
    import argparse

    ap = argparse.ArgumentParser(description="GRPO measurement run")
    ap.add_argument("--start", required=True)
    ap.add_argument("--out", default="/tmp/ratchet-grpo-measure")
    ap.add_argument("--problems", type=int, default=30)
    for k, v in (("steps", 12), ("tasks_per_step", 4), ("group_size", 4), ("max_turns", 12), ("max_tokens", 128),
                 ("concurrency", 16), ("checkpoint_every", 4), ("seed", 0)):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--fresh", action="store_true", help="ignore checkpoints in --out")
    a = ap.parse_args(argv)

    from sandboxes.humaneval import build_suite
    from sandboxes.runtime import LocalRuntime

    suite = build_suite(seed=0, limit=a.problems)
    train = [b for b in suite.tasks if int(str(b.metadata.get("problem_id", "x/0")).split("/")[-1]) % 2 == 0]
    s = GRPOSettings(steps=a.steps, tasks_per_step=a.tasks_per_step, group_size=a.group_size, max_turns=a.max_turns,
                     max_tokens=a.max_tokens, concurrency=a.concurrency, checkpoint_every=a.checkpoint_every,
                     seed=a.seed, learning_rate=a.lr, beta=a.beta)
    if a.fresh:
        shutil.rmtree(a.out, ignore_errors=True)
    keys = ("step", "reward", "pass_rate", "loss", "kl", "entropy", "infra_failures", "flat_groups", "policy_tokens",
            "logprob_gap", "rollout_s", "update_s", "step_s", "cpu_s")
    res = train_grpo(a.start, train, a.out, s, runtime=LocalRuntime(), resume=not a.fresh,
                     on_step=lambda r: print(json.dumps({k: (round(r[k], 4) if isinstance(r[k], float) else r[k])
                                                         for k in keys}), flush=True))
    h = res.history
    print(json.dumps({"steps": len(h), "train_tasks": len(train), "cpu_s": res.cpu_s, "wall_s": res.wall_s,
                      "mean_step_s": round(sum(x["step_s"] for x in h) / len(h), 2),
                      "reward_by_step": [x["reward"] for x in h], "pass_by_step": [x["pass_rate"] for x in h],
                      "infra_failures": sum(x["infra_failures"] for x in h), "checkpoint": str(res.checkpoint)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
