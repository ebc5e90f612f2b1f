"""Stages one batch: dedups chunks against the batch and the warehouse, gathers small chunks into
parts, stages quarantine rows, keeps the counts. Nothing it writes is visible before
`Warehouse.commit_batch` (see ratchet.ingest)."""
from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from ratchet.ingest_records import ChunkResult
from ratchet.warehouse import QUARANTINE_SCHEMA, Warehouse, write_part

# rows of small files are gathered into parts of up to this many rows or this many bytes of Arrow
# data (not one part per file)
PART_ROWS = 65536  # pragma: no mutate (a file layout size: the rows read back are the same)
PART_BYTES = 96 << 20  # pragma: no mutate (a file layout size: the rows read back are the same)


class BatchWriter:
    """Dedups chunks against the batch and the warehouse, stages them, keeps the counts. Nothing
    it writes is visible before `Warehouse.commit_batch`."""

    def __init__(self, wh: Warehouse, summary, now: datetime, staging: Path, landing: Path | None = None):
        self.wh, self.s, self.now, self.staging = wh, summary, now, staging
        self.landing = landing
        self._file_keys: dict[str, str] = {}
        self.seen: set[str] = wh.trajectory_ids()
        self.stored = len(self.seen)                 # rows in the warehouse before this batch
        with wh.connect() as con:
            self.seen.update(r[0] for r in con.execute("SELECT quarantine_id FROM quarantine").fetchall())
        self.per_file: Counter = Counter()
        self.qrows: list[dict] = []
        self.qbytes = 0
        self.parts: list[tuple[Path, int]] = []      # staged parts, (path, rows)
        self.qparts: list[Path] = []
        self.buffer: list[pa.Table] = []             # accepted rows of small chunks, gathered into one part
        self.buffer_rows = self.buffer_bytes = 0

    def _bump(self, key: str, n: int) -> None:
        setattr(self.s, key, getattr(self.s, key) + n)
        self.per_file[key] += n

    def write(self, res: ChunkResult) -> None:
        self._bump("read", res.n_read)
        self.s.reports_joined += res.reports_joined
        self.s.fast_path += res.fast
        for fmt, n in res.formats.items():
            self.s.by_format[fmt] = self.s.by_format.get(fmt, 0) + n
        seen = self.seen
        if res.ids is not None:
            ids = res.ids
        elif res.table is not None:
            ids = res.table.column("record_id").to_pylist()
        else:
            ids = []
        if seen.isdisjoint(ids) and len(set(ids)) == len(ids):  # the common case, in C
            seen.update(ids)
            keep, n_new = None, len(ids)
        else:
            keep = [i not in seen and not seen.add(i) for i in ids]  # first copy wins
            n_new = sum(keep)
        self._bump("duplicates", len(ids) - n_new)
        if n_new and res.staged is not None and n_new == len(ids):
            self.parts.append((res.staged, n_new))  # the common case on the parallel path: kept as written
        else:
            if n_new:
                import pyarrow.parquet as pq

                table = res.table if res.table is not None else pq.read_table(res.staged)
                table = table.filter(pa.array(keep)) if n_new < len(ids) else table
                self.buffer.append(table)
                self.buffer_rows += table.num_rows
                self.buffer_bytes += table.nbytes
                if self.buffer_rows >= PART_ROWS or self.buffer_bytes >= PART_BYTES:
                    self._flush_rows()
            if res.staged is not None:
                res.staged.unlink(missing_ok=True)
        if n_new:
            self._bump("accepted", n_new)
        for raw, code, detail, fmt in res.bad:
            self.s.quarantine_reasons[code] = self.s.quarantine_reasons.get(code, 0) + 1
            sha = raw.sha256 or hashlib.sha256(raw.payload).hexdigest()
            qid = hashlib.sha256(f"{self._file_key(raw.file)}\0{raw.line}\0{sha}".encode()).hexdigest()
            # a row quarantined before ids used the landing-relative name had the absolute one
            legacy = hashlib.sha256(f"{raw.file}\0{raw.line}\0{sha}".encode()).hexdigest()
            if qid in seen or legacy in seen:
                self._bump("duplicates", 1)
                continue
            seen.add(qid)
            self._bump("quarantined", 1)
            self.qrows.append({
                "quarantine_id": qid, "source_file": raw.file, "source_line": raw.line,
                "byte_offset": raw.offset, "detected_format": fmt, "reason_code": code, "reason": detail,
                "raw": raw.payload, "raw_sha256": sha, "raw_bytes": raw.size if raw.size is not None else len(raw.payload),
                "batch_id": self.s.batch_id, "quarantined_at": self.now})
            self.qbytes += len(raw.payload)
        if len(self.qrows) >= 1024 or self.qbytes >= 64 << 20:
            self.flush()

    def _file_key(self, file: str) -> str:
        """How the quarantine id names a file: its path relative to the landing folder (the same
        bad line in a moved or copied home is the same row), else its absolute path."""
        key = self._file_keys.get(file)
        if key is None:
            from ratchet.landing import landing_key

            rel = landing_key(file, self.landing) if self.landing is not None else None
            key = self._file_keys[file] = f"landing:{rel}" if rel is not None else str(file)
        return key

    def _flush_rows(self) -> None:
        if self.buffer:
            path = self.staging / f"rows-{len(self.parts):06d}.parquet"
            table = pa.concat_tables(self.buffer) if len(self.buffer) > 1 else self.buffer[0]
            write_part(table, path)
            self.parts.append((path, table.num_rows))
            self.buffer, self.buffer_rows, self.buffer_bytes = [], 0, 0

    def flush(self) -> None:
        """Stage the pending quarantine rows (a Parquet file: inserted at commit)."""
        if self.qrows:
            import pyarrow.parquet as pq

            path = self.staging / f"quarantine-{len(self.qparts):06d}.parquet"
            pq.write_table(pa.Table.from_pylist(self.qrows, schema=QUARANTINE_SCHEMA), path)
            self.qparts.append(path)
            self.qrows, self.qbytes = [], 0

    def finish(self) -> None:
        self._flush_rows()
        self.flush()
