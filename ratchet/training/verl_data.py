"""VeRL (0.9) data and reward: Ratchet's tasks and trajectories as VeRL parquet, and Ratchet's
composed verifier as VeRL's custom reward function.

    write_rl_parquet(bundles, "train.parquet", bundle_dir="bundles", manifest=data_manifest(rows))
    write_sft_parquet(rows, "sft.parquet", manifest=data_manifest(rows))
    compute_score(data_source, solution_str, ground_truth, extra_info)   # VeRL's signature

The RL rows follow VeRL's multi-turn tool examples: `prompt` is the chat (Ratchet's own system
prompt and issue text, `sandboxes.env`), `reward_model.ground_truth` is the task id, and
`extra_info.tools_kwargs` gives every allowlisted tool the task id and the saved bundle it needs to
open the sandbox. The SFT rows are what VeRL's MultiTurnSFTDataset reads: `messages` and `tools`.
Both files carry the training-data manifest (`ratchet.training.data.data_manifest`) in the
parquet key-value metadata, so a VeRL run can be traced back to the trajectories it saw.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

DATA_SOURCE = "ratchet/repair"
ABILITY = "code_repair"
AGENT_NAME = "ratchet_repair"     # the AgentLoop name VeRL dispatches on (ratchet.training.verl_agent_loop)
META_KEY = b"ratchet.manifest"


def _manifest_meta(manifest: Mapping | None) -> dict[bytes, bytes]:
    if manifest is None:
        return {}
    if "manifest_sha256" not in manifest:
        raise ValueError("manifest has no manifest_sha256: build it with ratchet.training.data.data_manifest")
    return {META_KEY: json.dumps(dict(manifest), sort_keys=True).encode(),
            b"ratchet.manifest_sha256": str(manifest["manifest_sha256"]).encode()}


def _write(records: list[dict], path: str | Path, manifest: Mapping | None) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not records:
        raise ValueError("no rows to write: an empty VeRL dataset would fail only later, inside the trainer")
    table = pa.Table.from_pylist(records)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **_manifest_meta(manifest)})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)               # never a half-written file under the final name
    return path


def read_manifest(path: str | Path) -> dict | None:
    """The training-data manifest a VeRL parquet was written with (None when it has none)."""
    import pyarrow.parquet as pq
    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[META_KEY]) if META_KEY in meta else None


def rl_row(bundle, index: int, bundle_path: str | Path, *, split: str = "train") -> dict:
    """One VeRL RL row for a task: the prompt a Ratchet policy sees, the tools' create kwargs."""
    from sandboxes.env import SYSTEM_PROMPT, user_prompt

    create = {"task_id": bundle.task_id, "bundle_path": str(bundle_path)}
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,        # top level: VeRL's agent loop reads it from the batch
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                   {"role": "user", "content": user_prompt(bundle)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": bundle.task_id},
        "extra_info": {"split": split, "index": index, "task_id": bundle.task_id,
                       "bundle_path": str(bundle_path), "agent_name": AGENT_NAME,
                       "need_tools_kwargs": True,
                       "tools_kwargs": {name: {"create_kwargs": dict(create)}
                                        for name in bundle.tool_allowlist}},
    }


def write_rl_parquet(bundles: Iterable, path: str | Path, *, bundle_dir: str | Path,
                     manifest: Mapping | None = None, split: str = "train") -> Path:
    """The tasks as a VeRL RL parquet; each bundle is saved under `bundle_dir` (the sandbox is
    opened from it on the rollout and reward workers, which share that folder)."""
    bundle_dir = Path(bundle_dir)
    bundle_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i, b in enumerate(sorted(bundles, key=lambda b: b.task_id)):
        p = b.save(bundle_dir / f"{b.task_id}.json")
        records.append(rl_row(b, i, Path(p).resolve(), split=split))
    return _write(records, path, manifest)


def _json_list(value, what: str, record_id) -> list:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"row {record_id}: {what} is not valid JSON ({e})") from None
    if not isinstance(value, list):
        raise ValueError(f"row {record_id}: {what} must be a list, got {type(value).__name__}")
    return value


def write_sft_parquet(rows: Iterable[Mapping], path: str | Path, *, manifest: Mapping | None = None) -> Path:
    """Accepted trajectories (`tenant_training_rows` rows) as VeRL's multi-turn SFT parquet:
    `messages` (with tool calls) and `tools` (the schemas the trajectory was recorded with).
    Tool-call arguments stay JSON strings, as Ratchet records them."""
    records = []
    for r in rows:
        rid = r.get("record_id")
        if r.get("accepted") is False:
            raise ValueError(f"row {rid} is not accepted: SFT trains on accepted trajectories only")
        records.append({"messages": _json_list(r["messages"], "messages", rid),
                        "tools": _json_list(r.get("tools") or [], "tools", rid),
                        "extra_info": {"record_id": rid, "task_id": r.get("task_id")}})
    return _write(records, path, manifest)


# ---------------------------------------------------------------------------- reward

def extract_patch(solution_str: str) -> str:
    """The unified diff in a response: the last ```diff / ```patch block, else the text from
    the first `--- ` header on."""
    import re
    blocks = re.findall(r"```(?:diff|patch)\s*\n(.*?)```", solution_str or "", re.S)
    if blocks:
        return blocks[-1]
    i = (solution_str or "").find("--- ")
    return solution_str[i:] if i >= 0 else ""


def _bundle_for(ground_truth, extra_info: Mapping):
    from sandboxes.bundle import TaskBundle
    path = extra_info.get("bundle_path")
    if not path:
        for kw in (extra_info.get("tools_kwargs") or {}).values():
            path = (kw or {}).get("create_kwargs", {}).get("bundle_path")
            if path:
                break
    if not path:
        raise ValueError(f"no bundle_path in extra_info for task {ground_truth!r}: write the data "
                         "with write_rl_parquet")
    bundle = TaskBundle.load(path)
    if ground_truth and bundle.task_id != ground_truth:
        raise ValueError(f"bundle {path} is task {bundle.task_id!r}, ground_truth names {ground_truth!r}")
    return bundle


def score_patch(bundle, patch: str, explanation: str = "", *, runtime=None, judge=None, weights=None):
    """Ratchet's reward for a patch: a fresh episode, `apply_patch`, `submit` (the same path and
    verifier as an episode of the embedded trainer)."""
    from sandboxes.env import RepairEnv

    with RepairEnv(bundle, runtime=runtime, judge=judge, weights=weights) as env:
        env.reset()
        if patch.strip():
            env.step("apply_patch", {"patch": patch})    # a patch that does not apply: scored as is
        if not env.done:
            env.step("submit", {"explanation": explanation})
        return env.reward


def reward_to_score(reward) -> dict:
    """VeRL's dict form: `score` becomes the token reward, the other keys reward_extra_info.
    An infra failure has score NaN, never 0.0 (VeRL has no "unscored" value): a trainer that
    does not drop it fails loudly instead of teaching the policy the harness's fault."""
    c = reward.components or {}
    return {"score": math.nan if reward.infra_failure else float(reward.value),
            "infra_failure": bool(reward.infra_failure), "status": reward.status,
            "tests": float(c.get("tests", 0.0)), "hygiene": float(c.get("hygiene", 0.0)),
            "judge": float(c.get("judge", 0.0)), "reason": "; ".join(reward.reasons)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """VeRL's custom reward function (`custom_reward_function.path` / `name: compute_score`).

    Scores `extra_info["patch"]` (the final worktree diff, when the rollout carries it) or the
    diff in `solution_str`, for the task `ground_truth` names, with Ratchet's composed verifier.
    `runtime` may be passed through VeRL's `reward_kwargs`; by default the shared local sandbox."""
    if data_source != DATA_SOURCE:
        raise ValueError(f"compute_score scores {DATA_SOURCE!r} rows, got data_source {data_source!r}")
    info = dict(extra_info or {})
    bundle = _bundle_for(ground_truth, info)
    patch = info.get("patch")
    if patch is None:
        patch = extract_patch(solution_str)
    reward = score_patch(bundle, patch, info.get("explanation") or solution_str or "",
                         runtime=kwargs.get("runtime"))
    return reward_to_score(reward)
