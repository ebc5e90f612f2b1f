"""Each test here names a bug that once survived the suite when planted by hand: the contract
check made non-blocking, the ingest lock removed (the same file ingested twice at once), and
per-file counts carried from one file to the next."""
import multiprocessing as mp
from pathlib import Path


from ratchet.ingest import ingest
from ratchet.synth import write_jsonl
from ratchet.warehouse import Warehouse


def test_contract_check_is_blocking_in_the_loaded_definitions():
    from pipelines.definitions import defs

    g = defs.resolve_asset_graph()
    specs = {k.name: g.get_check_spec(k) for k in g.asset_check_keys}
    assert specs["trajectories_contract"].blocking is True
    assert specs["trajectories_contract"].asset_key.to_user_string() == "trajectories"
    assert specs["quarantine_rate"].blocking is False  # a warning by design: never blocks


def _ingest_proc(home_root, path, start, q):
    wh = Warehouse(Path(home_root) / "warehouse.duckdb")
    start.wait(timeout=120)  # both processes are warmed up (imports done) before either ingests
    q.put(ingest([path], wh).as_dict())


def test_same_file_ingested_twice_at_once_is_stored_once(home, tmp_path):
    n = 2000
    write_jsonl(tmp_path / "same.jsonl", n, seed=3)
    ctx = mp.get_context("spawn")
    start, q = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_ingest_proc, args=(str(home.root), tmp_path / "same.jsonl", start, q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0], "an ingest process failed (see its traceback above)"
    results = [q.get(timeout=10) for _ in procs]
    assert [r["read"] for r in results] == [n, n]
    assert sorted(r["accepted"] for r in results) == [0, n]
    assert sorted(r["duplicates"] for r in results) == [0, n]
    assert all(r["read"] == r["accepted"] + r["quarantined"] + r["duplicates"] for r in results)
    with Warehouse(home.warehouse).connect() as con:
        assert con.execute("SELECT count(*), count(DISTINCT record_id) FROM trajectories").fetchone() == (n, n)
        assert con.execute("SELECT count(*) FROM trajectories WHERE id_clash").fetchone()[0] == 0
        assert con.execute('SELECT sum("read"), sum(accepted), sum(duplicates) FROM ingest_batches').fetchone() == (
            2 * n, n, n)
        assert con.execute('SELECT sum("read"), sum(accepted), sum(duplicates) FROM ingest_files').fetchone() == (
            2 * n, n, n)


def test_per_file_counts_are_each_files_own(wh, tmp_path):
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a.jsonl", 5, seed=1, start=0)
    write_jsonl(tmp_path / "in" / "b.jsonl", 7, seed=2, start=100)
    write_jsonl(tmp_path / "in" / "c.jsonl", 3, seed=1, start=0)     # the first 3 of a.jsonl again
    s = ingest([tmp_path / "in"], wh)
    assert (s.read, s.accepted, s.duplicates) == (15, 12, 3)
    with wh.connect() as con:
        rows = con.execute('SELECT source_file, "read", accepted, quarantined, duplicates FROM ingest_files '
                           "WHERE status = 'read' ORDER BY source_file").fetchall()
    assert [(Path(f).name, r, a, qn, d) for f, r, a, qn, d in rows] == [
        ("a.jsonl", 5, 5, 0, 0), ("b.jsonl", 7, 7, 0, 0), ("c.jsonl", 3, 0, 0, 3)]
