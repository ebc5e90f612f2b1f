"""The sandbox's synthetic /etc (passwd, group, hosts): one folder per content shared by every
process, never a folder another user planted. Each process used to mkdtemp its own and never
remove it (1,813 `ratchet-etc-*` folders in /tmp after two days of test runs)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandboxes import isolation

pytestmark = pytest.mark.security

ROOT = Path(__file__).resolve().parents[2]
PROBE = "from sandboxes.isolation import _synthetic_etc; print(os.path.dirname(_synthetic_etc()['passwd']))"


def _probe(tmp: Path) -> str:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", "import os; " + PROBE], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(isolation, "_ETC", {})
    return tmp_path


def test_processes_share_one_folder_and_leave_no_others(tmp_path):
    dirs = {_probe(tmp_path) for _ in range(3)}
    assert len(dirs) == 1
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [Path(dirs.pop()).name], left           # no private mkdtemp folder per process
    assert left[0].startswith(f"ratchet-etc-{os.geteuid()}-")


def test_the_files_hold_the_harness_users(fresh):
    etc = isolation._synthetic_etc()
    passwd = Path(etc["passwd"]).read_text()
    assert "sandbox:x:" in passwd and "root:x:0:0" in passwd
    assert Path(etc["hosts"]).read_text().startswith("127.0.0.1 localhost")
    assert oct(os.stat(etc["passwd"]).st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("plant", ["wrong_text", "group_writable", "symlink", "extra_file"])
def test_a_planted_folder_is_not_used(fresh, plant):
    files = isolation._etc_files()
    good = isolation._synthetic_etc()                      # learn the shared name, then replace it
    shared = Path(good["passwd"]).parent
    for f in shared.iterdir():
        f.unlink()
    shared.rmdir()
    isolation._ETC.clear()
    if plant == "symlink":
        elsewhere = fresh / "elsewhere"
        elsewhere.mkdir()
        for n, t in files.items():
            (elsewhere / n).write_text(t)
        shared.symlink_to(elsewhere)
    else:
        shared.mkdir()
        for n, t in files.items():
            (shared / n).write_text(t.replace("sandbox:x:", "sandbox:x:0:0:pwned:") if plant == "wrong_text" else t)
            os.chmod(shared / n, 0o644)
        os.chmod(shared, 0o775 if plant == "group_writable" else 0o755)
        if plant == "extra_file":
            (shared / "shadow").write_text("x")
    etc = isolation._synthetic_etc()
    used = Path(etc["passwd"]).parent
    assert used != shared and used.resolve() != shared.resolve()
    assert Path(etc["passwd"]).read_text() == files["passwd"]


def test_a_deleted_folder_is_made_again(fresh):
    first = isolation._synthetic_etc()
    d = Path(first["passwd"]).parent
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    again = isolation._synthetic_etc()
    assert Path(again["passwd"]).read_text() == isolation._etc_files()["passwd"]
