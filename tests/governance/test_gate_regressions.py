"""Each test here names a bug that once survived the suite when planted by hand, and fails if
it comes back: the contamination gate's repo/issue recomputation, a
trajectory without timestamps training, and the slice term of the split algorithm."""
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from ratchet import tables
from ratchet.governance import items as gov_items
from ratchet.governance import tables as gov_tables
from ratchet.governance import training_views
from ratchet.governance.consent import decide, grants_from_rows, training_view
from ratchet.governance.contamination import contamination_report, report_rows
from ratchet.governance.splits import assign_splits, split_targets

pytestmark = pytest.mark.governance
NOW = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)


# ------------------------------------------------------------------ contamination: repo / issue
def _pair(repo_b, issue_b):
    """Two unrelated tasks (no shared text or code), one in train and one in holdout."""
    items = [
        {"id": "a", "text": "sort a list of integers in place", "code": "def f(x):\n    return sorted(x)\n",
         "repo": "acme/widgets", "issue_id": "acme/widgets#7", "task_key": "task-a"},
        {"id": "b", "text": "parse an ISO date and report the weekday",
         "code": "import datetime\ndef g(s):\n    d = datetime.date.fromisoformat(s)\n    return d.weekday() * 3 + 1\n",
         "repo": repo_b, "issue_id": issue_b, "task_key": "task-b"},
    ]
    return [{"id": "a", "split": "train"}, {"id": "b", "split": "holdout"}], items


@pytest.mark.parametrize("key_cols", [None, gov_items.CONTAMINATION_KEYS], ids=["default", "asset_keys"])
def test_shared_repo_and_issue_across_train_and_holdout_fails_the_gate(key_cols):
    kw = dict(id_col="id", text_col="text", code_cols=("code",), key_cols=key_cols)
    clean = contamination_report(*_pair("globex/tools", "globex/tools#1"), **kw)
    assert clean["passed"] and clean["overlap_fraction"] == 0.0 and sum(clean["counts"].values()) == 0
    rep = contamination_report(*_pair("acme/widgets", "acme/widgets#7"), **kw)
    assert not rep["passed"]
    assert rep["counts"]["repo"] == 1 and rep["counts"]["issue"] == 1
    assert rep["n_overlapping_items"] == 2 and rep["overlap_fraction"] == 1.0
    assert {(p["split_a"], p["split_b"]) for kind in ("repo", "issue") for p in report_rows(rep, kind)} == {("train", "holdout")}
    only_repo = contamination_report(*_pair("acme/widgets", "acme/widgets#8"), **kw)
    assert not only_repo["passed"] and only_repo["counts"]["repo"] == 1 and only_repo["counts"]["issue"] == 0
    only_issue = contamination_report(*_pair("globex/tools", "acme/widgets#7"), **kw)
    assert not only_issue["passed"] and only_issue["counts"]["issue"] == 1 and only_issue["counts"]["repo"] == 0


def test_asset_contamination_keys_cover_repo_and_issue():
    """The asset passes `gov_items.CONTAMINATION_KEYS`: dropping a key there silently weakens the gate."""
    assert gov_items.CONTAMINATION_KEYS["repo"] == "repo" and gov_items.CONTAMINATION_KEYS["issue_id"] == "issue"
    assert gov_items.CLUSTER_KEYS["repo"] == "same_repo" and gov_items.CLUSTER_KEYS["issue_id"] == "same_issue"


# ------------------------------------------------------------------------ consent: timestamps
GRANTS = grants_from_rows([{"consent_id": "G", "tenant_id": "acme", "scopes": ["train"], "retention_days": 90,
                            "granted_at": "2026-09-01T00:00:00Z"}])


@pytest.mark.parametrize("started_at,ended_at", [(None, None), ("", ""), (None, "")])
def test_trajectory_without_any_timestamp_counts_as_expired(started_at, ended_at):
    t = {"record_id": "r", "trajectory_id": "r", "tenant_id": "acme", "consent_id": "G",
         "started_at": started_at, "ended_at": ended_at}
    reason, detail = decide(t, GRANTS, NOW, "acme")
    assert reason == "expired" and "no timestamp" in detail
    view, audit = training_view([t], GRANTS, NOW, "acme")
    assert view == [] and [a["reason"] for a in audit] == ["expired"]
    train, audit = training_views.training_rows([t], GRANTS, {"r": {"split": "train", "cluster_id": "c"}}, NOW)
    assert train == [] and [a["reason"] for a in audit] == ["expired"]


def test_started_at_alone_bounds_retention():
    t = {"record_id": "r", "tenant_id": "acme", "consent_id": "G", "ended_at": None}
    assert decide({**t, "started_at": NOW - timedelta(days=10)}, GRANTS, NOW, "acme") == (None, "")
    assert decide({**t, "started_at": NOW - timedelta(days=91)}, GRANTS, NOW, "acme")[0] == "expired"


# ---------------------------------------------------------------- splits: slice stratification
def _stratified_items():
    """116 singleton clusters over four slices of unequal size (targets 60 / 16 / 40)."""
    sizes = {"op": 52, "cmp": 36, "const": 20, "rare": 8}
    return [{"id": f"{s}-{i}", "cluster_id": f"c-{s}-{i}", "slice": s} for s, n in sizes.items() for i in range(n)], sizes


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_slice_is_spread_across_splits_like_the_whole(seed):
    items, sizes = _stratified_items()
    tgt = split_targets(len(items))
    rows = assign_splits(items, seed=seed).to_pylist()
    assert Counter(r["split"] for r in rows) == Counter(tgt)
    per = Counter((r["slice"], r["split"]) for r in rows)
    for s, n in sizes.items():
        for split, t in tgt.items():
            want = n * t / len(items)
            assert abs(per[(s, split)] - want) <= 1.0, (seed, s, split, per[(s, split)], want)


def test_warehouse_items_carry_repo_and_issue_into_the_gate(wh, tmp_path):
    """The asset's path: ingested rows -> `gov_items.governance_items` -> the gate with the asset's keys."""
    import random

    import orjson

    from ratchet.ingest import ingest
    from ratchet.synth import trajectory

    rng = random.Random(5)
    a, b, c = (trajectory(i, rng) for i in range(3))
    b.update(repo=a["repo"], issue_id=a["issue_id"])              # b shares a's repo and issue
    c.update(repo="zeta/other", issue_id="zeta/other#1")
    (tmp_path / "t.jsonl").write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in (a, b, c)))
    ingest([tmp_path / "t.jsonl"], wh)
    with wh.connect() as con:
        tables.ensure_all(con)
        items = gov_items.governance_items(con)
        rid = dict(con.execute("SELECT trajectory_id, record_id FROM trajectories").fetchall())
    item = {t: f"{gov_tables.TRAJ_PREFIX}{rid[t]}" for t in rid}
    got = {r["id"]: (r["repo"], r["issue_id"]) for r in items.to_pylist()}
    assert got[item[a["trajectory_id"]]] == got[item[b["trajectory_id"]]] == (a["repo"], a["issue_id"])
    split = {a["trajectory_id"]: "train", b["trajectory_id"]: "holdout", c["trajectory_id"]: "val"}
    rep = contamination_report([{"id": item[t], "split": s} for t, s in split.items()], items, id_col="id",
                               text_col=None, code_cols=(), key_cols=gov_items.CONTAMINATION_KEYS)
    assert not rep["passed"] and rep["counts"]["repo"] == 1 and rep["counts"]["issue"] == 1
    assert {p["a"] for k in ("repo", "issue") for p in report_rows(rep, k)} | {
        p["b"] for k in ("repo", "issue") for p in report_rows(rep, k)} == {item[a["trajectory_id"]], item[b["trajectory_id"]]}
