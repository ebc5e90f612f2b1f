"""MLflow tracking: a small resource over `MlflowClient` (dagster-mlflow is a legacy beta that
ends runs early and ignores run config overrides). Runs get explicit ids, are tagged with the
Dagster run id and partition, and their URL goes into asset metadata."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from dagster import ConfigurableResource

from ratchet.home import get_home


class MlflowTracking(ConfigurableResource):
    home: str | None = None                 # default: RATCHET_HOME
    tracking_uri: str | None = None         # default: sqlite:///$RATCHET_HOME/mlflow.db (created movable)
    ui_url: str | None = None               # where the MLflow UI serves; default $RATCHET_MLFLOW_UI_URL,
                                            # else where `ratchet mlflow` last served this home
                                            # (RATCHET_HOME/mlflow_ui_url), else http://127.0.0.1:5000

    def _uri(self) -> str:
        from ratchet.mlflow_store import tracking_uri

        return self.tracking_uri or tracking_uri(get_home(self.home))

    def uri(self) -> str:
        """The tracking URI runs are written to (what a subprocess needs to log into a run)."""
        return self._uri()

    def ui(self) -> str:
        from ratchet.mlflow_store import ui_url

        return self.ui_url.rstrip("/") if self.ui_url else ui_url(get_home(self.home))

    def client(self):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self._uri())

    def experiment_id(self, name: str) -> str:
        c = self.client()
        exp = c.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        artifacts = get_home(self.home).artifacts / name.replace("/", "_")
        return c.create_experiment(name, artifact_location=artifacts.as_uri())

    @contextmanager
    def run(self, experiment: str, run_name: str, tags: dict | None = None,
            dagster_run_id: str | None = None, partition: str | None = None) -> Iterator["TrackedRun"]:
        """An MLflow run that is FINISHED on success and FAILED on error (never left running)."""
        c = self.client()
        t = {"ratchet.dagster_run_id": dagster_run_id or "", "ratchet.partition": partition or ""}
        t.update({k: str(v) for k, v in (tags or {}).items()})
        r = c.create_run(self.experiment_id(experiment), run_name=run_name, tags=t)
        tracked = TrackedRun(c, r.info.run_id, r.info.experiment_id, self.ui())
        try:
            yield tracked
        except BaseException:
            c.set_terminated(r.info.run_id, status="FAILED")
            raise
        c.set_terminated(r.info.run_id, status="FINISHED")


class TrackedRun:
    def __init__(self, client, run_id: str, experiment_id: str, ui_url: str):
        self.client, self.run_id, self.experiment_id = client, run_id, experiment_id
        self.url = f"{ui_url}/#/experiments/{experiment_id}/runs/{run_id}"

    def log_params(self, params: dict) -> None:
        for k, v in params.items():
            self.client.log_param(self.run_id, k, str(v)[:6000])

    def log_metrics(self, metrics: dict, step: int = 0) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.client.log_metric(self.run_id, k, float(v), step=step)

    def log_dict(self, obj: dict, name: str) -> None:
        self.client.log_dict(self.run_id, obj, name)

    def log_artifact(self, path: str) -> None:
        self.client.log_artifact(self.run_id, path)
