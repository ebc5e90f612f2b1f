"""Rollouts over worker processes: each worker runs `run_episodes` (batched generation across its
concurrent episodes, sandbox steps in threads) on a contiguous share of the jobs, with its own
copy of the weights, engine and sandbox runtime.

Why processes: on the embedded model one batched decode step is mostly Python dispatching small
ops, which holds the GIL, so a second torch thread barely helps (bench/rollout.py, 16 x 16: 3.07 s
of generation with 2 threads against 3.28 s with 1) and two engines in two threads of one process
were slower than one (5.73 s against 4.51 s for the same 16 episodes). A second process uses the
second core. The weights go to the workers as `torch.save` bytes on every call (the trainer
updates them between steps; 1M parameters are ~4 MB); the workers start once (spawn: no forked
torch or sandbox state) and keep their model object, runtime and zygote between calls.

    pool = RolloutPool(2, runtime=rt)
    recs = pool.run(model, tokenizer, engine_kw, jobs, concurrency=16, sampling=..., max_turns=12)
    pool.cpu_s                      # the workers' CPU for these calls, sandboxes included
    pool.close()

Records come back in job order and are the same records `run_episodes` gives in one process for
the same jobs (per-row seeded sampling; tests/policy/test_rollout_pool.py). A worker that dies
makes its share run here instead (counted in `pool.fallbacks`): nothing is lost.
"""
from __future__ import annotations

import io
from typing import Sequence

_W: dict = {}          # in a worker: "runtime", "models" (by config), set by _init


def _init(runtime_kw: dict) -> None:
    import torch

    from ratchet.pool_workers import exit_with_parent

    exit_with_parent()                  # a killed trainer leaves no worker stepping sandboxes
    torch.set_num_threads(1)            # one core each: the pool is the parallelism
    _W["runtime_kw"], _W["models"] = runtime_kw, {}


def _runtime():
    if "runtime" not in _W:
        from sandboxes.runtime import LocalRuntime
        _W["runtime"] = LocalRuntime(**_W["runtime_kw"])
    return _W["runtime"]


def _model(cls, config, blob: bytes):
    import torch

    key = (cls.__module__, cls.__qualname__, config.to_json_string())
    model = _W["models"].get(key)
    if model is None:
        model = _W["models"][key] = cls(config).eval()
    model.load_state_dict(torch.load(io.BytesIO(blob), weights_only=True))
    return model


def _shard(args) -> tuple[list, float]:
    from ratchet.policy.engines.transformers_engine import TransformersPolicy
    from ratchet.policy.runner import run_episodes
    from sandboxes.cpu_meter import tree_cpu_s

    cls, config, blob, tok, engine_kw, jobs, kw = args
    policy = TransformersPolicy(_model(cls, config, blob), tok, **engine_kw)
    recs = run_episodes(policy, jobs, runtime=_runtime(), **kw)
    # everything this worker spent since the last report (its start-up included), sandboxes too
    now = tree_cpu_s()
    spent, _W["reported"] = now - _W.get("reported", 0.0), now
    return recs, spent


def split(jobs: Sequence, n: int) -> list[list]:
    """`jobs` in n contiguous shares of near-equal size (a GRPO group's jobs are consecutive, so
    a group stays in one worker, where its episodes share the system turn's KV)."""
    jobs, n = list(jobs), max(1, min(n, len(jobs)))
    q, r = divmod(len(jobs), n)
    out, i = [], 0
    for k in range(n):
        size = q + (k < r)
        out.append(jobs[i:i + size])
        i += size
    return [s for s in out if s]


class RolloutPool:
    def __init__(self, workers: int, *, runtime=None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        from sandboxes.runtime import LocalRuntime

        self.workers = workers
        self.cpu_s, self.fallbacks, self._pool = 0.0, 0, None
        self.last_error: str | None = None
        self.disabled: str | None = None    # why every share now runs here (an error no restart mends)
        self.runtime_kw: dict = {}
        if runtime is not None and type(runtime) is not LocalRuntime:
            # a worker rebuilds the runtime from these settings: only a LocalRuntime's are known
            self.disabled = f"rollout workers rebuild a LocalRuntime, not a {type(runtime).__name__}"
        elif runtime is not None:           # the same root, isolation, hidden paths and test cache
            self.runtime_kw = {"root": str(runtime.root), "isolation": runtime.isolation,
                               "hide": tuple(h for h in runtime.hide if h != str(runtime.root)),
                               "test_cache": str(runtime.test_cache.path) if runtime.test_cache else None}

    def _executor(self):
        if self._pool is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                             initializer=_init, initargs=(self.runtime_kw,))
        return self._pool

    def run(self, model, tokenizer, engine_kw: dict, jobs, *, runtime=None, **kw) -> list:
        """`run_episodes(TransformersPolicy(model, tokenizer, **engine_kw), jobs, **kw)` over the
        workers; `runtime` runs a share here if its worker died."""
        import torch

        from sandboxes.cpu_meter import add_remote

        jobs = list(jobs)
        shares = split(jobs, self.workers)
        if len(shares) <= 1 or self.disabled:
            return self._here(model, tokenizer, engine_kw, jobs, runtime, kw)
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buf)
        blob = buf.getvalue()
        pool = self._executor()
        futs = [pool.submit(_shard, (type(model), model.config, blob, tokenizer, engine_kw, s, kw)) for s in shares]
        out = []
        for share, f in zip(shares, futs):
            try:
                recs, cpu = f.result()
                self.cpu_s += cpu
                add_remote(cpu)         # in this process's tree_cpu_s until the worker is reaped
            except Exception as e:  # noqa: BLE001 - a dead worker: its share runs here, nothing lost
                from concurrent.futures.process import BrokenProcessPool

                self.fallbacks += 1
                self.last_error = f"{type(e).__name__}: {e}"
                if not isinstance(e, BrokenProcessPool):    # e.g. a judge that cannot be pickled
                    self.disabled = self.last_error
                self._discard()
                recs = self._here(model, tokenizer, engine_kw, share, runtime, kw)
            out += recs
        return out

    @staticmethod
    def _here(model, tokenizer, engine_kw, jobs, runtime, kw) -> list:
        from ratchet.policy.engines.transformers_engine import TransformersPolicy
        from ratchet.policy.runner import run_episodes

        return run_episodes(TransformersPolicy(model, tokenizer, **engine_kw), jobs, runtime=runtime, **kw)

    def _discard(self) -> None:
        self._shutdown(cancel=True)

    def terminate(self) -> None:
        """Stop now (Ctrl-C, an error in the trainer): the workers are killed mid-share."""
        if self._pool is not None:
            from ratchet.pool_workers import terminate_pool
            terminate_pool(self._pool)
        self._shutdown(cancel=True)

    def close(self) -> None:
        self._shutdown(cancel=False)

    def _shutdown(self, cancel: bool) -> None:
        """Stop the workers and reap them; what they reported leaves `cpu_meter`'s remote total
        as it arrives in RUSAGE_CHILDREN (never counted twice)."""
        from sandboxes.cpu_meter import children_s, reaped

        if self._pool is not None:
            before = children_s()
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None
            reaped(before)

    def __enter__(self) -> "RolloutPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.terminate() if exc_type is not None else self.close()
