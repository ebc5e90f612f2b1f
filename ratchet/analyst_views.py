"""Analyst views across layers (`ratchet query "SELECT * FROM v_..."`). Declared as a layer with
no tables of its own, created last (ratchet.tables.LAYERS) because it reads every other layer.

  v_policy_scorecard     each policy's latest whole-holdout summary beside its economics
  v_slice_deltas         per slice, each policy's pass rate minus its baseline's on that slice
  v_economics            the economics table, policies side by side
  v_promotion_history    every promotion state change, oldest first (the audit trail)
  v_consent_exclusions   every excluded (trajectory, policy tenant) with the grant behind it
  v_lineage              checkpoint -> the trajectories it was trained on -> their grants
"""
from __future__ import annotations

SCHEMAS: dict = {}

_LATEST_SUMMARY = """(SELECT * FROM eval_summary QUALIFY row_number() OVER (
        PARTITION BY policy_id, checkpoint_version, dimension, slice_value ORDER BY computed_at DESC) = 1)"""

VIEWS = {
    "v_policy_scorecard": """
        SELECT s.policy_id, s.checkpoint_version, s.pass_rate_display, s.pass_rate, s.pass_rate_ci_lo,
               s.pass_rate_ci_hi, s.tasks_passed, s.tasks_scored, s.tasks_infra, s.baseline_policy_id,
               s.diff_vs_baseline, s.diff_ci_lo, s.diff_ci_hi, s.hard_gate_rate, s.human_intervention_rate,
               s.latency_p50_s, s.latency_p95_s, s.mean_turns, e.variable_per_accepted, e.training_investment,
               e.sample_amortised, e.production_amortised, e.break_even, s.environment_digest, s.holdout_sha256,
               s.computed_at
        FROM v_eval_latest s LEFT JOIN economics e USING (policy_id, checkpoint_version)
        ORDER BY s.pass_rate DESC NULLS LAST""",
    "v_slice_deltas": f"""
        SELECT c.dimension, c.slice_value, c.policy_id, c.checkpoint_version, c.baseline_policy_id,
               c.pass_rate, b.pass_rate AS baseline_pass_rate, c.pass_rate - b.pass_rate AS delta,
               c.tasks_scored, b.tasks_scored AS baseline_tasks_scored
        FROM {_LATEST_SUMMARY} c
        LEFT JOIN {_LATEST_SUMMARY} b ON b.policy_id = c.baseline_policy_id AND b.dimension = c.dimension
                                       AND b.slice_value = c.slice_value
        WHERE c.dimension <> 'all' AND c.policy_id IS DISTINCT FROM c.baseline_policy_id
        ORDER BY delta NULLS LAST, c.dimension, c.slice_value""",
    "v_economics": """
        SELECT policy_id, checkpoint_version, accepted_runs, episodes, variable_per_accepted, training_investment,
               sample_amortised, production_n, production_amortised, break_even, baseline_policy_id, computable,
               rate_card, computed_at
        FROM economics ORDER BY policy_id, checkpoint_version""",
    "v_promotion_history": """
        SELECT seq, "at", promotion_id, policy_id, checkpoint_version, previous_state, state, actor, reason, verdict,
               failing_gates, champion_policy_id, champion_checkpoint_version, registered_model, model_version,
               dagster_run_id
        FROM promotions ORDER BY seq""",
    "v_consent_exclusions": """
        SELECT a.target_tenant, a.record_id, a.trajectory_id, a.tenant_id AS owner_tenant, a.reason, a.detail,
               a.split, a.consent_id, g.tenant_id AS grant_tenant, g.scopes, g.retention_days, g.revoked_at,
               a.evaluated_at
        FROM consent_audit a LEFT JOIN consent_grants g USING (consent_id)
        ORDER BY a.target_tenant, a.reason, a.record_id""",
    "v_lineage": """
        SELECT c.checkpoint_id, c.tenant_id AS policy_tenant, c.created_at, c.flagged, c.flag_reason,
               r.record_id, t.trajectory_id, t.task_id, t.tenant_id AS owner_tenant, t.consent_id,
               g.scopes, g.retention_days, g.revoked_at
        FROM checkpoints c CROSS JOIN unnest(c.trained_record_ids) AS r(record_id)
        LEFT JOIN trajectories t USING (record_id)
        LEFT JOIN consent_grants g ON g.consent_id = t.consent_id
        ORDER BY c.checkpoint_id, r.record_id""",
}
