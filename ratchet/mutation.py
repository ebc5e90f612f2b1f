"""Mutation-testing results into the results page: what `make mutation` ran and which mutants the
tests did not kill.

mutmut keeps every mutant's status in its cache (`.mutmut-cache`, SQLite: SourceFile -> Line ->
Mutant); this reads it directly rather than parsing `mutmut results`' text, and appends one line
to docs/results/mutation.jsonl (the same record shape as a bench's, so `ratchet results` renders
it: counts per file and every survivor with its source line).

    .venv/bin/python -m ratchet.mutation --cache DIR/.mutmut-cache --label governance [--tests "..."] [--wall-s S]
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from datetime import datetime, timezone
from pathlib import Path

KILLED = {"ok_killed"}
SURVIVED = {"bad_survived"}
# mutmut's other statuses: bad_timeout (the tests hung: counted apart), ok_suspicious (slow but
# killed), skipped, untested (the run stopped before them).


def read_cache(path: Path) -> dict:
    """Counts per file and the surviving mutants (file, line number, source line, mutmut id)."""
    if not path.exists():
        raise FileNotFoundError(f"no mutmut cache at {path}: run `make mutation` first")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute("""SELECT m.id, m.status, l.line_number, l.line, f.filename
                              FROM Mutant m JOIN Line l ON m.line = l.id JOIN SourceFile f ON l.sourcefile = f.id
                              ORDER BY f.filename, l.line_number, m.id""").fetchall()
    finally:
        con.close()
    files: dict[str, dict] = {}
    survivors = []
    for mid, status, line_no, line, filename in rows:
        f = files.setdefault(filename, {"mutants": 0, "killed": 0, "survived": 0, "timeout": 0, "untested": 0})
        f["mutants"] += 1
        if status in KILLED or status == "ok_suspicious":
            f["killed"] += 1
        elif status in SURVIVED:
            f["survived"] += 1
            survivors.append({"id": mid, "file": filename, "line": line_no + 1, "code": line.strip()[:160]})
        elif status == "bad_timeout":
            f["timeout"] += 1
        else:
            f["untested"] += 1
    total = {k: sum(f[k] for f in files.values()) for k in ("mutants", "killed", "survived", "timeout", "untested")}
    tested = total["mutants"] - total["untested"]
    return {"bench": "mutation", **total, "files": files, "survivors": survivors,
            "baseline": "every mutant killed", "ratio": round(total["killed"] / tested, 4) if tested else None}


def main(argv: list[str] | None = None) -> int:
    from ratchet import results

    ap = argparse.ArgumentParser(description="record mutmut's results on the results page")
    ap.add_argument("--cache", required=True, help="the run's .mutmut-cache")
    ap.add_argument("--label", required=True, help="what was mutated (recorded as the command's arguments)")
    ap.add_argument("--tests", default="", help="the test runner each target used (recorded)")
    ap.add_argument("--wall-s", type=float, default=0.0, help="how long the mutmut run took (recorded)")
    ap.add_argument("--results-dir", help="default docs/results")
    a = ap.parse_args(argv)
    try:
        res = read_cache(Path(a.cache))
    except (FileNotFoundError, sqlite3.Error) as e:
        print(f"ratchet.mutation: {e}", file=sys.stderr)
        return 2
    now = datetime.now(timezone.utc)
    load = os.getloadavg()
    rec = results.make_record("mutation", [a.label] + ([a.tests] if a.tests else []), res, now, a.wall_s, load, load)
    out = Path(a.results_dir) if a.results_dir else results.RESULTS_DIR
    results.append_record(rec, out)
    results.write_page(out)
    print(f"mutation: {res['killed']} of {res['mutants']} killed, {res['survived']} survived "
          f"({len(res['files'])} files) -> {out / 'mutation.jsonl'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
