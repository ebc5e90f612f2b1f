"""The one configuration file pytest reads in a sandbox: the task's own, from the pinned commit.

Every test run (the agent's and the pristine verification's) passes pytest `-c <file>`,
`--rootdir <repo>`, `--confcutdir <repo>` and `-p no:cacheprovider` (`sandboxes.pytest_worker`).
With `-c` pytest looks for no configuration file at all, so nothing the agent writes is read as
configuration: not a `pytest.toml` (which pytest 9 reads and pytest 7 does not), not the next
format pytest learns, not a `setup.cfg` in a test folder. The file passed is a copy of the one
pytest would have picked in the task as pinned (same discovery order, from the folder of the
required tests up to the repository root), read from the snapshot, never from the worktree; a
task without one gets an empty `[pytest]` section. `PYTEST_ADDOPTS`, `PYTEST_PLUGINS` and plugin
autoloading by entry point are off in the worker too.

    cfg = task_config(bundle, episode.pristine_bytes)    # {"name": "setup.cfg", "text": ...}
"""
from __future__ import annotations

import posixpath

EMPTY = {"name": "pytest.ini", "text": "[pytest]\n"}
# pytest's discovery order within one folder (pytest 9; 7 stops at pyproject.toml's ini_options)
_ORDER = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml", "tox.ini",
          "setup.cfg")


def _pythonpath(name: str, text: str) -> list[str]:
    """The `pythonpath` entries of a configuration (pytest resolves them against the folder of
    the file it reads, which for the copy is not the task's: the worker passes them resolved)."""
    import shlex
    if name.endswith(".toml"):
        import tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return []
        table = (data.get("tool", {}).get("pytest", {}) if name == "pyproject.toml" else data.get("pytest", {}))
        if name == "pyproject.toml" and isinstance(table, dict) and "ini_options" in table:
            table = table["ini_options"]
        v = table.get("pythonpath") if isinstance(table, dict) else None
        return [str(x) for x in v] if isinstance(v, list) else shlex.split(v) if isinstance(v, str) else []
    import configparser
    cp = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        cp.read_string(text)
    except configparser.Error:
        return []
    section = {"tox.ini": "pytest", "setup.cfg": "tool:pytest"}.get(name, "pytest")
    try:
        return shlex.split(cp.get(section, "pythonpath", fallback=""))
    except ValueError:
        return []


def _holds_pytest_config(name: str, text: str) -> bool:
    if name in ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml"):
        return True                               # pytest takes these even when empty
    if name == "pyproject.toml":
        import tomllib
        try:
            tool = tomllib.loads(text).get("tool", {})
        except (tomllib.TOMLDecodeError, AttributeError):
            return False
        pt = tool.get("pytest") if isinstance(tool, dict) else None
        return isinstance(pt, dict) and bool(pt)
    import configparser
    cp = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        cp.read_string(text)
    except configparser.Error:
        return False
    return cp.has_section("pytest" if name == "tox.ini" else "tool:pytest")


def _start_dir(bundle) -> str:
    """The common folder of the task's required test files (pytest starts looking there)."""
    dirs = {posixpath.dirname(t.split("::", 1)[0]) for t in (*bundle.fail_to_pass, *bundle.pass_to_pass)}
    if not dirs:
        return ""
    common = posixpath.commonpath([d or "." for d in dirs])
    return "" if common == "." else common


def task_config(bundle, pristine) -> dict:
    """{"name", "text", "dir"[, "pythonpath"]}: the task's own pytest configuration as pinned
    (`pristine(path)` -> bytes or None) and the folder it lives in, or an empty `[pytest]`
    section when the task has none."""
    if bundle.files:              # the snapshot is these files: no git call per candidate name
        files = bundle.files

        def pristine(path):
            return files[path].encode() if path in files else None
    elif bundle.repo_path and bundle.commit:
        key = (bundle.repo_path, bundle.commit, _start_dir(bundle))
        if key not in _REPO_CONFIGS:
            _REPO_CONFIGS[key] = _discover(bundle, pristine)
        return dict(_REPO_CONFIGS[key])
    return _discover(bundle, pristine)


_REPO_CONFIGS: dict = {}          # (repository, commit, folder) -> config: a pinned commit never changes


def _discover(bundle, pristine) -> dict:
    d = _start_dir(bundle)
    while True:
        for name in _ORDER:
            path = posixpath.join(d, name) if d else name
            data = pristine(path)
            if data is None:
                continue
            text = data.decode("utf-8", "replace")
            if _holds_pytest_config(name, text):
                cfg = {"name": name, "text": text, "dir": d}
                extra = _pythonpath(name, text)
                if extra:
                    cfg["pythonpath"] = extra
                return cfg
        if not d:
            return dict(EMPTY)
        d = posixpath.dirname(d)
