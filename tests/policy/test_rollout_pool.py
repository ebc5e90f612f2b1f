"""RolloutPool: episodes over worker processes give the same records as one process, in job order,
report the workers' CPU (sandboxes included), and a dead worker's share runs in the caller."""
import pytest

from ratchet.policy import Sampling, run_episodes
from ratchet.policy.engines.transformers_engine import TransformersPolicy
from ratchet.policy.rollout_pool import RolloutPool, split

pytestmark = pytest.mark.training

SAMPLING = Sampling(temperature=1.0, max_tokens=10)


def test_split_keeps_order_and_balances():
    assert split(list(range(7)), 2) == [[0, 1, 2, 3], [4, 5, 6]]
    assert split([1, 2], 4) == [[1], [2]]
    assert split([], 2) == []
    assert sum(split(list(range(32)), 3), []) == list(range(32))


def _same(a, b):
    assert [r.task_id for r in a] == [r.task_id for r in b] and [r.seed for r in a] == [r.seed for r in b]
    for x, y in zip(a, b):
        assert x.messages == y.messages and x.reward == y.reward and x.outcome == y.outcome
        assert [t.completion_ids for t in x.turn_records] == [t.completion_ids for t in y.turn_records]
        lx, ly = sum((list(t.logprobs) for t in x.turn_records), []), sum((list(t.logprobs) for t in y.turn_records), [])
        assert lx == pytest.approx(ly, abs=1e-4)


def test_pool_gives_the_records_of_one_process(tiny, runtime, tasks):
    from sandboxes.cpu_meter import tree_cpu_s

    model, tok = tiny
    jobs = [(b, s) for b in tasks[:2] for s in (0, 1)]
    kw = dict(concurrency=4, max_turns=2, sampling=SAMPLING)
    engine = {"policy_id": "hf:tiny"}
    here = run_episodes(TransformersPolicy(model, tok, **engine), jobs, runtime=runtime, **kw)
    c0 = tree_cpu_s()
    with RolloutPool(2, runtime=runtime) as pool:
        there = pool.run(model, tok, engine, jobs, runtime=runtime, **kw)
        assert pool.fallbacks == 0 and pool.cpu_s > 0.5     # two workers' start-up and episodes
        assert tree_cpu_s() - c0 >= pool.cpu_s              # in this process's total while they live
    _same(here, there)
    # after the workers are reaped their time is not counted twice
    assert tree_cpu_s() - c0 < 2 * pool.cpu_s + 5


def test_a_dead_worker_share_runs_here(tiny, runtime, tasks, monkeypatch):
    import ratchet.policy.rollout_pool as rp

    model, tok = tiny
    jobs = [(b, 0) for b in tasks[:2]]
    kw = dict(concurrency=2, max_turns=1, sampling=SAMPLING)
    here = run_episodes(TransformersPolicy(model, tok), jobs, runtime=runtime, **kw)
    with RolloutPool(2, runtime=runtime) as pool:
        monkeypatch.setattr(pool, "_executor", lambda: _Broken())
        there = pool.run(model, tok, {}, jobs, runtime=runtime, **kw)
        assert pool.fallbacks == 2
    _same(here, there)


class _Broken:
    def submit(self, *a, **k):
        from concurrent.futures import Future
        from concurrent.futures.process import BrokenProcessPool

        f = Future()
        f.set_exception(BrokenProcessPool("a worker died"))
        return f

    def shutdown(self, *a, **k):
        pass


def test_a_runtime_the_workers_cannot_rebuild_keeps_episodes_here(runtime):
    class OtherRuntime:
        pass

    pool = RolloutPool(2, runtime=OtherRuntime())
    assert pool.disabled and "LocalRuntime" in pool.disabled
    good = RolloutPool(2, runtime=runtime)
    assert good.disabled is None and good.runtime_kw["root"] == str(runtime.root)
    assert good.runtime_kw["isolation"] == runtime.isolation and str(runtime.root) not in good.runtime_kw["hide"]
