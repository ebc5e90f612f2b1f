"""The `promotions` table: an append-only audit of every promotion state a candidate reached.

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
SCHEMAS = {"promotions": PROMOTIONS}
INDEXES = {
    "promotions_once": "CREATE UNIQUE INDEX IF NOT EXISTS promotions_once ON promotions (promotion_id, state)",
    "promotions_seq": "CREATE UNIQUE INDEX IF NOT EXISTS promotions_seq ON promotions (seq)",
}


def ensure(con) -> None:
    """Create `promotions`, its uniqueness indexes and views (idempotent)."""
    con.execute(duck_ddl("promotions", PROMOTIONS))
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
