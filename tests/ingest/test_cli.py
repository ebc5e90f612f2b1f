"""The `ratchet` CLI as users run it: a subprocess against a real warehouse."""
import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

from ratchet import samples

RATCHET = str(Path(sys.executable).parent / "ratchet")


def _run(home, *args):
    return subprocess.run([RATCHET, "--home", str(home.root), *args], capture_output=True, text=True, timeout=120)


def test_ingest_prints_json_summary_last_and_query_reads_it(home, tmp_path):
    samples.write_samples(tmp_path / "in", n_synthetic=20)
    out = _run(home, "ingest", str(tmp_path / "in"))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["read"] == summary["accepted"] + summary["quarantined"] + summary["duplicates"]
    assert summary["accepted"] == 26
    q = _run(home, "query", "SELECT reason_code, count(*) AS n FROM quarantine GROUP BY 1 ORDER BY 1", "--json")
    assert q.returncode == 0, q.stderr
    assert {r["reason_code"] for r in json.loads(q.stdout)} >= {"truncated_json", "nul_byte", "orphan_tool_result"}
    table = _run(home, "query", "SELECT count(*) AS trajectories FROM trajectories")
    assert "26" in table.stdout


def test_foreign_batch_attribution_flags(home, tmp_path):
    (tmp_path / "x.traj.json").write_text(json.dumps(samples.mini_swe_agent_traj()))
    out = _run(home, "ingest", "--tenant", "acme", "--consent", "CONSENT-TRN-2026-09", str(tmp_path / "x.traj.json"))
    assert out.returncode == 0, out.stderr
    q = _run(home, "query", "SELECT tenant_id, consent_id FROM trajectories", "--json")
    assert json.loads(q.stdout) == [{"tenant_id": "acme", "consent_id": "CONSENT-TRN-2026-09"}]


def test_errors_are_clear(home, tmp_path):
    out = _run(home, "query", "SELECT 1")
    assert out.returncode == 2 and "no warehouse" in out.stderr
    out = _run(home, "ingest", str(tmp_path / "nope"))
    assert out.returncode == 2 and "does not exist" in out.stderr
    _run(home, "ingest", str(tmp_path))  # creates the warehouse (empty folder: nothing read)
    out = _run(home, "query", "SELEC nonsense")
    assert out.returncode == 1 and "Parser Error" in out.stderr


def _ingest_proc(home_root, path, q):
    from ratchet.ingest import ingest
    from ratchet.warehouse import Warehouse
    q.put(ingest([path], Warehouse(Path(home_root) / "warehouse.duckdb")).as_dict())


def test_two_concurrent_ingests_serialise(home, tmp_path):
    """Two processes writing at once: both finish, nothing is lost or doubled."""
    from ratchet.synth import write_jsonl
    from ratchet.warehouse import Warehouse

    write_jsonl(tmp_path / "a.jsonl", 300, seed=1, start=0)
    write_jsonl(tmp_path / "b.jsonl", 300, seed=2, start=200)  # 100 trajectory ids overlap, other content
    q = mp.get_context("spawn").Queue()
    procs = [mp.get_context("spawn").Process(target=_ingest_proc, args=(str(home.root), tmp_path / f, q))
             for f in ("a.jsonl", "b.jsonl")]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(r["accepted"] for r in results) == 600
    with Warehouse(home.warehouse).connect() as con:
        assert con.execute("SELECT count(*), count(DISTINCT record_id) FROM trajectories").fetchone() == (600, 600)
        assert con.execute("SELECT count(*) FROM trajectories WHERE id_clash").fetchone()[0] == 200
