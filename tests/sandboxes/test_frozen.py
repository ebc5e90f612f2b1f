"""A runtime runs the worker as it was when the runtime was made (sandboxes.frozen)."""
import os
from pathlib import Path

import sandboxes.runtime as runtime_mod
from sandboxes.frozen import freeze
from sandboxes.runtime import LocalRuntime
from tests.sandboxes.test_runtime import FIX, bundle


def test_freeze_is_content_addressed_read_only_and_repairs_a_bad_copy(tmp_path):
    src = tmp_path / "tool.py"
    src.write_text("print('v1')\n")
    path, digest = freeze(src, tmp_path / "tools")
    assert Path(path).name == f"tool-{digest[:16]}.py" and Path(path).read_text() == "print('v1')\n"
    assert oct(os.stat(path).st_mode & 0o777) == "0o444"
    assert freeze(src, tmp_path / "tools") == (path, digest)          # idempotent
    os.chmod(path, 0o644)
    Path(path).write_text("tampered\n")
    assert freeze(src, tmp_path / "tools") == (path, digest)
    assert Path(path).read_text() == "print('v1')\n"                  # rewritten from the source
    src.write_text("print('v2')\n")
    assert freeze(src, tmp_path / "tools")[0] != path                 # a new version, a new file


def test_editing_the_worker_mid_run_does_not_change_what_a_runtime_runs(tmp_path, monkeypatch):
    src = tmp_path / "pytest_worker.py"
    src.write_bytes(Path(runtime_mod._WORKER).read_bytes())
    monkeypatch.setattr(runtime_mod, "_WORKER", str(src))
    before = LocalRuntime(tmp_path / "rt1")
    # the checkout's worker is edited while `before` is in use: a broken one here
    src.write_text("import sys\nsys.exit(3)\n")
    after = LocalRuntime(tmp_path / "rt2")
    assert before.worker != after.worker
    with before.episode(bundle()) as ep:
        ep.write_file("solution.py", FIX)
        rep = ep.run_tests()
        assert rep.infra_error is None and set(rep.outcomes.values()) == {"passed"}
    with after.episode(bundle()) as ep:                                # the new copy is what it runs
        rep = ep.run_tests()
        assert rep.infra_error is not None and not rep.outcomes


def test_the_test_cache_keys_runs_on_the_frozen_copy(tmp_path, monkeypatch):
    from sandboxes.result_cache import start
    src = tmp_path / "pytest_worker.py"
    src.write_bytes(Path(runtime_mod._WORKER).read_bytes())
    monkeypatch.setattr(runtime_mod, "_WORKER", str(src))
    rt = LocalRuntime(tmp_path / "rt", test_cache=tmp_path / "cache.db")
    b = bundle()
    with rt.episode(b) as ep:
        first = ep._history
    src.write_text(src.read_text() + "\n# edited\n")
    rt2 = LocalRuntime(tmp_path / "rt", test_cache=tmp_path / "cache.db")
    with rt2.episode(b) as ep:
        assert ep._history != first                                    # another worker, another key
    assert start(b, ep.commit, rt.worker, "bwrap") == first
