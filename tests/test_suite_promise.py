"""The HumanEval repair suite's promise (README): seed 0 gives 1,210 tasks with one stable
suite sha256, compared here so that the promise cannot drift unnoticed.

The fast test reads the disk cache that `build_suite(seed=0)` leaves under RATCHET_HOME when
it exists (`make demo` / `make test` builds it), and otherwise builds a small subset twice; the
other test rebuilds the whole suite without the cache (about 90 s; marked `slow` since the suite
passed 15 minutes: in `make test` the fast test reads the cache that
tests/sandboxes/test_humaneval_suite.py::test_full_suite_from_disk_cache builds from scratch on a
fresh machine, so the promise is still checked there; `make test-all` rebuilds it uncached). A
deliberate generator change bumps GENERATOR_VERSION and updates SUITE_SHA256 here in the same commit."""
import json
from pathlib import Path

import pytest

from sandboxes.humaneval.suite import (GENERATOR_VERSION, MANIFEST, _params, build_suite, cache_key,
                                       default_cache_dir, load_suite)

SUITE_COUNT = 1210
SUITE_SHA256 = "ee3c7ad0793278bd3f1d22c3e8da44260afb8520a166ea0db34ca53610a97d62"  # humaneval-repair/9, seed 0
RECORDED_VERSION = "humaneval-repair/9"


def _written(suite, folder: Path) -> dict:
    return json.loads((suite.write(folder) / MANIFEST).read_text())


def test_recorded_sha_belongs_to_the_current_generator():
    assert GENERATOR_VERSION == RECORDED_VERSION, "generator changed: rebuild the suite and record its sha256"


def test_seed0_suite_count_and_sha_from_cache_or_a_stable_subset(tmp_path):
    cached = default_cache_dir() / cache_key(_params(0, None, 8, None))
    if (cached / MANIFEST).exists():
        manifest = json.loads((cached / MANIFEST).read_text())
        suite = load_suite(cached)  # every file checked against the manifest
        assert (len(suite.tasks), manifest["count"], manifest["suite_sha256"]) == (SUITE_COUNT, SUITE_COUNT, SUITE_SHA256)
        assert len({t.task_id for t in suite.tasks}) == SUITE_COUNT
        return
    a = _written(build_suite(seed=0, limit=3, per_problem=2, cache=False), tmp_path / "a")
    b = _written(build_suite(seed=0, limit=3, per_problem=2, cache=False), tmp_path / "b")
    assert a["count"] == b["count"] > 0 and a["suite_sha256"] == b["suite_sha256"]
    assert [e["sha256"] for e in a["tasks"]] == [e["sha256"] for e in b["tasks"]]


@pytest.mark.slow
def test_full_seed0_suite_rebuilt_has_the_promised_count_and_sha(tmp_path):
    m = _written(build_suite(seed=0, cache=False), tmp_path / "suite")
    assert (m["count"], m["suite_sha256"]) == (SUITE_COUNT, SUITE_SHA256)
