"""The governance layer's warehouse tables and analyst views (DDL comes from these Arrow schemas).

Tables (DuckDB; every `*_at` column is TIMESTAMPTZ unless noted):
  tasks                 the repair-task suite, replaced whole by each `task_suite` run
  task_rejections       tasks a source could not turn into a verified task (source, task, reason,
                        detail), replaced whole by each `task_suite` run
  dedup_clusters        id ("task:<task_id>" / "traj:<record_id>"), kind, source_id, cluster_id, sizes
  dedup_edges           a, b, reason, score (the evidence behind each cluster)
  split_assignments     id, kind, source_id, cluster_id, slice, split, reason, tenant_id
  holdout_manifest      one row per (version, task_id) of every locked manifest (history kept)
  holdout_manifest_log  append-only: lock / adopt / verify / unlock events with the sha256 recorded
                        independently of the manifest file (catches a rewritten, self-consistent file)
  contamination_report  one row per contamination check run; contamination_pairs one per pair
  consent_grants        the grant registry as last loaded
  training_set          per policy tenant, the trajectories it may train on (replaced per run)
  consent_audit         every excluded (trajectory, policy tenant) with its reason (replaced per run)
  checkpoints           registry of trained checkpoints (written by trainers via register_checkpoint)
  checkpoint_flags      checkpoints trained on data under a revoked grant (current state)
  sft_coverage          per SFT checkpoint, each training row: whether it trained, and why not
Views: v_training_set, v_consent_audit_summary, v_split_summary, v_holdout, v_sft_coverage.
"""
from __future__ import annotations

import pyarrow as pa

from ratchet.tables import JSON, STR_LIST, TS, schema

TASK_PREFIX, TRAJ_PREFIX = "task:", "traj:"

SCHEMAS: dict[str, pa.Schema] = {
    "tasks": schema(
        ("task_id", pa.string()), ("repo", pa.string()), ("issue_id", pa.string()), ("problem_id", pa.string()),
        ("issue_title", pa.string()), ("issue_body", pa.string()), ("issue_text", pa.string()),
        ("solution", pa.string()), ("slice", pa.string()), ("slices", pa.string(), JSON),
        ("environment_id", pa.string()), ("environment_digest", pa.string()),
        ("fail_to_pass", STR_LIST), ("pass_to_pass", STR_LIST), ("bundle", pa.string(), JSON),
        ("suite_key", pa.string()), ("loaded_at", TS)),
    "task_rejections": schema(
        ("source", pa.string()), ("source_path", pa.string()), ("task", pa.string()), ("reason", pa.string()),
        ("detail", pa.string()), ("rejected_at", TS), ("dagster_run_id", pa.string())),
    "dedup_clusters": schema(
        ("id", pa.string()), ("kind", pa.string()), ("source_id", pa.string()), ("cluster_id", pa.string()),
        ("cluster_size", pa.int64()), ("cluster_tasks", pa.int64()), ("cluster_trajectories", pa.int64()),
        ("computed_at", TS), ("dagster_run_id", pa.string())),
    "dedup_edges": schema(
        ("a", pa.string()), ("b", pa.string()), ("reason", pa.string()), ("score", pa.float64()),
        ("computed_at", TS)),
    "split_assignments": schema(
        ("id", pa.string()), ("kind", pa.string()), ("source_id", pa.string()), ("cluster_id", pa.string()),
        ("slice", pa.string()), ("split", pa.string()), ("reason", pa.string()), ("tenant_id", pa.string()),
        ("assigned_at", TS), ("dagster_run_id", pa.string())),
    "holdout_manifest": schema(
        ("version", pa.int64()), ("task_id", pa.string()), ("manifest_sha256", pa.string()),
        ("created_at", pa.string()), ("locked_by", pa.string()), ("locked", pa.bool_())),
    "holdout_manifest_log": schema(
        ("seq", pa.int64()), ("event_at", TS), ("event", pa.string()), ("version", pa.int64()),
        ("manifest_sha256", pa.string()), ("n_tasks", pa.int64()), ("actor", pa.string()),
        ("reason", pa.string()), ("path", pa.string()), ("dagster_run_id", pa.string())),
    "contamination_report": schema(
        ("checked_at", TS), ("dagster_run_id", pa.string()), ("passed", pa.bool_()),
        ("overlap_fraction", pa.float64()), ("n_items", pa.int64()), ("n_overlapping_items", pa.int64()),
        ("threshold", pa.float64()), ("counts", pa.string(), JSON), ("examples", pa.string(), JSON)),
    "contamination_pairs": schema(
        ("checked_at", TS), ("dagster_run_id", pa.string()), ("kind", pa.string()), ("a", pa.string()),
        ("b", pa.string()), ("split_a", pa.string()), ("split_b", pa.string()), ("score", pa.float64())),
    "consent_grants": schema(
        ("consent_id", pa.string()), ("tenant_id", pa.string()), ("scopes", STR_LIST),
        ("retention_days", pa.int64()), ("granted_at", TS), ("revoked_at", TS),
        ("cross_tenant_train_for", STR_LIST), ("source_path", pa.string()), ("loaded_at", TS)),
    "training_set": schema(
        ("tenant_id", pa.string()), ("record_id", pa.string()), ("trajectory_id", pa.string()),
        ("owner_tenant_id", pa.string()), ("consent_id", pa.string()), ("task_id", pa.string()),
        ("cluster_id", pa.string()), ("split", pa.string()), ("accepted", pa.bool_()),
        ("tests_passed", pa.bool_()), ("ended_at", TS), ("evaluated_at", TS), ("dagster_run_id", pa.string())),
    "consent_audit": schema(
        ("record_id", pa.string()), ("trajectory_id", pa.string()), ("tenant_id", pa.string()),
        ("consent_id", pa.string()), ("target_tenant", pa.string()), ("reason", pa.string()),
        ("detail", pa.string()), ("split", pa.string()), ("evaluated_at", TS), ("dagster_run_id", pa.string())),
    "checkpoints": schema(
        ("checkpoint_id", pa.string()), ("tenant_id", pa.string()), ("trained_record_ids", STR_LIST),
        ("consent_ids", STR_LIST), ("created_at", TS), ("flagged", pa.bool_()), ("flag_reason", pa.string()),
        ("flagged_at", TS)),
    "checkpoint_flags": schema(
        ("checkpoint_id", pa.string()), ("consent_id", pa.string()), ("n_records", pa.int64()),
        ("reason", pa.string()), ("flagged_at", TS), ("dagster_run_id", pa.string())),
    "sft_coverage": schema(
        ("checkpoint_id", pa.string()), ("tenant_id", pa.string()), ("record_id", pa.string()),
        ("source_format", pa.string()), ("trains", pa.bool_()), ("reason", pa.string()), ("turns", pa.int64()),
        ("trainable_turns", pa.int64()), ("sft_data", pa.string()), ("created_at", TS),
        ("dagster_run_id", pa.string())),
}

VIEWS = {
    "v_sft_coverage": """
        SELECT checkpoint_id, tenant_id, source_format, sft_data, count(*) AS trajectories,
               count(*) FILTER (WHERE trains) AS trained, count(*) FILTER (WHERE NOT trains) AS not_trained,
               list(DISTINCT reason ORDER BY reason) FILTER (WHERE NOT trains) AS reasons,
               sum(trainable_turns) AS trainable_turns, sum(turns) AS turns
        FROM sft_coverage GROUP BY ALL ORDER BY checkpoint_id, tenant_id, source_format""",
    "v_training_set": """
        SELECT ts.*, t.repo, t.issue_id, t.prompt_text, t.messages, t.patch, t.source_format
        FROM training_set ts LEFT JOIN trajectories t USING (record_id)""",
    "v_consent_audit_summary": """
        SELECT target_tenant, reason, count(*) AS trajectories, count(DISTINCT consent_id) AS grants,
               list(DISTINCT consent_id ORDER BY consent_id) FILTER (WHERE consent_id IS NOT NULL) AS consent_ids,
               any_value(detail) AS example
        FROM consent_audit GROUP BY 1, 2 ORDER BY 1, 3 DESC""",
    "v_split_summary": """
        SELECT kind, split, slice, count(*) AS items, count(DISTINCT cluster_id) AS clusters
        FROM split_assignments GROUP BY ALL ORDER BY ALL""",
    "v_holdout": """
        SELECT * FROM holdout_manifest WHERE version = (SELECT max(version) FROM holdout_manifest)""",
}
