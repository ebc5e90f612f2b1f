"""The evaluation pool: every job's result is taken exactly once, even when a worker process dies
mid-job (the jobs it lost run in the parent instead of the pool waiting forever), and chunks of a
batched evaluation are cut only between tasks."""
import os

import pytest

from ratchet.evaluation.runner import _chunks, _each

pytestmark = pytest.mark.evaluation


def _dies_in_a_worker(job):
    k, parent = job
    if k == 2 and os.getpid() != parent:
        os._exit(3)                         # a worker killed mid-job (OOM killer, a stray signal)
    return k * 10


def test_a_dead_worker_loses_no_job_and_doubles_none():
    got = []
    with pytest.warns(UserWarning, match="worker process died"):
        _each(_dies_in_a_worker, [(k, os.getpid()) for k in range(6)], 2, got.append)
    assert sorted(got) == [0, 10, 20, 30, 40, 50]


def test_errors_still_propagate_from_the_pool():
    with pytest.raises(ZeroDivisionError):
        _each(_divide, [1, 0, 2], 2, lambda r: None)


def _divide(x):
    return 1 / x


def test_chunks_keep_a_tasks_seeds_together():
    todo = [("p", "", {"task_id": f"t{t}"}, s) for t in range(7) for s in range(3)]
    chunks = _chunks(todo, 2, 4)
    assert [len(c) for c in chunks] == [6, 6, 6, 3]
    assert all(len({j[2]["task_id"] for j in c}) == len(c) // 3 for c in chunks)
    assert [j for c in chunks for j in c] == todo
    assert [len(c) for c in _chunks(todo, 2, None)] == [12, 9]      # CHUNK caps, every worker gets one
