"""VeRL for the CPU tests: installed `--no-deps` into cache folders outside the venv (VeRL is in
the `gpu` extra, never a core dependency), or the test skips with the reason.

Three sets, each its own folder named by its pins (changing a pin reinstalls):
- DATA: what VeRL's datasets import (verl, omegaconf, tensordict, pyvers);
- CONFIG: hydra, to compose VeRL's packaged trainer config;
- LOOP: what `verl.experimental.agent_loop` imports on top (hydra, codetiming, ray: a 70 MB wheel,
  used there only for type hints and helpers the loop does not call).
"""
from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

VERL = "verl==0.9.1"
# verl pins tensordict<=0.10; omegaconf vendors its antlr
DATA = (VERL, "omegaconf==2.4.0", "tensordict==0.10.0", "pyvers==0.1.0")
CONFIG = ("hydra-core==1.3.2", "antlr4-python3-runtime==4.9.3")     # hydra's parser needs antlr 4.9
LOOP = (*CONFIG, "codetiming==1.4.0", "ray==2.49.2", "msgpack==1.2.4")

_OURS = ("verl", "omegaconf", "tensordict", "pyvers", "hydra", "antlr4", "codetiming", "ray", "msgpack")
# compiled extensions cannot be imported twice in one process (pybind11 types, Cython modules):
# these stay loaded once imported
_NEVER_UNLOAD = ("tensordict", "ray", "msgpack")


def cache_dir(pins: tuple[str, ...]) -> Path:
    key = hashlib.sha256(" ".join(pins).encode()).hexdigest()[:10]
    name = "verl-0.9.1" if pins == DATA else "verl-extra"
    return Path.home() / ".cache" / "ratchet" / f"{name}-{key}"


def install(pins: tuple[str, ...]) -> Path:
    cache = cache_dir(pins)
    if not (cache / "INSTALLED").exists():
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(cache), *pins],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.skip(f"cannot install {' '.join(pins)} into {cache}: {(r.stderr or r.stdout).strip()[-300:]}")
        (cache / "INSTALLED").write_text("\n".join(pins) + "\n")
    return cache


def _ours(name: str) -> bool:
    return name.split(".")[0] in _OURS


@contextlib.contextmanager
def entered(*sets: tuple[str, ...], run_init: bool):
    """The sets installed and importable; on exit the pure-Python modules are unloaded again.
    `run_init=False` enters `verl` without its `__init__`, which imports ray for DataProto (the
    datasets never touch it)."""
    folders = [str(install(s)) for s in sets]
    saved = {k: v for k, v in sys.modules.items() if _ours(k)}
    # a copy imported earlier from the venv (antlr4 4.13 via another library) would shadow the pinned one
    for k in [k for k in saved if not k.startswith(_NEVER_UNLOAD)]:
        del sys.modules[k]
    sys.path[:0] = folders
    if not run_init and "verl" not in sys.modules:
        pkg = types.ModuleType("verl")
        pkg.__path__ = [str(Path(folders[0]) / "verl")]
        sys.modules["verl"] = pkg
    try:
        yield folders
    finally:
        for f in folders:
            sys.path.remove(f)
        for k in [k for k in sys.modules if _ours(k) and not k.startswith(_NEVER_UNLOAD)]:
            del sys.modules[k]
        sys.modules.update({k: v for k, v in saved.items() if not k.startswith(_NEVER_UNLOAD)})
