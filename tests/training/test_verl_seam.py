"""The VeRL seam: Ratchet's tasks and trajectories as VeRL 0.9 parquet (read by VeRL's own
RLHFDataset), and `compute_score` giving Ratchet's own reward."""
import json
import math
import types

import pytest

pytestmark = pytest.mark.training


@pytest.fixture(scope="module")
def verl_datasets():
    """VeRL's RLHFDataset and MultiTurnSFTDataset (installed by `verl_pkgs`, or the test skips)."""
    from tests.training.verl_pkgs import DATA, entered

    with entered(DATA, run_init=False):
        from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
        from verl.utils.dataset.rl_dataset import RLHFDataset
        yield types.SimpleNamespace(rl=RLHFDataset, sft=MultiTurnSFTDataset)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from sandboxes.humaneval import build_suite
    return sorted(build_suite(seed=0, limit=2, per_problem=2, cache_dir=tmp_path_factory.mktemp("suite")).tasks,
                  key=lambda b: b.task_id)


def _rows(trajectories):
    return [{"record_id": f"r-{t['trajectory_id']}", "consent_id": "C-ACME", **t,
             "messages": json.dumps(t["messages"]), "tools": None} for t in trajectories if t["accepted"]]


def test_rl_parquet_round_trips_and_records_the_manifest(tmp_path, tasks, trajectories):
    import pyarrow.parquet as pq

    from ratchet.training.data import data_manifest
    from ratchet.training.verl_data import AGENT_NAME, read_manifest, write_rl_parquet
    from sandboxes.bundle import TaskBundle
    from sandboxes.env import SYSTEM_PROMPT, user_prompt

    manifest = data_manifest(_rows(trajectories))
    path = write_rl_parquet(tasks, tmp_path / "train.parquet", bundle_dir=tmp_path / "bundles", manifest=manifest)
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == len(tasks)
    assert read_manifest(path)["manifest_sha256"] == manifest["manifest_sha256"]
    for i, (row, b) in enumerate(zip(rows, tasks)):
        assert row["prompt"] == [{"role": "system", "content": SYSTEM_PROMPT},
                                 {"role": "user", "content": user_prompt(b)}]
        assert row["reward_model"] == {"style": "rule", "ground_truth": b.task_id}
        assert row["agent_name"] == AGENT_NAME and row["extra_info"]["index"] == i
        kw = row["extra_info"]["tools_kwargs"]
        assert sorted(kw) == sorted(b.tool_allowlist)
        create = kw["apply_patch"]["create_kwargs"]
        assert create["task_id"] == b.task_id
        assert TaskBundle.load(create["bundle_path"]) == b


def test_sft_parquet_keeps_messages_and_tools(tmp_path, trajectories, tools):
    import pyarrow.parquet as pq

    from ratchet.training.data import data_manifest
    from ratchet.training.verl_data import read_manifest, write_sft_parquet

    rows = [dict(r, tools=json.dumps(tools)) for r in _rows(trajectories)]
    path = write_sft_parquet(rows, tmp_path / "sft.parquet", manifest=data_manifest(rows))
    back = pq.read_table(path).to_pylist()
    assert len(back) == len(rows) and read_manifest(path)["n"] == len(rows)
    strip = lambda x: ({k: strip(v) for k, v in x.items() if v is not None} if isinstance(x, dict)  # noqa: E731
                       else [strip(v) for v in x] if isinstance(x, list) else x)
    for b, r in zip(back, rows):
        # parquet unifies struct fields across rows: keys a message lacks come back as null
        assert strip(b["messages"]) == strip(json.loads(r["messages"]))
        assert [t["function"]["name"] for t in b["tools"]] == [t["function"]["name"] for t in tools]
    with pytest.raises(ValueError, match="not valid JSON"):
        write_sft_parquet([dict(rows[0], messages="{oops")], tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()


def test_verl_rlhf_dataset_loads_the_parquet(tmp_path, tasks, tokenizer, verl_datasets):
    from omegaconf import OmegaConf

    from ratchet.training.verl_data import write_rl_parquet

    path = write_rl_parquet(tasks, tmp_path / "train.parquet", bundle_dir=tmp_path / "bundles")
    cfg = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "filter_overlong_prompts": True,
                            "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache")})
    ds = verl_datasets.rl(str(path), tokenizer, cfg)
    assert len(ds) == len(tasks)
    item = ds[1]
    assert item["raw_prompt"][1]["content"].startswith("Repository: ")
    assert item["index"] == 1 and item["data_source"] == "ratchet/repair"
    assert item["tools_kwargs"]["submit"]["create_kwargs"]["task_id"] == tasks[1].task_id
    assert item["agent_name"] == "ratchet_repair"


def test_verl_sft_dataset_loads_the_parquet(tmp_path, trajectories, tools, tokenizer, verl_datasets):
    from omegaconf import OmegaConf

    from ratchet.training.verl_data import write_sft_parquet

    rows = [dict(r, tools=tools) for r in _rows(trajectories)]
    path = write_sft_parquet(rows, tmp_path / "sft.parquet")
    ds = verl_datasets.sft(str(path), tokenizer, OmegaConf.create({"max_length": 8192, "truncation": "right"}))
    assert len(ds) == len(rows)
    item = ds[0]
    # only the assistant's turns are trained on: some tokens, not all of them
    n, trained = int(item["attention_mask"].sum()), int(item["loss_mask"].sum())
    assert 0 < trained < n


def _ratchet_reward(bundle, patch, runtime):
    from sandboxes.env import RepairEnv
    with RepairEnv(bundle, runtime=runtime) as env:
        env.reset()
        env.step("apply_patch", {"patch": patch})
        env.step("submit", {"explanation": "fixed"})
        return env.reward


def _wrong_patch(bundle) -> str:
    """A patch that applies but breaks the module (its import raises): every test fails."""
    import difflib
    src = bundle.files["solution.py"]
    return "".join(difflib.unified_diff(src.splitlines(True), (src + "raise SystemExit(3)\n").splitlines(True),
                                        "a/solution.py", "b/solution.py"))


def test_compute_score_equals_ratchets_reward(tmp_path, tasks, runtime):
    from ratchet.training.verl_data import DATA_SOURCE, compute_score, write_rl_parquet
    import pyarrow.parquet as pq

    rows = pq.read_table(write_rl_parquet(tasks[:1], tmp_path / "t.parquet", bundle_dir=tmp_path / "b")).to_pylist()
    row, b = rows[0], tasks[0]
    fix = b.metadata["fix_diff"]
    for patch in (fix, _wrong_patch(b)):
        want = _ratchet_reward(b, patch, runtime)
        got = compute_score(DATA_SOURCE, f"The fix:\n```diff\n{patch}```\n", row["reward_model"]["ground_truth"],
                            row["extra_info"], runtime=runtime)
        assert got["score"] == pytest.approx(want.value) and got["status"] == want.status
        assert not got["infra_failure"]
    scores = [compute_score(DATA_SOURCE, "", b.task_id, dict(row["extra_info"], patch=p), runtime=runtime)["score"]
              for p in (fix, _wrong_patch(b))]
    assert scores[0] >= 0.55 and scores[1] == 0.0
    with pytest.raises(ValueError, match="ground_truth names"):
        compute_score(DATA_SOURCE, fix, "another-task", row["extra_info"], runtime=runtime)


def test_an_infra_failure_is_reported_not_scored_zero(tmp_path, tasks, broken_verdict_runtime):
    """The harness's own verdict script broken (as in the verdict tests): VeRL gets NaN and
    infra_failure, never a 0.0 the policy would learn from."""
    from ratchet.training.verl_data import DATA_SOURCE, compute_score, write_rl_parquet
    import pyarrow.parquet as pq

    rt = broken_verdict_runtime
    row = pq.read_table(write_rl_parquet(tasks[:1], tmp_path / "t.parquet", bundle_dir=tmp_path / "b")).to_pylist()[0]
    got = compute_score(DATA_SOURCE, "", tasks[0].task_id, dict(row["extra_info"], patch=tasks[0].metadata["fix_diff"]),
                        runtime=rt)
    assert got["infra_failure"] and got["status"] == "infra_failure" and math.isnan(got["score"])
    assert got["reason"]
