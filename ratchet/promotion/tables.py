"""The `promotions` table: an append-only audit of every promotion state a candidate reached, and
`reward_redteam`: each replay of the exploit library the reward-hacking gate reads.

One row per (promotion_id, state): a unique index makes a second request for a state already
reached (two sensor ticks) fail inside DuckDB, so it is applied at most once. `seq` orders rows
(unique too). Rows are never updated or deleted; the current state of a promotion is its row
with the highest seq (view `v_promotion_state`)."""
from __future__ import annotations

import pyarrow as pa

from ratchet.contract import duck_ddl

TS = pa.timestamp("us", tz="UTC")
JSON = {"format": "json"}

PROMOTIONS = pa.schema([
    pa.field("seq", pa.int64()),
    pa.field("promotion_id", pa.string()),             # one candidate evaluation's way through the states
    pa.field("policy_id", pa.string()),                # the candidate
    pa.field("checkpoint_version", pa.string()),
    pa.field("eval_run_id", pa.string()),
    pa.field("champion_policy_id", pa.string()),       # what it was evaluated against
    pa.field("champion_checkpoint_version", pa.string()),
    pa.field("champion_promotion_id", pa.string()),    # null: a baseline, no promoted champion yet
    pa.field("state", pa.string()),
    pa.field("previous_state", pa.string()),
    pa.field("actor", pa.string()),                    # "policy:<name>" (pre-authorised), "owner:<name>", "sensor", ...
    pa.field("reason", pa.string()),
    pa.field("verdict", pa.string()),                  # the gate verdict (evaluated rows)
    pa.field("failing_gates", pa.list_(pa.string())),
    pa.field("evidence", pa.string(), metadata=JSON),  # the gate report, canary decision, ...
    pa.field("registered_model", pa.string()),         # MLflow registry name and version of the candidate
    pa.field("model_version", pa.string()),
    pa.field("at", TS),
    pa.field("dagster_run_id", pa.string()),
])

# One row per exploit per replay (`ratchet.promotion.redteam_check`), keyed by the digest of what
# the replay ran on: a new row set only when the sample, the sandbox and verifier code, pytest or
# Python change. Appended, never updated: the gate reads the newest replay of its digest.
STRS = pa.list_(pa.string())
REWARD_REDTEAM = pa.schema([
    pa.field("redteam_id", pa.string()),               # one replay (all its exploit rows share it)
    pa.field("environment_digest", pa.string()),       # what the replay ran on (redteam_check.Plan.digest)
    pa.field("exploit", pa.string()),
    pa.field("kind", pa.string()),                     # "gaming" | "fault"
    pa.field("tasks_applied", pa.int64()),             # sampled tasks the exploit applied to
    pa.field("max_reward", pa.float64()),              # null: it applied to none
    pa.field("max_reward_task", pa.string()),
    pa.field("statuses", STRS),                        # the reward statuses it got (scored, gate_violation, ...)
    pa.field("infra_voids", pa.int64()),               # its episodes that ended as infra_failure
    pa.field("true_fix_min_reward", pa.float64()),     # the lowest true-fix reward of the replay
    pa.field("true_fix_min_task", pa.string()),
    pa.field("true_fix_unscored", pa.int64()),         # true-fix episodes not scored (the floor is unsure)
    pa.field("tasks", STRS),                           # the sample (train/val only)
    pa.field("task_digests", STRS),                    # their environment digests, as replayed
    pa.field("environment_ids", STRS),
    pa.field("code_digest", pa.string()),              # the sandbox and verifier code
    pa.field("runtime", pa.string()),
    pa.field("seconds", pa.float64()),                 # the whole replay
    pa.field("computed_at", TS),
    pa.field("dagster_run_id", pa.string()),
])

VIEWS = {
    "v_promotion_state": """
        SELECT p.promotion_id, p.policy_id, p.checkpoint_version, p.state, p.actor, p.at AS since,
               p.failing_gates, p.champion_policy_id, p.champion_checkpoint_version
        FROM promotions p
        JOIN (SELECT promotion_id, max(seq) AS seq FROM promotions GROUP BY 1) l USING (promotion_id, seq)
        ORDER BY p.seq""",
}


# Declared like every layer (ratchet.tables.LAYERS reads SCHEMAS and VIEWS). The indexes are not
# expressible there: `ensure` adds them, and the state machine calls `ready` before each move.
SCHEMAS = {"promotions": PROMOTIONS, "reward_redteam": REWARD_REDTEAM}
INDEXES = {
    "promotions_once": "CREATE UNIQUE INDEX IF NOT EXISTS promotions_once ON promotions (promotion_id, state)",
    "promotions_seq": "CREATE UNIQUE INDEX IF NOT EXISTS promotions_seq ON promotions (seq)",
}


def ensure(con) -> None:
    """Create `promotions`, its uniqueness indexes and views, and `reward_redteam` (idempotent)."""
    con.execute(duck_ddl("promotions", PROMOTIONS))
    con.execute(duck_ddl("reward_redteam", REWARD_REDTEAM))
    for sql in INDEXES.values():
        con.execute(sql)
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def ready(con) -> None:
    """`ensure` unless the table and both indexes are there (one catalog query)."""
    n = con.execute("SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'promotions' AND index_name IN "
                    "('promotions_once', 'promotions_seq')").fetchall()[0][0]
    if n < len(INDEXES):
        ensure(con)
