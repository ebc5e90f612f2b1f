"""`build_clusters` reads every input shape it documents the same way, and key groups (same repo,
same issue) join their members whatever their order."""
import random
import string

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ratchet.governance.clusters import build_clusters

pytestmark = pytest.mark.governance


def _items(n_repos=(2, 3, 1, 2)):
    rng = random.Random(7)
    rows = []
    for r, n in enumerate(n_repos):
        for _ in range(n):
            text = " ".join("".join(rng.choices(string.ascii_lowercase, k=8)) for _ in range(40))  # unrelated texts
            rows.append({"id": f"i{len(rows):02d}", "text": text, "repo": f"repo-{r}"})
    rng.shuffle(rows)
    return rows


def _groups(items):
    clusters, _ = build_clusters(items, id_col="id", text_col="text", code_cols=(), key_cols={"repo": "same_repo"})
    by = {}
    for r in clusters.to_pylist():
        by.setdefault(r["cluster_id"], set()).add(r["id"])
    return sorted(sorted(g) for g in by.values())


def test_each_repo_is_one_cluster_whatever_the_order_of_its_groups():
    rows = _items()
    want = sorted(sorted(r["id"] for r in rows if r["repo"] == repo) for repo in {r["repo"] for r in rows})
    assert _groups(rows) == want and len(want) == 4
    assert _groups(list(reversed(rows))) == want


def test_every_documented_input_shape_gives_the_same_clusters(tmp_path):
    rows = _items()
    want = _groups(rows)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "items.parquet", row_group_size=3)
    shapes = {
        "generator of dicts": (r for r in rows),
        "a dict's values": {r["id"]: r for r in rows}.values(),
        "table": table,
        "one record batch in a list": table.combine_chunks().to_batches(),
        "record batches in a list": table.to_batches(max_chunksize=3),
        "generator of record batches": (b for b in table.to_batches(max_chunksize=3)),
        "record batch reader": pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=3)),
        "parquet file": str(tmp_path / "items.parquet"),
        "parquet folder": tmp_path,
        "pandas": table.to_pandas(),
    }
    assert len(table.combine_chunks().to_batches()) == 1
    for name, data in shapes.items():
        assert _groups(data) == want, name


def test_signatures_spill_under_ratchet_dedup_tmp_which_is_made_when_missing(tmp_path, monkeypatch):
    # docs/configuration.md: RATCHET_DEDUP_TMP is where dedup's temporary files go (a disk with room,
    # not a small /tmp); the signature matrix is one of them
    import tempfile
    spill = tmp_path / "spill" / "deeper"
    monkeypatch.setenv("RATCHET_DEDUP_TMP", str(spill))
    seen, real = [], tempfile.TemporaryFile

    def spy(*a, **k):
        seen.append(k.get("dir"))
        return real(*a, **k)

    monkeypatch.setattr(tempfile, "TemporaryFile", spy)
    rows = _items()
    want = _groups(rows)
    assert spill.is_dir() and seen == [str(spill)]
    assert _groups(rows) == want and seen == [str(spill)] * 2  # the folder exists now: reused


def test_no_items_give_empty_tables_with_the_documented_columns(tmp_path):
    """No items dedup to empty tables, not to an error."""
    empty = pa.table({c: pa.array([], pa.string()) for c in ("id", "text", "repo", "patch")})
    pq.write_table(empty, tmp_path / "empty.parquet")
    for data in (empty, [], str(tmp_path / "empty.parquet")):
        clusters, edges = build_clusters(data, id_col="id", text_col="text", code_cols=("patch",),
                                         key_cols={"repo": "same_repo"})
        assert clusters.num_rows == 0 and edges.num_rows == 0
        assert clusters.schema.names == ["id", "cluster_id", "cluster_size"]
        assert edges.schema.names == ["a", "b", "reason", "score"]


def test_edge_ends_are_four_byte_indexes_into_the_sorted_ids():
    """`a` and `b` are dictionary columns with int32 indices below 2**31 items: the 10M-row memory
    budget counts 4 bytes an edge end (docs/governance.md); they read as the item ids."""
    rows = _items((20, 30, 10, 20))   # 80 items: past any small cut-off a mutant might make of 2**31
    twin = dict(rows[0], id="twin")
    _, edges = build_clusters(rows + [twin], id_col="id", text_col="text", code_cols=(), key_cols={"repo": "same_repo"})
    for end in ("a", "b"):
        assert edges.schema.field(end).type == pa.dictionary(pa.int32(), pa.string())
    pairs = {tuple(sorted((r["a"], r["b"]))) for r in edges.to_pylist() if r["reason"] == "minhash"}
    assert tuple(sorted((rows[0]["id"], "twin"))) in pairs


def test_cluster_sizes_fall_in_the_documented_buckets():
    """The dedup chart's buckets (1, 2, 3-5, 6-10, 11-50, 51-200, >200), each edge in its own."""
    from ratchet.governance.items import size_histogram

    got = size_histogram([1, 2, 3, 5, 6, 10, 11, 50, 51, 200, 201, 10_000])
    assert got == {"1": 1, "2": 1, "3-5": 2, "6-10": 2, "11-50": 2, "51-200": 2, ">200": 2}
    assert size_histogram([]) == dict.fromkeys(got, 0)


def test_a_folder_without_parquet_files_is_refused_by_name(tmp_path):
    (tmp_path / "items.csv").write_text("id,text\n1,a\n")
    with pytest.raises(ValueError, match=f"no Parquet files in {tmp_path}"):
        build_clusters(tmp_path, id_col="id", text_col="text", code_cols=())
