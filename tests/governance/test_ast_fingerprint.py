import itertools

import pytest

from ratchet.governance.ast_fingerprint import collide, fingerprint_code, fingerprint_patch
from ratchet.governance.clusters import build_clusters

from .synthetic import PROBLEMS, mutant_tasks, mutate

pytestmark = pytest.mark.governance


def test_every_single_token_mutant_collides_with_its_original():
    for name, src in PROBLEMS.items():
        orig = fingerprint_code(src)[0]
        for seed in range(25):
            kind, code = mutate(src, seed)
            assert collide(orig, fingerprint_code(code)[0]), (name, kind, code)


def test_different_problems_do_not_collide():
    fps = {n: fingerprint_code(s)[0] for n, s in PROBLEMS.items()}
    for a, b in itertools.combinations(sorted(fps), 2):
        assert collide(fps[a], fps[b]) is None, (a, b)


def test_renamed_and_reliteraled_copy_has_same_skeleton():
    a = fingerprint_code("def f(xs, t):\n    total = 0\n    for x in xs:\n        if x > t:\n            total += x * 2\n    return total\n")[0]
    b = fingerprint_code("def g(items, lim):\n    acc = 10\n    for it in items:\n        if it < lim:\n            acc -= it * 7\n    return acc\n")[0]
    assert a.skeleton == b.skeleton and collide(a, b) == ("skeleton", 1.0)


@pytest.mark.parametrize("bad", [
    "def broken(:\n  return", "@@ -1,3 +1,3 @@\n-    return x\n+    return y\n", "\x00\x01garbage", "}{", "(" * 5000,
    "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -3,2 +3,2 @@ def f(a):\n-    if a < 1:\n+    if a <= 1:\n         return a\n",
    None, "",
])
def test_unparseable_code_falls_back_without_crashing(bad):
    fps = fingerprint_patch(bad) if bad and "@@" in bad else fingerprint_code(bad)
    assert isinstance(fps, list)
    if bad and bad.strip() and "(" * 5000 != bad:
        assert fps and all(f.skeleton for f in fps)


def test_mutants_cluster_by_code_alone_without_repo_or_text():
    tasks = mutant_tasks(5)
    clusters, edges = build_clusters(tasks, id_col="task_id", text_col=None, code_cols=("solution",), key_cols={})
    by_problem = {}
    for r in clusters.to_pylist():
        by_problem.setdefault(r["id"].rsplit("-m", 1)[0], set()).add(r["cluster_id"])
    assert all(len(c) == 1 for c in by_problem.values())
    assert len({next(iter(c)) for c in by_problem.values()}) == len(PROBLEMS)
    assert set(edges.column("reason").to_pylist()) <= {"ast_skeleton", "ast_subtree"}


def test_a_patch_is_fingerprinted_by_its_post_image_per_file():
    """Added and context lines (a blank context line included) of every hunk, per `+++` path
    with its a/ or b/ prefix dropped; removed lines and headers left out; a hunk without a
    `+++` header is "<unknown>"; text that is not a diff is itself."""
    from ratchet.governance.ast_fingerprint import patch_post_image

    post = "def f(xs, t):\n    total = 0\n\n    for x in xs:\n        if x > t:\n            total += x * 2\n    return total"
    diff = ("diff --git a/pkg/m.py b/pkg/m.py\nindex 1..2 100644\n--- a/pkg/m.py\n+++ b/pkg/m.py\t2026-01-01\n"
            "@@ -1,7 +1,7 @@\n def f(xs, t):\n     total = 0\n\n     for x in xs:\n-        if x < t:\n+        if x > t:\n"
            "             total += x * 2\n     return total\n"
            "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-old words\n+new = words\n")
    assert patch_post_image(diff) == {"pkg/m.py": post, "README.md": "new = words"}
    fps = fingerprint_patch(diff)
    # a file that is not Python is tokens even where its text happens to parse as Python
    assert fps[0] == fingerprint_code(post)[0] and [f.kind for f in fps] == ["function", "tokens"]
    # code that is not a diff, or a hunk without a path, is parsed as Python
    assert [f.kind for f in fingerprint_patch(post)] == ["function"]
    assert [f.kind for f in fingerprint_patch("@@ -1 +1 @@\n+def g(a):\n+    return a + 1\n")] == ["function"]
    assert patch_post_image("@@ -1 +1 @@\n-a\n+b\n") == {"<unknown>": "b"}
    assert patch_post_image("just some text") == {"<text>": "just some text"}
    assert patch_post_image("--- a/x.py\n+++ b/x.py\n+not in a hunk\n") == {"x.py": ""}


def test_collision_thresholds_are_inclusive():
    from ratchet.governance.ast_fingerprint import MIN_SKELETON_NODES, SUBTREE_JACCARD, Fingerprint

    big = Fingerprint("f", "function", "s", frozenset({"x"}), MIN_SKELETON_NODES)
    assert collide(big, big) == ("skeleton", 1.0)
    assert collide(big, Fingerprint("g", "function", "s", frozenset({"y"}), MIN_SKELETON_NODES - 1)) is None
    # exactly SUBTREE_JACCARD (0.55 = 11 shared of 20) collides; one shape fewer does not
    shared = {f"h{i}" for i in range(11)}
    a = Fingerprint("f", "function", "a", frozenset(shared | {f"a{i}" for i in range(4)}), 3)
    b = Fingerprint("g", "function", "b", frozenset(shared | {f"b{i}" for i in range(5)}), 3)
    assert SUBTREE_JACCARD == 0.55 and collide(a, b) == ("subtree", 0.55)
    c = Fingerprint("g", "function", "b", frozenset(set(list(shared)[:10]) | {f"b{i}" for i in range(6)}), 3)
    assert collide(a, c) is None
    empty = Fingerprint("e", "function", "e", frozenset(), 3)
    assert collide(empty, empty) is None  # no shapes: nothing shared, not everything


def test_two_items_sharing_most_subtrees_are_an_edge():
    """The shape index runs from two distinct shapes on: two functions with different skeletons
    (one adds a statement) that share most subtrees are an `ast_subtree` edge, alone or with a
    third unrelated item."""
    from ratchet.governance.clusters import ast_edges, fingerprints

    a = "def f(xs, t):\n    total = 0\n    for x in xs:\n        if x > t:\n            total += x * 2\n    return total\n"
    b = a.replace("def f", "def g").replace("    return total", "    total = total - 1\n    return total")
    assert collide(fingerprint_code(a)[0], fingerprint_code(b)[0])[0] == "subtree"
    assert ast_edges(["x", "y"], fingerprints([a, b])) == [("x", "y", "ast_subtree", 0.894737)]
    assert ast_edges(["x", "y", "z"], fingerprints([a, b, "def h(q):\n    return q\n"])) == [("x", "y", "ast_subtree", 0.894737)]


def test_a_star_joins_each_groups_smallest_item_to_its_other_items_once():
    """`_star`, the skeleton and identical-subtree edges: per group, the smallest item to every other
    distinct item. An item may sit in several groups (one per function of its code), and may be
    listed twice in one (two copies of a function): it still belongs to each group, and once."""
    import numpy as np

    from ratchet.governance.clusters import _star

    group = np.array([0, 0, 0, 1, 1, 1, 1, -1, 2])
    item = np.array([1, 2, 2, 2, 5, 5, 7, 9, 4])   # 2 closes group 0 and opens group 1; 9 is in none
    a, b = _star(group, item)
    assert sorted(zip(a.tolist(), b.tolist())) == [(1, 2), (2, 5), (2, 7)]
    shuffled = np.random.default_rng(0).permutation(len(group))
    a2, b2 = _star(group[shuffled], item[shuffled])
    assert sorted(zip(a2.tolist(), b2.tolist())) == [(1, 2), (2, 5), (2, 7)]


def test_an_item_holding_two_problems_joins_both_into_one_cluster():
    p, q = PROBLEMS["has_close_elements"], PROBLEMS["separate_paren_groups"]
    for first, second in ((p, q), (q, p)):
        items = [{"task_id": "a", "solution": first}, {"task_id": "b", "solution": first + "\n" + second},
                 {"task_id": "c", "solution": second}]
        clusters, edges = build_clusters(items, id_col="task_id", text_col=None, code_cols=("solution",), key_cols={})
        assert len(set(clusters.column("cluster_id").to_pylist())) == 1
        pairs = list(zip(edges.column("a").to_pylist(), edges.column("b").to_pylist()))
        assert len(pairs) == len(set(pairs)) and all(x != y for x, y in pairs)


def test_code_that_parses_but_nests_too_deep_to_walk_falls_back_to_tokens():
    """A hostile patch can parse and still be too deep to fingerprint (Python's recursion limit):
    it gets the token fingerprint, and a token fingerprint never collides with a parsed one, even
    of the same text (their shapes are not comparable)."""
    import ast

    deep = "def f():\n    return " + "-" * 900 + "1\n"
    ast.parse(deep)                                  # parses: the fallback is the walk's, not the parser's
    fps = fingerprint_code(deep)
    assert [f.kind for f in fps] == ["tokens"]
    parsed = fingerprint_code("def f():\n    return -1\n")
    assert [f.kind for f in parsed] == ["function"]
    assert collide(fps[0], parsed[0]) is None and collide(parsed[0], fps[0]) is None
    assert collide(fps[0], fingerprint_code(deep)[0]) == ("skeleton", 1.0)   # two copies of it still join


def test_fingerprints_of_different_kinds_never_collide():
    """A token-shingle fingerprint (code that does not parse) and a parsed one never collide, even
    with equal hashes: their hashes are of different things."""
    from ratchet.governance.ast_fingerprint import MIN_SKELETON_NODES, Fingerprint

    shapes = frozenset({"x", "y"})
    parsed = Fingerprint("f", "function", "s", shapes, MIN_SKELETON_NODES)
    tokens = Fingerprint("<tokens>", "tokens", "s", shapes, MIN_SKELETON_NODES)
    assert collide(parsed, parsed) == ("skeleton", 1.0) and collide(tokens, tokens) == ("skeleton", 1.0)
    assert collide(parsed, tokens) is None and collide(tokens, parsed) is None
    module = Fingerprint("<module>", "module", "s", shapes, MIN_SKELETON_NODES)
    assert collide(parsed, module) == ("skeleton", 1.0)   # a module and a function are both parsed code
    broken = fingerprint_code("def f(:\n    return 1 +")[0]
    assert broken.kind == "tokens" and collide(broken, fingerprint_code("def f(a):\n    return a + 1\n")[0]) is None


def test_a_token_fingerprint_holds_one_shingle_per_window_and_one_for_a_short_text():
    """Unparseable code is shingled in windows of TOKEN_SHINGLE tokens: n - k + 1 windows, and a
    text no longer than a window is one shingle."""
    from ratchet.governance.ast_fingerprint import TOKEN_SHINGLE

    ops = "+ - * / % & | ^ ~ < > @".split()
    for n in (1, 2, TOKEN_SHINGLE - 1, TOKEN_SHINGLE, TOKEN_SHINGLE + 1, 10):
        fp = fingerprint_code(" ".join(ops[:n]) + " (")   # distinct tokens; an open parenthesis never parses
        assert fp[0].kind == "tokens" and fp[0].size == n + 1
        assert len(fp[0].subtrees) == max(n + 1 - TOKEN_SHINGLE + 1, 1), (n, sorted(fp[0].subtrees))
