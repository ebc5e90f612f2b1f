"""Dedup's stored contract: cluster ids are stable hashes of the smallest member, and a table
without the optional key columns clusters as if those keys were empty."""
import hashlib

import pyarrow as pa
import pytest

from ratchet.governance.clusters import build_clusters, cluster_id_for

pytestmark = pytest.mark.governance


def test_a_cluster_id_is_the_documented_hash_of_its_smallest_member():
    # stored in dedup_clusters and split_assignments: a new format would re-key every cluster
    assert cluster_id_for("task-1") == "dc-" + hashlib.sha1(b"task-1").hexdigest()[:16]
    assert len(cluster_id_for("x")) == 19


def test_a_table_without_repo_or_issue_columns_clusters_by_text_only():
    items = pa.table({"record_id": ["a", "b", "c"],
                      "prompt_text": ["fix the date parser for leap years in the calendar module",
                                      "fix the date parser for leap years in the calendar module",
                                      "an unrelated request about rendering markdown tables"]})
    clusters, edges = build_clusters(items, code_cols=())
    by = dict(zip(clusters.column("id").to_pylist(), clusters.column("cluster_id").to_pylist()))
    assert by["a"] == by["b"] == cluster_id_for("a") and by["c"] == cluster_id_for("c")
    assert edges.column("reason").to_pylist() == ["minhash"]


def test_a_shared_repo_or_issue_joins_a_cluster_and_an_empty_key_joins_nothing():
    items = [{"record_id": "a", "repo": "org/x", "issue_id": None}, {"record_id": "b", "repo": "org/x", "issue_id": ""},
             {"record_id": "c", "repo": "", "issue_id": "org/y#1"}, {"record_id": "d", "repo": None, "issue_id": "org/y#1"},
             {"record_id": "e", "repo": "", "issue_id": ""}, {"record_id": "f", "repo": None, "issue_id": None},
             {"record_id": "g", "repo": "org/x", "issue_id": None}]
    clusters, edges = build_clusters(items, text_col=None, code_cols=())
    by = dict(zip(clusters.column("id").to_pylist(), clusters.column("cluster_id").to_pylist()))
    assert by["a"] == by["b"] == by["g"] and by["c"] == by["d"] and len({by["a"], by["c"], by["e"], by["f"]}) == 4
    # a star from the group's smallest id (n members, n - 1 edges), each scored 1.0
    assert sorted(zip(*(edges.column(c).to_pylist() for c in ("a", "b", "reason", "score")))) == [
        ("a", "b", "same_repo", 1.0), ("a", "g", "same_repo", 1.0), ("c", "d", "same_issue", 1.0)]


RENAMED = ("def total(xs):\n    s = 0\n    for x in xs:\n        if x > 0:\n            s += x * 2\n    return s\n",
           "def summe(values):\n    acc = 0\n    for v in values:\n        if v > 0:\n            acc += v * 2\n    return acc\n")


def test_renamed_copies_of_one_function_join_by_their_skeleton():
    items = [{"record_id": "a", "patch": RENAMED[0]}, {"record_id": "b", "patch": RENAMED[1]}]
    _, edges = build_clusters(items, text_col=None, key_cols={})
    assert edges.to_pylist() == [{"a": "a", "b": "b", "reason": "ast_skeleton", "score": 1.0}]


def test_an_item_without_code_does_not_stop_the_fingerprints_of_the_next():
    from ratchet.governance.clusters import fingerprints

    assert [len(f) for f in fingerprints(["", RENAMED[0], None, RENAMED[1]])] == [0, 1, 0, 1]


def test_a_patch_is_told_from_plain_code():
    from ratchet.governance.clusters import looks_like_patch

    assert looks_like_patch("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    assert looks_like_patch("some preamble\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    assert not looks_like_patch(RENAMED[0])
    assert not looks_like_patch("--x = 1\n")


def test_two_copies_of_a_function_too_small_for_a_skeleton_still_join():
    small = "def f(x):\n    return x + 1\n"
    items = [{"record_id": "a", "patch": small}, {"record_id": "b", "patch": small},
             {"record_id": "c", "patch": "def g(y):\n    return y * y - 3\n"}]
    clusters, edges = build_clusters(items, text_col=None, key_cols={})
    assert edges.to_pylist() == [{"a": "a", "b": "b", "reason": "ast_subtree", "score": 1.0}]
    assert clusters.column("cluster_size").to_pylist() == [2, 2, 1]


def test_a_function_of_exactly_the_minimum_size_is_matched_by_its_skeleton():
    from ratchet.governance import ast_fingerprint as astfp
    from ratchet.governance.clusters import fingerprints

    a, b = "def f(x, y):\n    return x + y * 2\n", "def add(p, q):\n    return p + q * 7\n"
    assert [fp.size for fp in fingerprints([a])[0]] == [astfp.MIN_SKELETON_NODES]
    _, edges = build_clusters([{"record_id": "a", "patch": a}, {"record_id": "b", "patch": b}], text_col=None, key_cols={})
    assert edges.column("reason").to_pylist() == ["ast_skeleton"]
