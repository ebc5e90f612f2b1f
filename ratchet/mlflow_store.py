"""The local MLflow store under RATCHET_HOME (sqlite + artifacts/), kept movable.

MLflow records absolute artifact locations: an experiment's `artifact_location` and each run's
`artifact_uri`. Two consequences fixed here: (1) a store created by a bare client puts the
Default experiment's artifacts in `./mlruns` of whatever folder the process ran in (a `mlruns/`
appeared in the project folder); it is created here with its default artifact root under the
home. (2) After the home folder moves, every recorded location points at the old place; the
home's last location is kept in `.location` and, on the next use, recorded locations under the
old root are rewritten to the new one (one SQL UPDATE per table, in the sqlite file itself:
MLflow has no API to change an experiment's artifact location).

Links to the MLflow UI (asset metadata) name the server `ratchet mlflow` last started for this
home: it records its URL in RATCHET_HOME/mlflow_ui_url. `ui_url` resolves, first found:
$RATCHET_MLFLOW_UI_URL, that recorded URL, http://127.0.0.1:5000 (`ratchet mlflow`'s default)."""
from __future__ import annotations

import os
from pathlib import Path

from ratchet.home import Home

_TABLES = (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("model_versions", "storage_location"),
           ("model_versions", "source"))


UI_URL_ENV = "RATCHET_MLFLOW_UI_URL"
UI_URL_FILE = "mlflow_ui_url"          # under RATCHET_HOME, written by `ratchet mlflow`
DEFAULT_UI_URL = "http://127.0.0.1:5000"


def serving_url(host: str, port: int) -> str:
    """The URL a browser on this machine opens for a server bound to host:port (a wildcard bind
    is reached through the loopback address)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def record_ui_url(home: Home, host: str, port: int) -> str:
    """Record where `ratchet mlflow` serves this home's store; returns the URL."""
    url = serving_url(host, port)
    home.root.mkdir(parents=True, exist_ok=True)
    (home.root / UI_URL_FILE).write_text(url + "\n")
    return url


def ui_url(home: Home) -> str:
    """Base URL of the MLflow UI for links: $RATCHET_MLFLOW_UI_URL, else the URL `ratchet mlflow`
    recorded for this home, else the default."""
    url = os.environ.get(UI_URL_ENV)
    if not url:
        try:
            url = (home.root / UI_URL_FILE).read_text().strip()
        except OSError:
            url = ""
    return (url or DEFAULT_UI_URL).rstrip("/")


def tracking_uri(home: Home) -> str:
    """sqlite URI of the home's store, created and relocated as needed."""
    uri = f"sqlite:///{home.mlflow_db}"
    if not home.mlflow_db.exists():
        home.root.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        import logging

        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        db_log = logging.getLogger("mlflow.store.db.utils")   # "Creating initial MLflow database tables..."
        level = db_log.level
        db_log.setLevel(logging.WARNING)
        try:
            SqlAlchemyStore(uri, default_artifact_root=home.artifacts.as_uri())  # creates tables + Default experiment
        finally:
            db_log.setLevel(level)
    relocate(home)
    return uri


def relocate(home: Home) -> int:
    """Rewrite recorded artifact locations if the home moved since it was last used. Returns the
    number of rows changed."""
    marker = home.root / ".location"
    now = str(home.root)
    old = marker.read_text().strip() if marker.exists() else now
    changed = 0
    if old != now and home.mlflow_db.exists():
        import sqlite3

        con = sqlite3.connect(home.mlflow_db)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table, col in _TABLES:
                if table not in tables:
                    continue
                for prefix_old, prefix_new in ((Path(old).as_uri(), Path(now).as_uri()), (old, now)):
                    cur = con.execute(
                        f"UPDATE {table} SET {col} = ? || substr({col}, ?) WHERE substr({col}, 1, ?) = ?",
                        [prefix_new, len(prefix_old) + 1, len(prefix_old) + 1, prefix_old + "/"])
                    changed += cur.rowcount
            con.commit()
        finally:
            con.close()
    if old != now or not marker.exists():
        home.root.mkdir(parents=True, exist_ok=True)
        marker.write_text(now + "\n")
    return changed
