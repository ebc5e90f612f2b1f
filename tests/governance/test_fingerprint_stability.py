"""AST fingerprints are part of the locked data: dedup clusters come from their collisions and
splits from the clusters, so a fingerprint that changes between versions re-clusters the
warehouse and can move a locked holdout. These recorded values make any change deliberate: if
one is intended, update the values here and say so in the CHANGELOG."""
import hashlib

import pytest

from ratchet.governance import ast_fingerprint as astfp

pytestmark = pytest.mark.governance

CODES = {
    "loop": "def has_close(numbers, threshold):\n    for i, x in enumerate(numbers):\n"
            "        for j, y in enumerate(numbers):\n            if i != j and abs(x - y) < threshold:\n"
            "                return True\n    return False\n",
    "class": "class Box:\n    async def get(self, key, default=None):\n        def inner(k):\n"
             "            return self.items.get(k, default)\n        return inner(key) or -1\n",
    "module": "import os\nx = [i ** 2 for i in range(10) if i % 3]\nprint(x, os.sep)\n",
    "tokens": "for (int i = 0; i < n; i++) { if (a[i] == 'x') return \"hit\" + i; }\n",
    "indented": "    def f(a):\n        return a[::-1]\n",
}

# (name, kind, skeleton, size, number of local shapes, sha1 of the sorted shapes), as recorded
RECORDED = {
    "loop": [("has_close", "function", "c3d5f0d58e1b472a", 34, 19, "5f1d0d27f05b")],
    "class": [("get", "function", "3034e52110ab8a26", 23, 16, "4bbf9189a8ba"),
              ("inner", "function", "04102e3c113f488e", 10, 8, "35b397a9ba4d")],
    "module": [("<module>", "module", "4bfd9be823e53394", 23, 18, "eab4caecb604")],
    "tokens": [("<tokens>", "tokens", "87333dfe2a57aa26", 31, 28, "b99393bd6f00")],
    "indented": [("f", "function", "f86cac81d5ed6da0", 9, 8, "dd809b86b429")],
}

PATCH = (
    "diff --git a/pkg/mod.py b/pkg/mod.py\n"
    "index 83db48f..bf269f4 100644\n"
    "--- a/pkg/mod.py\n"
    "+++ b/pkg/mod.py\t2026-12-01 10:00:00\n"
    "@@ -1,4 +1,4 @@\n"
    " def add(a, b):\n"
    "-    return a - b\n"
    "+    return a + b\n"
    "\n"
    " x = 1\n"
    "\\ No newline at end of file\n"
    "--- /dev/null\n"
    "+++ notes.txt\n"
    "@@ -0,0 +1,2 @@\n"
    "+first line\n"
    "+second line\n")


def _digest(fp: astfp.Fingerprint) -> tuple:
    shapes = hashlib.sha1(" ".join(sorted(fp.subtrees)).encode()).hexdigest()[:12]
    return (fp.name, fp.kind, fp.skeleton, fp.size, len(fp.subtrees), shapes)


@pytest.mark.parametrize("name", sorted(CODES))
def test_fingerprints_are_the_recorded_ones(name):
    assert [_digest(fp) for fp in astfp.fingerprint_code(CODES[name])] == RECORDED[name]


def test_skeleton_collisions_start_at_ten_nodes():
    """`inner` has 10 nodes and `f` 9: a renamed copy of the first collides by skeleton, of the
    second only by its (identical) local shapes."""
    inner = astfp.fingerprint_code(CODES["class"])[1]
    renamed = astfp.fingerprint_code("def other(q):\n    return self.things.get(q, fallback)\n")[0]
    assert inner.size == 10 and astfp.collide(inner, renamed) == ("skeleton", 1.0)
    f = astfp.fingerprint_code(CODES["indented"])[0]
    g = astfp.fingerprint_code("def g(word):\n    return word[::-1]\n")[0]
    assert f.size == 9 and astfp.collide(f, g) == ("subtree", 1.0)


def test_a_patch_is_read_as_the_new_side_of_each_file():
    assert astfp.patch_post_image(PATCH) == {"pkg/mod.py": "def add(a, b):\n    return a + b\n\nx = 1",
                                             "notes.txt": "first line\nsecond line"}
    assert astfp.patch_post_image("@@ -1 +1 @@\n-a = 1\n+a = 2\n") == {"<unknown>": "a = 2"}
    assert astfp.patch_post_image("just text, no diff") == {"<text>": "just text, no diff"}
    assert astfp.patch_post_image("") == {} and astfp.fingerprint_patch(None) == []
    # the .py file by its functions, the text file by its tokens
    assert [(fp.name, fp.kind, fp.size) for fp in astfp.fingerprint_patch(PATCH)] == [
        ("add", "function", 8), ("<tokens>", "tokens", 4)]
