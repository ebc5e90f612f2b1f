"""SFT with TRL: loss falls, weights change, and only the tenant's consented training_set rows
ever reach a batch."""
import json
from datetime import UTC, datetime, timedelta

import pytest

from ratchet.training.sft import SFTSettings, build_dataset, make_trainer, train_sft

pytestmark = pytest.mark.training

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def _rows(trajectories, tools, n):
    return [{**t, "record_id": f"rec-{i:02d}", "consent_id": "C-1", "task_id": t["task_id"], "tools": tools}
            for i, t in enumerate(trajectories[:n])]


def test_sft_loss_falls_and_weights_change(tmp_path, tiny_model, tokenizer, trajectories, tools):
    import torch

    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    res = train_sft("in-memory", _rows(trajectories, tools, 4), tmp_path / "sft",
                    SFTSettings(max_steps=8, batch_size=2, learning_rate=1e-2, threads=1, max_length=640),
                    model=tiny_model, tokenizer=tokenizer)
    assert res.steps == 8 and len(res.losses) == 8
    assert sum(res.losses[-2:]) / 2 < sum(res.losses[:2]) / 2 - 0.3, res.losses
    changed = [n for n, p in tiny_model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before)
    meta = json.loads((tmp_path / "sft" / "ratchet_checkpoint.json").read_text())
    assert meta["record_ids"] == ["rec-00", "rec-01", "rec-02", "rec-03"] and meta["consent_ids"] == ["C-1"]
    assert meta["losses"] == res.losses and res.cpu_s > 0 and 0 < res.n_loss_tokens < res.n_tokens
    assert (tmp_path / "sft" / "model.safetensors").exists()


# --------------------------------------------------------------------------------------- consent
def _native(t, i, tenant, consent, tools, ended):
    return {"schema_version": "ratchet.trajectory/v1", "trajectory_id": f"{tenant}-{i:02d}", "tenant_id": tenant,
            "consent_id": consent, "task_id": t["task_id"], "repo": "humaneval", "agent_id": t["agent_id"],
            "started_at": (ended - timedelta(minutes=1)).isoformat(), "ended_at": ended.isoformat(),
            "messages": t["messages"], "tools": tools,
            "outcome": {"tests_passed": True, "accepted": True, "human_edited": False}}


def test_a_revoked_or_other_tenants_trajectory_never_reaches_a_batch(wh, tmp_path, tokenizer, tiny_model,
                                                                      trajectories, tools):
    from ratchet import store, tables
    from ratchet.governance.consent import grants_from_rows
    from ratchet.governance.training_views import training_rows
    from ratchet.ingest import IngestOptions, ingest
    from ratchet.training.data import tenant_training_rows

    ended = NOW - timedelta(days=3)
    plan = [("acme", "C-ACME"), ("acme", "C-ACME"), ("acme", "C-ACME"), ("acme", "C-ACME-OLD"),
            ("globex", "C-GLOBEX"), ("globex", "C-GLOBEX"), ("acme", None)]
    path = tmp_path / "logs.jsonl"
    path.write_text("".join(json.dumps(_native(trajectories[i], i, ten, c, tools, ended)) + "\n"
                            for i, (ten, c) in enumerate(plan)))
    ingest([path], wh, IngestOptions(workers=1))
    grants = grants_from_rows([
        {"consent_id": "C-ACME", "tenant_id": "acme", "scopes": "train;eval", "retention_days": 90,
         "granted_at": "2026-09-01T00:00:00Z"},
        {"consent_id": "C-ACME-OLD", "tenant_id": "acme", "scopes": "train", "retention_days": 90,
         "granted_at": "2026-08-01T00:00:00Z", "revoked_at": (NOW - timedelta(days=1)).isoformat()},
        {"consent_id": "C-GLOBEX", "tenant_id": "globex", "scopes": "train", "retention_days": 90,
         "granted_at": "2026-09-01T00:00:00Z"}])
    with wh.connect() as con:
        tables.ensure_all(con)
        trajs = store.fetch(con, "SELECT record_id, trajectory_id, tenant_id, consent_id, task_id, started_at, "
                                 "ended_at, accepted, tests_passed FROM trajectories")
        by_tid = {t["trajectory_id"]: t["record_id"] for t in trajs}
        # acme-02 is a validation-split trajectory: the split gate keeps it out too.
        split_of = {t["record_id"]: {"split": "validation" if t["trajectory_id"] == "acme-02" else "train",
                                     "cluster_id": t["task_id"]} for t in trajs}
        train, audit = training_rows(trajs, grants, split_of, NOW)
        store.insert(con, "training_set", train)
        rows = tenant_training_rows(con, "acme")
    allowed = {by_tid["acme-00"], by_tid["acme-01"]}
    excluded = {by_tid[k] for k in ("acme-02", "acme-03", "globex-04", "globex-05", "acme-06")}
    assert {r["record_id"] for r in rows} == allowed
    assert {a["reason"] for a in audit if a["target_tenant"] == "acme"} >= {"revoked", "cross_tenant",
                                                                             "missing_consent", "not_train_split"}
    # Build the batches the trainer would see and map each back to its trajectory.
    dataset, ids = build_dataset(rows, tokenizer)
    seq_of = {tuple(x): rid for x, rid in zip(dataset["input_ids"], ids)}
    trainer = make_trainer(tiny_model, tokenizer, dataset, tmp_path / "t", SFTSettings(batch_size=1, threads=1))
    seen = set()
    for batch in trainer.get_train_dataloader():
        for row, att in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
            seen.add(seq_of[tuple(t for t, a in zip(row, att) if a)])
    assert seen == allowed and not seen & excluded


def test_training_rows_come_in_an_order_that_does_not_depend_on_measured_timings():
    """record_id hashes the whole record, timestamps and latency included, so two runs of the same
    agents give the same trajectories other ids: the data order (hence SFT's shuffle) must not
    follow it."""
    import duckdb

    from ratchet.training.data import tenant_training_rows

    con = duckdb.connect()
    con.execute("CREATE TABLE training_set (record_id VARCHAR, trajectory_id VARCHAR, task_id VARCHAR, "
                "consent_id VARCHAR, owner_tenant_id VARCHAR, tenant_id VARCHAR, split VARCHAR)")
    con.execute("CREATE TABLE trajectories (record_id VARCHAR, accepted BOOLEAN, tests_passed BOOLEAN, "
                "messages VARCHAR, tools VARCHAR, source_format VARCHAR)")
    orders = []
    for run in range(2):
        con.execute("DELETE FROM training_set")
        con.execute("DELETE FROM trajectories")
        for k, (task, traj) in enumerate([("t1", "acme-a"), ("t1", "acme-b"), ("t2", "acme-c"), ("t3", "acme-d")]):
            rid = f"{(k if run == 0 else 9 - k):02d}"          # the second run's ids sort the other way
            con.execute("INSERT INTO training_set VALUES (?, ?, ?, 'C', 'acme', 'acme', 'train')", [rid, traj, task])
            con.execute("INSERT INTO trajectories VALUES (?, true, true, '[]', '[]', 'openai_chat')", [rid])
        orders.append([r["trajectory_id"] for r in tenant_training_rows(con, "acme")])
    assert orders[0] == orders[1] == ["acme-a", "acme-b", "acme-c", "acme-d"]


def test_micro_batching_is_for_large_models_on_the_cpu():
    from ratchet.training.sft import micro_batched

    s = SFTSettings(batch_size=4, grad_accum=2, device="cpu")
    assert (micro_batched(s, True).batch_size, micro_batched(s, True).grad_accum) == (1, 8)
    assert micro_batched(s, False) == s                       # the small model keeps its padded batch


def test_sft_with_lora_trains_the_adapter_and_saves_merged_weights(tmp_path, tiny_model, tokenizer, trajectories,
                                                                   tools):
    """lora="on" (what "auto" does for a > 50M-parameter base): only the adapter trains; the saved
    checkpoint is plain weights with the adapter merged in, so the targeted projections moved and
    everything else (embeddings, norms) is the base's, and it loads without peft."""
    import torch

    from ratchet.policy.embedded.model import load_policy, maybe_lora

    assert maybe_lora(tiny_model, "auto")[1] is False              # the embedded model trains in full
    with pytest.raises(ValueError, match="lora must be one of"):
        SFTSettings(lora="yes")
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    res = train_sft("in-memory", _rows(trajectories, tools, 4), tmp_path / "sft",
                    SFTSettings(max_steps=8, batch_size=2, learning_rate=2e-2, threads=1, max_length=640, lora="on"),
                    model=tiny_model, tokenizer=tokenizer)
    assert res.losses[-1] < res.losses[0], res.losses
    meta = json.loads((tmp_path / "sft" / "ratchet_checkpoint.json").read_text())
    assert meta["lora"] is True and not (tmp_path / "sft" / "adapter_config.json").exists()
    # on the CPU a large (LoRA) model steps one unpadded example at a time and accumulates the batch
    assert (meta["settings"]["batch_size"], meta["settings"]["grad_accum"]) == (1, 2)
    saved, _ = load_policy(tmp_path / "sft")
    assert not hasattr(saved, "peft_config")
    after = dict(saved.named_parameters())
    assert set(after) == set(before)
    moved = {n for n in before if not torch.allclose(after[n], before[n])}
    assert moved and all(n.endswith(("proj.weight",)) for n in moved), sorted(moved)[:5]
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
