"""RATCHET_HOME: the one folder that holds everything local (warehouse, MLflow store, Dagster
instance, checkpoints, landing folder)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DAGSTER_YAML = """\
# Written by Ratchet. Telemetry and the first-run modal are off (no network here).
telemetry:
  enabled: false
nux:
  enabled: false
concurrency:
  pools:
    default_limit: 1
"""


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def dagster(self) -> Path:
        return self.root / "dagster"

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def relative(self, path: str | os.PathLike) -> str:
        """A path under the home as text relative to it (what metadata records, so the home can
        move); a path elsewhere stays absolute."""
        p = Path(path)
        try:
            return str(p.resolve().relative_to(self.root))
        except ValueError:
            return str(p)

    def ensure(self) -> "Home":
        for d in (self.root, self.artifacts, self.dagster, self.landing, self.checkpoints):
            d.mkdir(parents=True, exist_ok=True)
        cfg = self.dagster / "dagster.yaml"
        if not cfg.exists():
            cfg.write_text(DAGSTER_YAML)
        return self


def get_home(root: str | os.PathLike | None = None) -> Home:
    """Resolve RATCHET_HOME (argument > env var > ./.ratchet) to an absolute path."""
    raw = root or os.environ.get("RATCHET_HOME") or ".ratchet"
    return Home(Path(raw).expanduser().resolve())


def activate(root: str | os.PathLike | None = None) -> Home:
    """Create the home folder and point Dagster and MLflow at it for this process."""
    home = get_home(root).ensure()
    os.environ["RATCHET_HOME"] = str(home.root)
    os.environ.setdefault("DAGSTER_HOME", str(home.dagster))
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return home
