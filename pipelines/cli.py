"""The `ratchet` console script: demo, ingest, compact, query, scorecard, ui, mlflow, bench, results, holdout."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _home(args):
    from ratchet.home import activate

    return activate(args.home)


def cmd_ingest(args) -> int:
    from ratchet.ingest import IngestOptions, ingest
    from ratchet.warehouse import Warehouse

    home = _home(args)
    opts = IngestOptions(tenant_id=args.tenant, consent_id=args.consent, max_record_mb=args.max_record_mb,
                         workers=args.workers, origin="cli")
    try:
        s = ingest(args.paths, Warehouse(home.warehouse), opts, progress=not args.quiet and sys.stderr.isatty())
    except (FileNotFoundError, ValueError) as e:
        print(f"ratchet ingest: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"read {s.read}: accepted {s.accepted}, quarantined {s.quarantined}, duplicates {s.duplicates}"
              f" ({s.seconds:.2f} s) -> {home.warehouse}", file=sys.stderr)
    print(json.dumps({**s.as_dict(), "warehouse": str(home.warehouse)}))
    return 0


def cmd_compact(args) -> int:
    from ratchet.ingest import compact
    from ratchet.warehouse import Warehouse

    home = _home(args)
    wh = Warehouse(home.warehouse)
    if not wh.exists():
        print(f"ratchet compact: no warehouse at {home.warehouse}", file=sys.stderr)
        return 2
    got = compact(wh)
    parts = len(wh.part_names())
    if not args.quiet:
        print(f"merged {got['merged']} small parts into {got['written']}; the lake now has {parts} parts",
              file=sys.stderr)
    print(json.dumps({**got, "parts": parts}))
    return 0


def cmd_query(args) -> int:
    from ratchet.warehouse import Warehouse

    home = _home(args)
    wh = Warehouse(home.warehouse)
    if not wh.exists():
        print(f"ratchet query: no warehouse at {home.warehouse}; run `ratchet ingest PATH` or `make demo` first",
              file=sys.stderr)
        return 2
    import duckdb

    wh.ensure_schema()
    try:
        with wh.connect() as con:
            rel = con.sql(args.sql)
            if rel is None:  # a statement without a result (DDL, INSERT)
                return 0
            if args.json:
                cols = rel.columns
                rows = [dict(zip(cols, r)) for r in rel.fetchall()]
                print(json.dumps(rows, default=str))
            else:
                rel.show(max_rows=args.max_rows, max_width=10_000)
    except duckdb.Error as e:
        print(f"ratchet query: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args) -> int:
    from pipelines.demo import run_demo

    return run_demo(_home(args), quick=args.quick, tasks=args.tasks, eval_tasks=args.eval_tasks,
                    train=not args.no_train, full=args.full, tasks_from=args.tasks_from, base=args.base)


def cmd_scorecard(args) -> int:
    from ratchet.evaluation.io import scorecard_text
    from ratchet.warehouse import Warehouse

    home = _home(args)
    wh = Warehouse(home.warehouse)
    if not wh.exists():
        print(f"ratchet scorecard: no warehouse at {home.warehouse}; run `make demo` first", file=sys.stderr)
        return 2
    wh.ensure_schema()
    print(scorecard_text(wh))
    return 0


KILLED_MSG = "did not stop within"   # the start of what serve() prints when it had to SIGKILL


def serve(cmd: list[str], env: dict, cwd: Path, grace_s: float = 20.0, leader_only: bool = False,
          stop: int | None = None) -> int:
    """Run a server in its own process group and stop the whole group when we are stopped.

    A signal we receive is forwarded and we wait for the server to exit by itself. `leader_only`:
    only the leader gets it (`dagster dev` stops its webserver, daemon and code servers itself on
    SIGINT, SIGTERM being mapped to the same handler, and gives each up to 60 s; signalled
    directly, the daemon can be cut off mid-tick). Otherwise the whole group gets it (every process
    of `mlflow ui`, uvicorn, its workers and the huey job consumers, which outlive their parent
    when only it is signalled, exits on SIGTERM). SIGTERM and SIGHUP are forwarded as `stop`
    (default SIGTERM; neither server handles SIGHUP), SIGINT as SIGINT. Whatever of the group outlives the leader gets SIGTERM; SIGKILL comes only if
    something is still there `grace_s` after the signal, and says so on stderr. The handler never
    waits itself: the main thread is inside Popen.wait() then, holding the lock a nested wait needs."""
    import signal
    import time

    stop = signal.SIGTERM if stop is None else stop

    def default_dispositions():
        # The server must hear the signals it is stopped with, however we were started: an ignored
        # SIGTERM or SIGINT is inherited through exec (a test runner or a pool may ignore them),
        # and `dagster dev` then never stops (measured: the SIGKILL fallback every time).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True, preexec_fn=default_dispositions)
    received: list[tuple[int, float]] = []

    def forward(signum, _frame):
        received.append((signum, time.monotonic()))
        sig = stop if signum != signal.SIGINT else signal.SIGINT
        if leader_only:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass
        else:
            _signal_group(proc.pid, sig)

    def kill(what: str) -> None:
        _signal_group(proc.pid, signal.SIGKILL)   # the last resort
        print(f"ratchet: {what} {KILLED_MSG} {grace_s:.0f} s of the signal: killed (SIGKILL)", file=sys.stderr)

    # A hangup we were told to ignore stays ignored (`nohup ratchet ui`); a stop request never is.
    handled = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGHUP] if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN
                                                  else [])
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    killed = False
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if received and not killed and time.monotonic() - received[0][1] > grace_s:
                    kill(Path(cmd[0]).name)
                    killed = True
        # what the leader left behind (a child it did not stop) goes with it
        deadline = (received[0][1] if received else time.monotonic()) + grace_s
        if _group_alive(proc.pid) and not killed:
            _signal_group(proc.pid, signal.SIGTERM)
        while _group_alive(proc.pid):
            if time.monotonic() > deadline:
                if not killed:
                    kill(f"a child of {Path(cmd[0]).name}")
                    killed = True
                break
            time.sleep(0.1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + received[0][0] if received else rc


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. A zombie does not count: an orphan waits there
    until the init process reaps it, which some container inits never do."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if state != "Z" and int(pgrp) == pgid:
            return True
    return False


def cmd_ui(args) -> int:
    home = _home(args)
    env = {**os.environ, "DAGSTER_HOME": str(home.dagster)}
    cmd = [str(Path(sys.executable).parent / "dagster"), "dev", "-w", str(REPO / "workspace.yaml"),
           "-p", str(args.port), "-h", args.host]
    print(f"Dagster UI on http://{args.host}:{args.port} (DAGSTER_HOME={home.dagster})", file=sys.stderr)
    # dagster dev gives its webserver and its daemon up to 60 s each to shut down
    # (on SIGINT, its KeyboardInterrupt path: the one it documents for a clean stop)
    import signal

    return serve(cmd, env, REPO, grace_s=150, leader_only=True, stop=signal.SIGINT)


def cmd_mlflow(args) -> int:
    from ratchet.mlflow_store import UI_URL_ENV, UI_URL_FILE, record_ui_url, tracking_uri

    home = _home(args)
    url = record_ui_url(home, args.host, args.port)
    cmd = [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", tracking_uri(home),
           "--host", args.host, "--port", str(args.port)]
    links = os.environ.get(UI_URL_ENV)
    print(f"MLflow UI on {url} (store {home.mlflow_db}); asset metadata links to "
          + (f"${UI_URL_ENV}={links}, which overrides this server's URL" if links else
             f"this URL (recorded in {home.root / UI_URL_FILE}; ${UI_URL_ENV} overrides it)"),
          file=sys.stderr)
    return serve(cmd, {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}, home.root)


def cmd_bench(args) -> int:
    path = REPO / "bench" / f"{args.name}.py"
    if not path.exists():
        names = sorted(p.stem for p in (REPO / "bench").glob("*.py"))
        print(f"ratchet bench: no benchmark {args.name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    rest = list(args.rest)
    record = args.record or "--record" in rest  # `ratchet bench NAME --record ...` reads naturally too
    rest = [a for a in rest if a != "--record"]
    if not record:
        return subprocess.call([sys.executable, str(path), *rest], cwd=REPO)
    return _bench_recorded(args.name, path, rest, Path(args.results_dir) if args.results_dir else None)


def _bench_recorded(name: str, path: Path, rest: list[str], results_dir: Path | None) -> int:
    """Run the bench with its output shown as it comes, keep its final JSON line and append it,
    with where and when it ran, to the results folder; then re-render the results page."""
    import time
    from datetime import datetime, timezone

    from ratchet import results

    results_dir = results_dir or results.RESULTS_DIR
    vcs = results.commit()      # what ran: the tree may change while a long bench runs
    started, load0, t0 = datetime.now(timezone.utc), os.getloadavg(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-u", str(path), *rest], cwd=REPO, stdout=subprocess.PIPE, text=True)
    out = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        out.append(line)
    rc = proc.wait()
    if rc != 0:
        print(f"ratchet bench: {name} exited with {rc}; nothing recorded", file=sys.stderr)
        return rc
    result = results.last_json_line("".join(out))
    if result is None:
        print(f"ratchet bench: {name} printed no final JSON line; nothing recorded", file=sys.stderr)
        return 1
    rec = results.make_record(name, rest, result, started, time.monotonic() - t0, load0, os.getloadavg(), vcs=vcs)
    where = results.append_record(rec, results_dir)
    page = results.write_page(results_dir)
    print(f"recorded in {where}; results page {page}", file=sys.stderr)
    return 0


def cmd_results(args) -> int:
    from ratchet import results

    results_dir = Path(args.results_dir) if args.results_dir else results.RESULTS_DIR
    try:
        if args.check:
            bad = results.stale(results_dir)
            for path in bad:
                print(f"ratchet results: {path} is not what the recorded lines render; run `ratchet results`",
                      file=sys.stderr)
            return 1 if bad else 0
        print(results.write_page(results_dir))
    except ValueError as e:
        print(f"ratchet results: {e}", file=sys.stderr)
        return 2
    return 0


def _holdout_path(args, home) -> Path:
    return Path(args.manifest) if args.manifest else home.root / "holdout_manifest.json"


def cmd_holdout_show(args) -> int:
    from ratchet.governance.holdout import LOG_SQL, holdout_state
    from ratchet.governance.manifest import ManifestError
    from ratchet.store import fetch
    from ratchet.warehouse import Warehouse

    home = _home(args)
    path = _holdout_path(args, home)
    wh = Warehouse(home.warehouse)
    wh.ensure_schema()
    with wh.connect() as con:
        log = fetch(con, LOG_SQL, [args.log])
        try:
            state = holdout_state(con, path)
            err = None
        except ManifestError as e:
            state, err = None, str(e)
    m = state.manifest if state else None
    out = {"path": str(path), "verified": err is None, "error": err,
           "locked": m.locked if m else None, "version": m.version if m else None,
           "sha256": m.sha256 if m else None, "tasks": len(m.task_ids) if m else 0,
           "created_at": m.created_at if m else None, "locked_by": m.locked_by if m else None,
           "recorded_in_warehouse": state.recorded if state else None,
           "log": [{k: (str(v) if k == "event_at" else v) for k, v in r.items()} for r in log]}
    if m is None and err is None:
        print("no holdout locked yet (materialise holdout_manifest)", file=sys.stderr)
    elif err:
        print(f"ratchet holdout: {err}", file=sys.stderr)
    print(json.dumps(out, indent=None if args.json else 1))
    return 1 if err else 0


def _holdout_change(args, verb: str, change, said) -> int:
    """An audited change to the holdout (`unlock`, `restore`): the warehouse's record and the file
    change together, the audit row is printed as JSON, and a refusal is exit 2 with its reason."""
    from ratchet.governance.manifest import ManifestError
    from ratchet.warehouse import Warehouse

    home = _home(args)
    path = _holdout_path(args, home)
    wh = Warehouse(home.warehouse)
    wh.ensure_schema()
    try:
        with wh.connect() as con:
            m, row = change(con, path, args.reason, args.actor)
    except ManifestError as e:
        print(f"ratchet holdout {verb}: {e}", file=sys.stderr)
        return 2
    print(f"holdout version {m.version} ({m.sha256[:12]}..., {len(m.task_ids)} tasks) {said(m, path)} by "
          f"{row['actor']}: {row['reason']}", file=sys.stderr)
    print(json.dumps(row, default=str))
    return 0


def cmd_holdout_restore(args) -> int:
    from ratchet.governance.holdout import restore_holdout

    return _holdout_change(args, "restore", restore_holdout, lambda m, path: (
        f"{'locked' if m.locked else 'unlocked'}, restored to {path} from the warehouse"))


def cmd_holdout_unlock(args) -> int:
    from ratchet.governance.holdout import unlock_holdout

    return _holdout_change(args, "unlock", unlock_holdout, lambda m, path: (
        "unlocked (the next holdout_manifest run locks a new version)"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ratchet", description="Governed post-training for tool-using agents.")
    p.add_argument("--home", help="RATCHET_HOME (default: $RATCHET_HOME or ./.ratchet)")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("ingest", help="ingest trajectory files/folders (prints a JSON summary last)")
    s.add_argument("paths", nargs="+")
    s.add_argument("--tenant", help="tenant id for records that carry none")
    s.add_argument("--consent", help="consent id for records that carry none")
    s.add_argument("--max-record-mb", type=float, default=32.0)
    s.add_argument("--workers", type=int, default=0, help="normalising processes for large inputs (0 = per core)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(fn=cmd_ingest)

    s = sub.add_parser("compact", help="merge the trajectory lake's small Parquet parts (prints a JSON line)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(fn=cmd_compact)

    s = sub.add_parser("query", help="run SQL against the warehouse")
    s.add_argument("sql")
    s.add_argument("--json", action="store_true", help="print a JSON array of row objects")
    s.add_argument("--max-rows", type=int, default=50)
    s.set_defaults(fn=cmd_query)

    s = sub.add_parser("demo", help="run the whole lifecycle on the embedded default")
    s.add_argument("--quick", action="store_true", help="tiny configuration (smoke test)")
    s.add_argument("--tasks", type=int, help="how many tasks the reference agents run (default 360, --full 600, "
                                                   "quick 16)")
    s.add_argument("--eval-tasks", type=int, help="locked holdout tasks evaluated per policy x seed (default 20, "
                                                  "quick 4; 400 = the reference workload)")
    s.add_argument("--full", action="store_true", help="the reference workload: every policy on 400 locked "
                                                       "holdout tasks x 3 seeds, with the agents' logs of 600 tasks")
    s.add_argument("--no-train", action="store_true", help="skip the improvement cycle (training a candidate, "
                                                           "its evaluation and the promotion decision)")
    s.add_argument("--base", choices=("embedded", "smollm2"), default="embedded",
                   help="the candidate's base: the small from-scratch model (default), or the pretrained "
                        "SmolLM2-135M-Instruct (a LoRA, every accepted row trains; sized for 2 cores: a smoke "
                        "of the pipeline, ~3x the demo's time)")
    s.add_argument("--tasks-from", metavar="PATH", help="your own tasks beside the HumanEval suite: a folder of "
                                                        "Harbor task folders, or SWE-bench-style instances (a JSONL "
                                                        "with a repos/ folder); see docs/guides/own-tasks.md")
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("scorecard", help="print the scorecard (policies side by side, CIs, denominators, economics)")
    s.set_defaults(fn=cmd_scorecard)

    s = sub.add_parser("ui", help="start the Dagster UI")
    s.add_argument("--port", type=int, default=3000)
    s.add_argument("--host", default="127.0.0.1")
    s.set_defaults(fn=cmd_ui)

    s = sub.add_parser("mlflow", help="start the MLflow UI over RATCHET_HOME's tracking store")
    s.add_argument("--port", type=int, default=5000)
    s.add_argument("--host", default="127.0.0.1")
    s.set_defaults(fn=cmd_mlflow)

    s = sub.add_parser("bench", help="run bench/NAME.py (the arguments after NAME go to the bench)")
    s.add_argument("--record", action="store_true", help="append the final JSON line, with commit, date, machine "
                   "and load, to docs/results/NAME.jsonl and re-render the results page")
    s.add_argument("--results-dir", help="where recorded lines go (default docs/results)")
    s.add_argument("name")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("results", help="render docs/results/README.md from the recorded bench lines")
    s.add_argument("--check", action="store_true", help="exit 1 if the page differs from what the lines render")
    s.add_argument("--results-dir", help="the folder of recorded lines (default docs/results)")
    s.set_defaults(fn=cmd_results)

    s = sub.add_parser("holdout", help="show, unlock or restore the locked holdout manifest")
    hs = s.add_subparsers(dest="holdout_cmd", required=True)
    h = hs.add_parser("show", help="verify the manifest against the warehouse and print it (exit 1 if tampered)")
    h.add_argument("--manifest", help="manifest path (default RATCHET_HOME/holdout_manifest.json)")
    h.add_argument("--log", type=int, default=10, help="audit log rows to show")
    h.add_argument("--json", action="store_true", help="one-line JSON")
    h.set_defaults(fn=cmd_holdout_show)
    h = hs.add_parser("unlock", help="unlock the holdout (audited); the next split run may re-draw it")
    h.add_argument("--reason", required=True, help="why (recorded in the audit log)")
    h.add_argument("--actor", required=True, help="who (recorded in the audit log)")
    h.add_argument("--manifest", help="manifest path (default RATCHET_HOME/holdout_manifest.json)")
    h.set_defaults(fn=cmd_holdout_unlock)

    h = hs.add_parser("restore", help="rewrite a deleted or edited manifest file from the warehouse's recorded "
                                      "rows (audited); only the locked holdout can come back")
    h.add_argument("--reason", required=True, help="why (recorded in the audit log)")
    h.add_argument("--actor", required=True, help="who (recorded in the audit log)")
    h.add_argument("--manifest", help="manifest path (default RATCHET_HOME/holdout_manifest.json)")
    h.set_defaults(fn=cmd_holdout_restore)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
