"""MLflow model-registry aliases that follow the promotion state.

The `promotions` table is the source of truth; the aliases are a projection of it:
  champion   the current champion's model version (none while the baseline serves)
  canary     the promotion now in `canary`
  candidate  the newest promotion now `evaluated` or `approved`
`sync_aliases` moves them to match (idempotent: re-running after an MLflow outage repairs them),
so a rollback is one audited row plus one alias move. mlflow is imported inside functions.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

from . import state as S

MODEL_NAME = "ratchet-policy"
ALIASES = ("champion", "canary", "candidate")
_POLICY_TAG, _VERSION_TAG = "ratchet.policy_id", "ratchet.checkpoint_version"


def client(tracking_uri: str):
    import os

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _q(v: str) -> str:
    return v.replace("'", "\\'")


def _artifacts(c, experiment: str) -> str | None:
    """Artifacts beside a sqlite store (`<store dir>/artifacts/<experiment>`), never MLflow's default
    `./mlruns` under whatever the working directory is. Other stores keep their own default."""
    from pathlib import Path

    uri = str(c.tracking_uri)
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "artifacts" / experiment.replace("/", "_")).as_uri()


def find_version(c, policy_id: str, checkpoint_version: str, model_name: str = MODEL_NAME) -> str | None:
    """The newest registered version tagged with this policy and checkpoint, if any."""
    from mlflow.exceptions import MlflowException

    try:
        found = c.search_model_versions(f"name='{_q(model_name)}' and tags.`{_POLICY_TAG}` = '{_q(policy_id)}'")
    except MlflowException:
        return None
    hits = [v for v in found if (v.tags or {}).get(_VERSION_TAG, "") == (checkpoint_version or "")]
    return str(max(int(v.version) for v in hits)) if hits else None


def ensure_version(c, policy_id: str, checkpoint_version: str, *, model_name: str = MODEL_NAME,
                   source: str | None = None, experiment: str = "ratchet/promotion",
                   description: Mapping | None = None) -> str:
    """The model version for (policy_id, checkpoint_version), registered on first use. Without a
    `source` (a harness policy without weights, or a checkpoint stored elsewhere) a small
    descriptor artifact is logged in an MLflow run and registered, so every policy that can be
    champion has a version an alias can point at."""
    from mlflow.exceptions import MlflowException

    found = find_version(c, policy_id, checkpoint_version, model_name)
    if found is not None:
        return found
    try:
        c.create_registered_model(model_name, description="Ratchet policies; aliases follow the promotions table")
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    run_id = None
    if source is None:
        exp = c.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else c.create_experiment(experiment, artifact_location=_artifacts(c, experiment))
        run = c.create_run(exp_id, run_name=f"register {policy_id}@{checkpoint_version or '-'}",
                           tags={_POLICY_TAG: policy_id, _VERSION_TAG: checkpoint_version or ""})
        c.log_dict(run.info.run_id, {"policy_id": policy_id, "checkpoint_version": checkpoint_version or "",
                                     **dict(description or {})}, "policy/policy.json")
        c.set_terminated(run.info.run_id, "FINISHED")
        run_id, source = run.info.run_id, f"{run.info.artifact_uri}/policy"
    v = c.create_model_version(model_name, source, run_id=run_id,
                               tags={_POLICY_TAG: policy_id, _VERSION_TAG: checkpoint_version or ""})
    return str(v.version)


def desired_aliases(con, model_name: str = MODEL_NAME) -> dict[str, str | None]:
    """alias -> model version the promotions table says it should point at (None: unset)."""
    champ = S.current_champion(con)
    rows = con.execute("""
        SELECT p.state, p.model_version FROM promotions p
        JOIN (SELECT promotion_id, max(seq) AS seq FROM promotions GROUP BY 1) l USING (promotion_id, seq)
        WHERE p.registered_model = ? ORDER BY p.seq DESC""", [model_name]).fetchall()
    newest = {}
    for st, ver in rows:
        newest.setdefault(st, ver)
    cand = next((v for st, v in rows if st in ("evaluated", "approved")), None)
    return {"champion": champ["model_version"] if champ and champ["registered_model"] == model_name else None,
            "canary": newest.get("canary"), "candidate": cand}


def current_aliases(c, model_name: str = MODEL_NAME) -> dict[str, str | None]:
    from mlflow.exceptions import MlflowException

    try:
        got = c.get_registered_model(model_name).aliases or {}
    except MlflowException:
        got = {}
    return {a: (str(got[a]) if a in got else None) for a in ALIASES}


def sync_aliases(c, desired: Mapping[str, str | None], model_name: str = MODEL_NAME) -> dict[str, tuple]:
    """Move every alias to `desired`; returns {alias: (before, after)} for those that moved."""
    before = current_aliases(c, model_name)
    moved = {}
    for alias in ALIASES:
        want = desired.get(alias)
        if before[alias] == want:
            continue
        if want is None:
            c.delete_registered_model_alias(model_name, alias)
        else:
            c.set_registered_model_alias(model_name, alias, want)
        moved[alias] = (before[alias], want)
    return moved


def apply(con, c, model_name: str = MODEL_NAME) -> dict[str, tuple]:
    """Make the registry match the promotions table."""
    return sync_aliases(c, desired_aliases(con, model_name), model_name)


def rollback(con, c, *, actor: str, reason: str, promotion_id: str | None = None, model_name: str = MODEL_NAME,
             dagster_run_id: str | None = None) -> tuple[S.Transition, dict | None, dict]:
    """Roll back the current champion: one audited row, then `champion` moves to the previous
    champion's version (or is removed when the baseline serves again). Returns (transition,
    restored champion row or None, alias moves)."""
    t, restored = S.rollback(con, actor=actor, reason=reason, promotion_id=promotion_id, dagster_run_id=dagster_run_id)
    moved = apply(con, c, model_name)
    if restored is not None and restored.get("model_version"):
        c.set_model_version_tag(model_name, restored["model_version"], "ratchet.restored_by",
                                json.dumps({"actor": actor, "reason": reason, "rolled_back": t.row["promotion_id"]}))
    return t, restored, moved
