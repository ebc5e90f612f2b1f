"""The one helper for each of: timestamp parsing, Arrow -> DuckDB DDL, Markdown metadata tables.
Every caller goes through them, so each is pinned here once."""
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from ratchet import clock, tables
from ratchet.contract import duck_column_type, duck_ddl, parse_ts, utc_from_iso
from ratchet.governance import consent, splits
from ratchet.governance import tables as gov_tables
from ratchet.markdown import md_table

NOON = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
JSON = {"format": "json"}


STRINGS = ["2026-11-01T12:00:00Z", "2026-11-01T12:00:00+00:00", "2026-11-01T14:00:00+02:00",
           "2026-11-01T07:00:00-05:00", "2026-11-01T12:00:00"]
DATETIMES = [datetime(2026, 11, 1, 12), datetime(2026, 11, 1, 14, tzinfo=timezone(timedelta(hours=2))), NOON]
READERS = {"utc_from_iso": utc_from_iso, "contract.parse_ts": lambda v: parse_ts(v, "t"), "consent._ts": consent._ts,
           "clock.parse_now": clock.parse_now}
CASES = [pytest.param(READERS[r], v, id=f"{r}-{v!s}") for r in READERS
         for v in STRINGS + (DATETIMES if r != "clock.parse_now" else [])]  # parse_now reads config strings


@pytest.mark.parametrize("parse,value", CASES)
def test_every_timestamp_reader_gives_the_same_aware_utc_time(parse, value):
    t = parse(value)
    assert t == NOON and t.utcoffset() == timedelta(0) and t.tzinfo is not None
    assert t.isoformat() == "2026-11-01T12:00:00+00:00"


@pytest.mark.parametrize("parse", [consent._ts, clock.parse_now])
def test_absent_times(parse):
    if parse is consent._ts:
        assert parse(None) is None and parse("") is None
    else:
        assert abs(parse(None) - datetime.now(timezone.utc)) < timedelta(minutes=1)


@pytest.mark.parametrize("field,want", [
    (pa.field("a", pa.string()), "VARCHAR"), (pa.field("a", pa.int64()), "BIGINT"), (pa.field("a", pa.int32()), "INTEGER"),
    (pa.field("a", pa.bool_()), "BOOLEAN"), (pa.field("a", pa.float64()), "DOUBLE"), (pa.field("a", pa.binary()), "BLOB"),
    (pa.field("a", pa.timestamp("us", tz="UTC")), "TIMESTAMPTZ"), (pa.field("a", pa.string(), metadata=JSON), "JSON"),
    (pa.field("a", pa.list_(pa.string())), "VARCHAR[]"), (pa.field("a", pa.list_(pa.timestamp("us", tz="UTC"))), "TIMESTAMPTZ[]"),
    (pa.field("a", pa.list_(pa.list_(pa.int64()))), "BIGINT[][]"),
])
def test_arrow_field_to_duckdb_column_type(field, want):
    assert duck_column_type(field) == want


@pytest.mark.parametrize("name", sorted(gov_tables.SCHEMAS))
def test_every_governance_table_ddl_comes_from_the_one_helper_and_runs(name):
    import duckdb

    assert tables.ddl(name) == duck_ddl(name, gov_tables.SCHEMAS[name])
    con = duckdb.connect()
    con.execute(tables.ddl(name))
    con.execute(tables.ddl(name))  # idempotent
    cols = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
    assert cols == gov_tables.SCHEMAS[name].names


@pytest.mark.parametrize("header,rows,want", [
    (["reason", "records"], [("`a`", 3), ("`b`", 1)], "| reason | records |\n|---|---|\n| `a` | 3 |\n| `b` | 1 |"),
    (["size", "clusters"], {"1": 5, "2-3": 0}.items(), "| size | clusters |\n|---|---|\n| 1 | 5 |\n| 2-3 | 0 |"),
    (["t", "n", "x"], [("acme", 2, None)], "| t | n | x |\n|---|---|---|\n| acme | 2 | None |"),
    (["reason", "mutants"], [], "| reason | mutants |\n|---|---|\n"),
])
def test_md_table(header, rows, want):
    assert md_table(header, rows) == want


def test_split_summary_md_is_a_md_table():
    rows = [{"kind": "task", "slice": "op", "split": "train"}, {"kind": "task", "slice": None, "split": "holdout"},
            {"kind": "trajectory", "slice": None, "split": "train"}]
    assert splits.split_summary_md(rows) == (
        "| slice | train | val | holdout | excluded_contaminated |\n|---|---|---|---|---|\n"
        "| (none) | 0 | 0 | 1 | 0 |\n| op | 1 | 0 | 0 | 0 |\n"
        "| **all tasks** | 1 | 0 | 1 | 0 |\n| *trajectories* | 1 | 0 | 0 | 0 |")


def test_a_column_declared_later_reaches_an_existing_warehouse():
    """eval_episodes gained judge_id: a warehouse created before it gets the column (NULL in old
    rows) when the schema is ensured, and writes (BY NAME) work on it."""
    import duckdb

    from ratchet.evaluation import tables as ev

    con = duckdb.connect()
    old = pa.schema([f for f in ev.EVAL_EPISODES if f.name != "judge_id"])
    con.execute(duck_ddl("eval_episodes", old))
    con.execute("INSERT INTO eval_episodes (eval_id, policy_id) VALUES ('old', 'harness:sbfl')")
    ev.ensure(con)
    assert con.execute("SELECT judge_id FROM eval_episodes WHERE eval_id = 'old'").fetchall() == [(None,)]
    ev.write_episodes(con, [{"eval_id": "new", "policy_id": "harness:sbfl", "judge_id": "rubric-v3"}])
    assert con.execute("SELECT eval_id, judge_id FROM eval_episodes ORDER BY 1").fetchall() == [
        ("new", "rubric-v3"), ("old", None)]
    assert tables.add_missing_columns(con, "eval_episodes") == []      # idempotent
