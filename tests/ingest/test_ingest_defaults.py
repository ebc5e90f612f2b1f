"""Ingest's defaults are set in one place and every surface a user reads says the same: the
CLI flag, the Dagster launchpad's config and the docs (a default that drifts between them means
a record accepted by one way in is quarantined by another)."""
import re
from pathlib import Path

from ratchet.ingest import DEFAULT_MAX_RECORD_MB, IngestOptions

ROOT = Path(__file__).resolve().parents[2]


def test_the_record_size_limit_is_the_same_everywhere_a_user_sets_or_reads_it():
    from assets.ingest import IngestConfig
    from pipelines.cli import build_parser

    assert IngestOptions().max_record_mb == DEFAULT_MAX_RECORD_MB
    assert build_parser().parse_args(["ingest", "x"]).max_record_mb == DEFAULT_MAX_RECORD_MB
    assert IngestConfig().max_record_mb == DEFAULT_MAX_RECORD_MB
    documented = {
        "docs/ingest.md": r"default limit (\d+) MiB, `--max-record-mb`",
        "docs/guides/own-agent-logs.md": r"`--max-record-mb N` \| largest record accepted \(default (\d+)\)",
    }
    for doc, pattern in documented.items():
        said = re.search(pattern, " ".join((ROOT / doc).read_text().split()))
        assert said, f"{doc} no longer states the default record limit"
        assert float(said.group(1)) == DEFAULT_MAX_RECORD_MB, doc


def test_the_number_of_skipped_files_named_in_a_summary_is_the_documented_one():
    from ratchet.ingest import SKIPPED_LISTED

    said = re.search(r"the first (\d+) in `skipped_files`", " ".join((ROOT / "docs/ingest.md").read_text().split()))
    assert said and int(said.group(1)) == SKIPPED_LISTED


def test_large_inputs_are_normalised_by_one_process_per_core_unless_workers_is_set(monkeypatch):
    """docs/ingest.md: `--workers N` sets the number of normalising processes (0 = one per core)."""
    from pipelines.cli import build_parser
    from ratchet.ingest import worker_count

    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert IngestOptions().workers == 0 == build_parser().parse_args(["ingest", "x"]).workers
    assert worker_count(IngestOptions()) == 6
    assert worker_count(IngestOptions(workers=3)) == 3
    monkeypatch.setattr("os.cpu_count", lambda: None)        # unknown core count: one process
    assert worker_count(IngestOptions()) == 1
    said = " ".join((ROOT / "docs/ingest.md").read_text().split())
    assert "`--workers N` sets the number of normalising processes (0 = one per core)" in said
