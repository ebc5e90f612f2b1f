"""Lineage of every trained checkpoint: an MLflow model version and a warehouse registry row.

    out = record_checkpoint(con, run, client, tenant="acme", candidate="c1", stage="sft",
                            checkpoint=path, parent=base, manifest=manifest, env_digest=digest,
                            dagster_run_id=run_id, cpu_s=res.cpu_s, history=rows)

- The checkpoint folder is logged as artifacts of the MLflow run and registered as a version of
  `ratchet-<tenant>-<candidate>` (one registered model per tenant x candidate), tagged with the
  stage, parent checkpoint, training-data manifest hash (the sha256 over the trajectory ids; the
  ids themselves in the `manifest.json` artifact), consent grants, environment digest, Dagster
  run id and measured CPU seconds (what the economics stage prices).
- Per-step metrics (loss, reward, KL, pass rate, entropy, ...) go to the run, one MLflow step each,
  and a learning-curve PNG is logged as an artifact.
- `register_checkpoint` writes the warehouse row that consent revocation checks
  (`ratchet.governance.checkpoints.flag_checkpoints`). A checkpoint inherits its parent's records
  and grants: RL trains on sandbox tasks, not trajectories, but its weights descend from the SFT
  checkpoint's data, so revoking a grant used by SFT flags the RL checkpoint too.

The run object is duck-typed (`client`, `run_id`, `log_metrics`, `log_artifact`, `log_dict`:
resources.tracking.TrackedRun); no Dagster import here.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

CURVE_KEYS = ("loss", "reward", "kl", "pass_rate", "entropy", "reward_margin")


def model_name(tenant: str, candidate: str) -> str:
    """The registered model of one tenant's candidate (MLflow names: letters, digits, - _ .)."""
    clean = lambda s: re.sub(r"[^A-Za-z0-9_.-]+", "-", str(s)).strip("-") or "x"
    return f"ratchet-{clean(tenant)}-{clean(candidate)}"


def environment_digest(env_digests: Iterable[str], packages: Sequence[str] = ("torch", "transformers", "trl",
                                                                              "xgrammar")) -> str:
    """sha256 over the sandbox environments the data or rollouts came from and the versions of
    the training stack: a checkpoint is reproducible only under both."""
    from importlib.metadata import PackageNotFoundError, version

    vers = {}
    for p in packages:
        try:
            vers[p] = version(p)
        except PackageNotFoundError:
            vers[p] = None
    blob = json.dumps({"environments": sorted({d for d in env_digests if d}), "packages": vers}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def trajectory_environments(con, record_ids: Iterable[str]) -> list[str]:
    """The sandbox environment digests the given trajectories were recorded in."""
    rows = con.execute("SELECT DISTINCT environment_digest FROM trajectories WHERE list_contains(?, record_id)",
                       [sorted(set(record_ids))]).fetchall()
    return sorted(r[0] for r in rows if r[0])


def checkpoint_meta(path: str | Path) -> dict:
    p = Path(path) / "ratchet_checkpoint.json"
    return json.loads(p.read_text()) if p.exists() else {}


def inherited_manifest(parent: str | Path, own: Mapping | None = None) -> dict:
    """A checkpoint's data lineage: its own manifest plus everything its parent chain was trained
    on (the parent's ratchet_checkpoint.json carries its `record_ids`/`consent_ids`, and a
    recorded `lineage` of its own ancestors)."""
    pm = checkpoint_meta(parent)
    anc = pm.get("lineage") or pm
    own = dict(own or {})
    ids = sorted(set(own.get("record_ids") or []) | set(anc.get("record_ids") or []))
    grants = sorted(set(own.get("consent_ids") or []) | set(anc.get("consent_ids") or []))
    return {"record_ids": ids, "consent_ids": grants, "n": len(ids),
            "manifest_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()}


def write_lineage(checkpoint: str | Path, manifest: Mapping) -> None:
    """Record the inherited data lineage in the checkpoint's own ratchet_checkpoint.json, so its
    children inherit it in turn."""
    p = Path(checkpoint) / "ratchet_checkpoint.json"
    meta = json.loads(p.read_text()) if p.exists() else {}
    meta["lineage"] = {k: manifest.get(k) for k in ("record_ids", "consent_ids", "manifest_sha256", "n")}
    p.write_text(json.dumps(meta, indent=1, default=str))


def curve_png(history: Sequence[Mapping], path: str | Path, title: str) -> Path:
    """One panel per metric that the history has (loss, reward, KL, pass rate, entropy) vs step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in CURVE_KEYS if any(isinstance(h.get(k), (int, float)) for h in history)] or ["loss"]
    fig, axes = plt.subplots(1, len(keys), figsize=(2.6 * len(keys), 2.4), squeeze=False)
    for ax, k in zip(axes[0], keys):
        pts = [(h.get("step", i + 1), h[k]) for i, h in enumerate(history) if isinstance(h.get(k), (int, float))]
        if pts:
            ax.plot(*zip(*pts), marker="." if len(pts) < 40 else None, color="#264653")
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def log_history(run, history: Sequence[Mapping], skip: Collection[int] = ()) -> None:
    """Every numeric value of each step row, at that step (steps in `skip` were logged already)."""
    for i, h in enumerate(history):
        step = int(h.get("step", i + 1))
        if step not in skip:
            run.log_metrics({k: v for k, v in h.items() if k != "step"}, step=step)


def register_version(run, name: str, checkpoint: str | Path, tags: Mapping[str, object],
                     artifact_path: str = "checkpoint") -> str:
    """Log the checkpoint folder under the run's `artifact_path` artifacts and register it as a new
    version of `name`. Returns the version number."""
    from mlflow.exceptions import MlflowException

    c = run.client
    c.log_artifacts(run.run_id, str(checkpoint), artifact_path)
    try:
        c.create_registered_model(name, description="Ratchet checkpoints of one tenant's candidate")
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    source = f"{c.get_run(run.run_id).info.artifact_uri}/{artifact_path}"
    v = c.create_model_version(name, source, run_id=run.run_id, tags={k: str(v) for k, v in tags.items()})
    return str(v.version)


def record_checkpoint(con, run, *, tenant: str, candidate: str, stage: str, checkpoint: str | Path,
                      parent: str | Path | None, manifest: Mapping, env_digest: str, dagster_run_id: str | None,
                      cpu_s: float, history: Sequence[Mapping], parent_id: str | None = None,
                      workdir: str | Path | None = None, logged_steps: Collection[int] = ()) -> dict:
    """All lineage of one checkpoint (module doc). `manifest`: the data it and its ancestors were
    trained on (`data_manifest` / `inherited_manifest`). `con`: a warehouse connection (None skips
    the registry row). `logged_steps`: steps of `history` already in the MLflow run (logged live). Returns model name, version, checkpoint id, curve path, tags."""
    from ratchet.governance.checkpoints import register_checkpoint

    name = model_name(tenant, candidate)
    work = Path(workdir or checkpoint)
    curve = curve_png(history, work / f"{stage}_curve.png", f"{stage}: {tenant}/{candidate}")
    log_history(run, history, skip=logged_steps)
    run.log_artifact(str(curve))
    run.log_dict({k: manifest.get(k) for k in ("record_ids", "consent_ids", "task_ids", "manifest_sha256", "n")},
                 "manifest.json")
    tags = {"ratchet.stage": stage, "ratchet.tenant": tenant, "ratchet.candidate": candidate,
            "ratchet.parent_checkpoint": parent_id or (str(parent) if parent else ""),
            "ratchet.manifest_sha256": manifest.get("manifest_sha256", ""),
            "ratchet.n_trajectories": len(manifest.get("record_ids") or []),
            "ratchet.consent_ids": ",".join(manifest.get("consent_ids") or []),
            "ratchet.environment_digest": env_digest, "ratchet.dagster_run_id": dagster_run_id or "",
            "ratchet.cpu_s": round(float(cpu_s), 3)}
    version = register_version(run, name, checkpoint, tags)
    checkpoint_id = f"{name}/{version}"
    if con is not None:
        register_checkpoint(con, checkpoint_id, tenant, manifest.get("record_ids") or [],
                            consent_ids=manifest.get("consent_ids") or None)
    return {"model_name": name, "version": version, "checkpoint_id": checkpoint_id, "curve": curve, "tags": tags}


REGISTERED = "ratchet_registered.json"


def record_step_checkpoints(con, run, *, tenant: str, candidate: str, stage: str, final: str | Path,
                            manifest: Mapping, env_digest: str, dagster_run_id: str | None,
                            parent_id: str | None = None, parent: str | Path | None = None) -> list[dict]:
    """The intermediate checkpoints a run left beside its `final` one (GRPO's `step-NNNNN` folders,
    the ones a killed run resumes from): each becomes an MLflow model version too, tagged as
    `record_checkpoint` tags the final one, with stage `<stage>-step`, `ratchet.step` and its own CPU
    seconds, and gets a `checkpoints` row, so a revocation flags it as well. A folder registered
    before (its `ratchet_registered.json`) is skipped: a re-run registers nothing twice. Returns one
    {step, model_name, version, checkpoint_id} per newly registered folder."""
    from ratchet.governance.checkpoints import register_checkpoint

    final, name, out = Path(final), model_name(tenant, candidate), []
    for d in sorted(final.parent.glob("step-*")):
        if d.resolve() == final.resolve() or not d.is_dir() or (d / REGISTERED).exists():
            continue
        meta = json.loads((d / "ratchet_checkpoint.json").read_text())
        write_lineage(d, manifest)
        tags = {"ratchet.stage": f"{stage}-step", "ratchet.step": meta.get("step", ""), "ratchet.tenant": tenant,
                "ratchet.candidate": candidate, "ratchet.parent_checkpoint": parent_id or (str(parent) if parent else ""),
                "ratchet.manifest_sha256": manifest.get("manifest_sha256", ""),
                "ratchet.n_trajectories": len(manifest.get("record_ids") or []),
                "ratchet.consent_ids": ",".join(manifest.get("consent_ids") or []),
                "ratchet.environment_digest": env_digest, "ratchet.dagster_run_id": dagster_run_id or "",
                "ratchet.cpu_s": round(float(meta.get("cpu_s") or 0.0), 3)}
        version = register_version(run, name, d, tags, artifact_path=f"checkpoint-{d.name}")
        checkpoint_id = f"{name}/{version}"
        if con is not None:
            register_checkpoint(con, checkpoint_id, tenant, manifest.get("record_ids") or [],
                                consent_ids=manifest.get("consent_ids") or None)
        (d / REGISTERED).write_text(json.dumps({"model_name": name, "version": version}))
        out.append({"step": meta.get("step"), "model_name": name, "version": version, "checkpoint_id": checkpoint_id})
    return out
