"""harness:prior: the count prior is fit on train tasks only and ranks the most frequent kind first;
the policy id resolves through make_policy, from given tasks or the warehouse's train split."""
import json

import pytest

from sandboxes.agents.prior import Prior, fit_prior, kind_key, ranked_candidates

pytestmark = pytest.mark.training


@pytest.fixture(scope="module")
def bundles():
    from sandboxes.humaneval import build_suite
    return sorted(build_suite(seed=0, limit=8).tasks, key=lambda b: b.task_id)


def _row(b, split):
    return {"task_id": b.task_id, "split": split, "bundle": json.dumps(b.to_dict())}


def test_prior_is_fit_on_train_rows_only(bundles):
    train = [_row(b, "train") for b in bundles[:-1]]
    base = fit_prior(train)
    assert sum(base.counts.values()) == len(base.task_ids) >= len(train) - 1
    for split in ("holdout", "validation", None):
        assert fit_prior(train + [_row(bundles[-1], split)]) == base        # changes nothing
    assert fit_prior(train + [_row(bundles[-1], "train")]) != base          # a train row does
    assert fit_prior(list(reversed(train))) == base                          # order-free


def test_kind_key_reads_the_description():
    assert kind_key("replace `!=` with `==` at column 9 (comparison): `if a == b:`") == "comparison_swap"
    assert kind_key("replace `0` with `1` at column 4 (constant): `x = 1`") == "constant_plus_one"
    assert kind_key("replace `n` with `i` at column 4 (variable): `x = i`") == "variable_swap"
    assert kind_key("remove `not` at column 7: `if x:`") == "negation_drop"


def test_the_most_frequent_kind_is_tried_first():
    prior = Prior.from_counts({"negation_drop": 9, "comparison_swap": 3, "variable_swap": 4})
    cands = [(0, "replace `<` with `<=` at column 5 (comparison): `a <= b`"),
             (1, "remove `not` at column 2: `a < b`"),
             (2, "replace `a` with `b` at column 1 (variable): `b < b`"),
             (3, "replace `b` with `a` at column 5 (variable): `a < a`")]
    order = [i for _, i, _ in ranked_candidates([[(7, cands)]], prior)]
    assert order == [1, 0, 2, 3]        # variable_swap's 4 are shared by its 2 candidates: 2 < 3


def test_harness_prior_resolves_from_the_warehouse_train_split(bundles, tmp_path, monkeypatch):
    import duckdb

    from ratchet.policy import make_policy

    monkeypatch.setenv("RATCHET_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="no warehouse"):
        make_policy("harness:prior")
    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"))
    con.execute("CREATE TABLE tasks (task_id VARCHAR, bundle VARCHAR)")
    con.execute("CREATE TABLE split_assignments (kind VARCHAR, source_id VARCHAR, split VARCHAR)")
    for i, b in enumerate(bundles):
        con.execute("INSERT INTO tasks VALUES (?, ?)", [b.task_id, json.dumps(b.to_dict())])
        con.execute("INSERT INTO split_assignments VALUES ('task', ?, ?)",
                    [b.task_id, "train" if i < 5 else ("holdout" if i % 2 else "validation")])
    con.close()
    pol = make_policy("harness:prior", k=2)
    want = fit_prior(bundles[:5])
    assert pol.agent_kw["prior"] == want and pol.spec["config"]["prior"]["n_tasks"] == len(want.task_ids)
    assert make_policy("harness:prior", train_tasks=bundles[:5]).agent_kw["prior"] == want


def test_warehouse_prior_waits_for_a_writer_instead_of_failing(bundles, tmp_path, monkeypatch):
    """Another process writing the warehouse (an evaluation's row writer, an ingest) holds DuckDB's
    file lock: harness:prior reads the train split through the warehouse's own lock and waits,
    where a raw read-only connect failed at once with "Could not set lock on file"."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from ratchet.policy import make_policy
    from ratchet.warehouse import Warehouse

    monkeypatch.setenv("RATCHET_HOME", str(tmp_path))
    with Warehouse(tmp_path / "warehouse.duckdb").connect() as con:
        con.execute("CREATE TABLE tasks (task_id VARCHAR, bundle VARCHAR)")
        con.execute("CREATE TABLE split_assignments (kind VARCHAR, source_id VARCHAR, split VARCHAR)")
        for b in bundles[:5]:
            con.execute("INSERT INTO tasks VALUES (?, ?)", [b.task_id, json.dumps(b.to_dict())])
            con.execute("INSERT INTO split_assignments VALUES ('task', ?, 'train')", [b.task_id])
    ready = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, pathlib; from ratchet.warehouse import Warehouse\n"
        f"with Warehouse(pathlib.Path({str(tmp_path / 'warehouse.duckdb')!r})).connect() as con:\n"
        "    con.execute('SELECT count(*) FROM tasks').fetchall()\n"
        f"    pathlib.Path({str(ready)!r}).touch(); time.sleep(3)\n")],
        cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.05)
        pol = make_policy("harness:prior", k=2)                 # while the writer still holds the file
        assert pol.agent_kw["prior"] == fit_prior(bundles[:5])
    finally:
        holder.kill() if holder.poll() is None else None
        holder.wait()
