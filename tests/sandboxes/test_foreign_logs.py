"""The shell agent's runs written as SWE-agent and ATIF logs: ingest reads them back through its
adapters with every bash and str_replace_editor call, and every one of them trains."""
import json
from datetime import datetime, timezone

import pytest

pytestmark = pytest.mark.evaluation


@pytest.fixture(scope="module")
def runs(tmp_path_factory, runtime):
    from sandboxes.agents import run_agent
    from sandboxes.agents.prior import fit_prior
    from sandboxes.humaneval import build_suite

    tasks = sorted(build_suite(seed=0, limit=2, per_problem=2, cache_dir=tmp_path_factory.mktemp("suite")).tasks,
                   key=lambda b: b.task_id)
    prior = fit_prior(tasks)
    return [(b, run_agent("shell", b, seed=0, prior=prior, runtime=runtime)) for b in tasks[:2]]


def test_the_shell_agent_fixes_through_bash_and_the_editor(runs):
    for b, r in runs:
        names = [m["tool_calls"][0]["function"]["name"] for m in r.messages if m.get("tool_calls")]
        assert names[:3] == ["bash", "localize", "str_replace_editor"] and names[-1] == "submit"
        assert r.accepted and "str_replace_editor" in names[3:] and names.count("bash") >= 2, (b.task_id, names)


def test_its_logs_ingest_as_swe_agent_and_atif_and_train(runs, tmp_path):
    from ratchet.ingest import IngestOptions, ingest
    from ratchet.training.recipe import coverage
    from ratchet.warehouse import Warehouse
    from sandboxes.foreign_logs import atif_traj, swe_agent_traj
    from sandboxes.tools import TOOL_SCHEMAS

    land = tmp_path / "landing"
    for sub, fn, ext in (("swe-agent", swe_agent_traj, ".traj"), ("atif", atif_traj, ".json")):
        (land / sub).mkdir(parents=True)
        (land / sub / "_batch.yaml").write_text("tenant_id: acme\nconsent_id: C-ACME\n")
        for b, r in runs:
            (land / sub / f"{b.task_id}{ext}").write_text(json.dumps(fn(r, b)))
    wh = Warehouse(tmp_path / "wh.duckdb")
    wh.ensure_schema()
    summary = ingest([land], wh, IngestOptions(workers=1))
    assert summary.accepted == 4 and summary.quarantined == 0
    with wh.connect() as con:
        rows = [dict(zip(("record_id", "source_format", "task_id", "tenant_id", "messages"), r)) for r in con.execute(
            "SELECT record_id, source_format, task_id, tenant_id, messages FROM trajectories ORDER BY 2, 3").fetchall()]
    assert [(r["source_format"], r["task_id"], r["tenant_id"]) for r in rows] == [
        (fmt, b.task_id, "acme") for fmt in ("atif", "swe_agent") for b, _ in runs]
    by_task = {b.task_id: r for b, r in runs}
    for row in rows:
        msgs = json.loads(row["messages"])
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for m in msgs if m.get("role") == "assistant" for c in m.get("tool_calls") or ()]
        logged = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                  for m in by_task[row["task_id"]].messages if m.get("tool_calls") for c in m["tool_calls"]]
        assert calls == logged, row["source_format"]                      # every call, arguments intact
    cov = coverage(rows, TOOL_SCHEMAS)
    assert all(e["trains"] and e["trainable_turns"] == e["turns"] for e in cov), cov


def test_generate_foreign_writes_both_formats_for_the_tenants_valid_grant(tmp_path, runtime):
    """The demo's foreign logs: half the shell agent's runs as SWE-agent files, half as ATIF, each
    folder with a `_batch.yaml` naming the tenant, its valid grant and the runs' acceptance (the
    formats carry none of them), and ingest attributes every one of them so."""
    from ratchet.ingest import IngestOptions, ingest
    from ratchet.warehouse import Warehouse
    from sandboxes.generate import FOREIGN_TENANT, generate_foreign, grant_table
    from sandboxes.humaneval import build_suite

    suite = build_suite(seed=0, limit=2, per_problem=2, cache_dir=tmp_path / "suite")
    out = generate_foreign(tmp_path / "land", n_tasks=2, suite=suite, as_of="2026-11-28", runtime=runtime)
    grant = grant_table(datetime(2026, 11, 28, tzinfo=timezone.utc))[(FOREIGN_TENANT, "valid")]["consent_id"]
    assert out["by_format"] == {"swe-agent": 1, "atif": 1} and out["consent_id"] == grant
    assert sorted(p.suffix for p in (tmp_path / "land").rglob("*") if p.is_file() and p.name != "_batch.yaml") == \
        [".json", ".traj"]
    wh = Warehouse(tmp_path / "wh.duckdb")
    wh.ensure_schema()
    assert ingest([tmp_path / "land"], wh, IngestOptions(workers=1)).accepted == 2
    with wh.connect() as con:
        got = sorted(con.execute("SELECT source_format, tenant_id, consent_id, accepted FROM trajectories").fetchall())
        # every record has a timestamp, so consent can judge its retention (SWE-agent's from the sidecar)
        assert con.execute("SELECT count(*) FROM trajectories WHERE ended_at IS NULL AND started_at IS NULL").fetchone() \
            == (0,)
    accepted = {"swe_agent": bool(out["accepted"]["swe-agent"]), "atif": bool(out["accepted"]["atif"])}
    assert got == [("atif", FOREIGN_TENANT, grant, accepted["atif"]),
                   ("swe_agent", FOREIGN_TENANT, grant, accepted["swe_agent"])]
