"""Recorded benchmark results and the results page rendered from them.

Every bench under bench/ ends with one JSON line (its figures, its named baseline, `ratio`).
`ratchet bench NAME --record` appends that line, with the commit, the date, the machine and its
load, to docs/results/NAME.jsonl; `ratchet results` renders docs/results/README.md from those
lines alone (latest value per bench, baseline, ratio, target, met or not, and a history plot
where there are enough runs). Numbers in the docs come from here, never typed by hand, and the
page is a pure function of the lines, so re-rendering it gives the same bytes.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "docs" / "results"
PLOT_MIN_RECORDS = 3  # a trend needs at least three points
HISTORY_ROWS = 10


@dataclass(frozen=True)
class Target:
    key: str        # dotted path into the bench's JSON line
    op: str         # ">=", "<=", "<", ">", "=="
    value: float
    label: str

    def met(self, result: dict) -> bool | None:
        v = lookup(result, self.key)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        return {">=": v >= self.value, "<=": v <= self.value, "<": v < self.value,
                ">": v > self.value, "==": v == self.value}[self.op]


@dataclass(frozen=True)
class BenchSpec:
    what: str                      # one line: what the bench measures
    headline: tuple[str, str]      # (key, unit) of the number a reader looks for first
    targets: tuple[Target, ...] = field(default_factory=tuple)
    ratio_means: str = "ours / baseline"


# What each bench measures, its headline figure and its targets. The baseline's name is in the
# bench's own JSON line (`baseline`); a bench with no target is a diagnosis or an engine cost.
SPECS: dict[str, BenchSpec] = {
    "demo": BenchSpec(
        "`ratchet demo` end to end in a fresh RATCHET_HOME (the mode is in the command)",
        ("wall_s", "s"),
        (Target("ratio", "<=", 1, "within its budget (15 min; --full 2 h; --quick 5 min)"),),
        "wall / budget"),
    "ingest": BenchSpec(
        "synthetic multi-turn trajectories validated, deduplicated and stored in the warehouse",
        ("ours_per_s", "trajectories/s"),
        (Target("ours_per_s", ">=", 20_000, "ingest >= 20k trajectories/s"),),
        "ours / pandas row inserts"),
    "sandbox": BenchSpec(
        "episode setup + teardown and a warm test run in the bubblewrap sandbox",
        ("test_run_p50_ms", "ms per warm test run (p50)"),
        (Target("test_run_p50_ms", "<=", 25, "warm test run p50 <= 25 ms"),),
        "cold pytest p50 / warm test run p50"),
    "reward_hacks": BenchSpec(
        "every known exploit against real tasks, beside the true fix",
        ("max_exploit_reward", "best exploit reward"),
        (Target("ratio", "<", 1, "no exploit reaches the lowest true-fix reward"),
         Target("infra_voids", "==", 0, "no exploit voids its episode as an infrastructure failure"),
         Target("runtime_disagreements", "==", 0, "bubblewrap and Docker give every patch the same reward")),
        "best exploit / lowest true fix"),
    "dedup": BenchSpec(
        "MinHash signatures per second, and cluster + split of 1M trajectories",
        ("ours_per_s", "documents/s"),
        (Target("ratio", ">=", 10, "signatures >= 10x datasketch"),
         Target("cluster_split_1m_s", "<", 600, "cluster + split of 1M trajectories < 10 min"),
         Target("peak_mb_1m", "<=", 2000, "cluster + split of 1M trajectories within 2 GB (--peak-1m)"),
         Target("cluster_split_10m_s", "<=", 1800, "cluster + split of 10M trajectories within 30 min (--size-10m)"),
         Target("peak_mb_10m", "<=", 4000, "cluster + split of 10M trajectories within 4 GB (--size-10m)"),
         Target("contamination_10m_s", "<=", 1800,
                "contamination check of 10M trajectories within 30 min (--size-10m --contamination)"),
         Target("contamination_peak_mb_10m", "<=", 4000,
                "contamination check of 10M trajectories within 4 GB (--size-10m --contamination)")),
        "ours / datasketch"),
    "envserver": BenchSpec(
        "episodes/s of the same scripted true fixes through the HTTP environment service vs in-process RepairEnv",
        ("service_eps_per_s_16", "episodes/s at 16 clients"),
        (Target("ratio", ">=", 0.8, "service >= 0.8 of in-process throughput at 16 clients"),),
        "service / in-process"),
    "eval": BenchSpec(
        "locked-holdout evaluation, 400 tasks x 3 seeds on the machine's cores, real path",
        ("wall_s_400x3", "s for 400 x 3 episodes"),
        (Target("wall_s_400x3", "<=", 600, "400 x 3 within 10 minutes"),
         Target("overhead_fraction", "<=", 0.30, "pool overhead <= 30%")),
        "baseline wall / ours"),
    "rollout": BenchSpec(
        "episodes/s with batched generation across concurrent episodes",
        ("ours_eps_per_s", "episodes/s"),
        (Target("ratio", ">=", 4, "batched rollouts >= 4x one at a time"),),
        "ours / one episode at a time"),
    "render": BenchSpec(
        "the embedded policy's prompt for every turn of real episodes",
        ("ours_s", "s"), (), "no memo / memo"),
    "decode": BenchSpec(
        "generate seconds of grammar-constrained evaluation episodes",
        ("ours_generate_s", "generate s"), (), "transformers forward / fused decode"),
    "learning": BenchSpec(
        "the embedded policy trained end to end and evaluated on problems it never trained on",
        ("rl_pass", "RL task success"),
        (Target("paired.sft_minus_random.0", ">", 0, "SFT above the random harness"),
         Target("paired.rl_minus_sft.0", ">=", 0.05, "RL >= SFT + 5 points"),
         Target("train_cpu_min", "<=", 15, "SFT + RL within 15 CPU-minutes")),
        "RL / SFT"),
    "baselines": BenchSpec(
        "no-weights harness baselines (random and SBFL-guided edits), k attempts",
        ("sbfl_first_try", "SBFL fixed at first try"), (), "SBFL / random (first try)"),
    "lm_harness": BenchSpec(
        "the pretrained base ranking candidate edits by likelihood (no weight change) beside the "
        "no-weights harnesses, on held-out problems, with the base's contamination measured",
        ("lm_pass", "harness:lm task success"),
        (Target("lm_minus_prior.1", ">", 0, "harness:lm above harness:prior (paired CI above 0)"),),
        "harness:lm / harness:prior"),
    "imitation": BenchSpec(
        "an embedded checkpoint beside the demonstrator it imitates",
        ("policy_pass", "checkpoint task success"), (), "checkpoint / demonstrator"),
    "mutation": BenchSpec(
        "mutants of the named modules (mutmut, `make mutation`) and how many the tests kill",
        ("survived", "surviving mutants"), (), "killed / mutants tested"),
    "rl_variant": BenchSpec(
        "one RL change from a learning run's SFT checkpoint, paired with that SFT",
        ("rl_pass", "RL task success"), (), "RL / SFT"),
    "quixbugs": BenchSpec(
        "QuixBugs' 40 programs as a task source: buggy fails and fix passes in the sandbox, then the "
        "harness baselines on them as the locked holdout (pass rates with 95% CIs)",
        ("pass_rates.harness:sbfl.pass_rate", "harness:sbfl pass rate on QuixBugs"),
        (Target("buggy_fail", "==", 40, "all 40 buggy programs fail their tests"),
         Target("fixed_pass", "==", 40, "all 40 reference fixes pass them"),
         Target("infra", "==", 0, "no infrastructure failure (the 3 loops are the agent's)"),
         Target("holdout_quixbugs", "==", 40, "all 40 accepted into the locked holdout")),
        "harness:sbfl / harness:random"),
}


def lookup(obj, dotted: str):
    for part in dotted.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj


# ---------------------------------------------------------------------------------------------- record

def machine() -> dict:
    mem_kb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
                break
    except OSError:
        pass
    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "mem_gib": round(mem_kb / 2**20, 1) if mem_kb else None,
            "cpu": cpu, "python": platform.python_version()}


def commit(repo: Path = REPO) -> dict:
    """The commit the bench ran at; `dirty` when tracked files outside docs/results differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False).stdout.strip()

    sha = git("rev-parse", "HEAD") or None
    changed = [ln for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()
               if not ln[3:].startswith("docs/results/")]
    return {"commit": sha[:12] if sha else None, "dirty": bool(changed)}


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def make_record(bench: str, argv: list[str], result: dict, started: datetime, wall_s: float,
                load_before: tuple, load_after: tuple, repo: Path = REPO, vcs: dict | None = None) -> dict:
    """`vcs`: `commit()` taken when the bench started (the tree may change while it runs)."""
    return {"bench": bench, "recorded_at": started.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **(vcs or commit(repo)), "argv": argv, "machine": machine(),
            "loadavg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
            "wall_s": round(wall_s, 1), "result": result}


def append_record(record: dict, results_dir: Path = RESULTS_DIR) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{record['bench']}.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    return path


def read_records(results_dir: Path = RESULTS_DIR) -> dict[str, list[dict]]:
    """Every recorded line per bench, oldest first (a line that does not parse is an error: these
    files are written by `record` only, so a bad one was hand-edited)."""
    out: dict[str, list[dict]] = {}
    for path in sorted(results_dir.glob("*.jsonl")):
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
        out[path.stem] = sorted(rows, key=lambda r: r.get("recorded_at", ""))
    return out


# ---------------------------------------------------------------------------------------------- render

def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _met(spec: BenchSpec, result: dict) -> str:
    if not spec.targets:
        return "no target"
    parts = []
    for t in spec.targets:
        m = t.met(result)
        parts.append(f"{t.label}: {'met' if m else 'not met' if m is False else 'not measured'}")
    return "; ".join(parts)


def _command(rec: dict) -> str:
    if rec["bench"] == "mutation":   # recorded by ratchet.mutation after a mutmut run, not a bench script
        argv = rec.get("argv") or []
        return f"mutmut over {argv[0] if argv else '?'}" + (f"; tests: {argv[1]}" if len(argv) > 1 else "")
    args = " ".join(rec.get("argv") or [])
    return f"ratchet bench {rec['bench']} --record" + (f" {args}" if args else "")


def _plot(bench: str, spec: BenchSpec, rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, unit = spec.headline
    pts = [(r["recorded_at"][:16].replace("T", " "), lookup(r["result"], key)) for r in rows]
    pts = [(d, v) for d, v in pts if isinstance(v, (int, float))]
    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.plot(range(len(pts)), [v for _, v in pts], marker="o", color="#264653")
    ax.set_xticks(range(len(pts)), [d for d, _ in pts], rotation=30, fontsize=7)
    ax.set_title(f"{bench}: {unit}", fontsize=9)
    for t in spec.targets:
        if t.key == key:
            ax.axhline(t.value, color="#e76f51", linestyle="--", linewidth=1)
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


MAX_SURVIVORS = 80
MAX_REASON = 90  # characters of a judged survivor's reason shown on the page


def _order(records: dict) -> list[str]:
    """Recorded benches in SPECS order, then any other recorded name alphabetically."""
    return [b for b in SPECS if b in records] + sorted(b for b in records if b not in SPECS)


def _mutation_detail(res: dict) -> list[str]:
    out = ["", "| file | mutants | killed | survived | timeout | skipped | untested |", "|---|---|---|---|---|---|---|"]
    for f, c in sorted((res.get("files") or {}).items()):
        out.append(f"| `{f}` | {c['mutants']} | {c['killed']} | {c['survived']} | {c['timeout']} | {c.get('skipped', 0)} "
                   f"| {c['untested']} |")
    surv = res.get("survivors") or []
    open_ = [m for m in surv if not m.get("equivalent")]
    judged = [m for m in surv if m.get("equivalent")]
    if open_:
        out += ["", f"Surviving mutants not judged equivalent: each needs a test (the run's verdicts; tests added "
                    f"after a run started meet its survivors in the next run; `python -m ratchet.mutation show "
                    f"--cache CACHE ID` prints each diff){f'; the first {MAX_SURVIVORS} of {len(open_)}, every one is in mutation.jsonl' if len(open_) > MAX_SURVIVORS else ''}:", ""]
        for m in open_[:MAX_SURVIVORS]:
            code = m["code"].replace("`", "'")
            out.append(f"- {m['id']}: `{m['file']}:{m['line']}` `{code}`{' (no test runs this line)' if m.get('no_test') else ''}")
    if judged:
        out += ["", f"Surviving mutants judged equivalent (no behaviour a user can see changes; "
                    f"`docs/results/mutation-equivalent.json` keeps each mutated line and the reason): {len(judged)}", ""]
        by_why: dict[str, dict[str, list]] = {}
        for m in judged:   # one line a reason, its lines by file (the mutated lines are in the judgments file)
            lines = by_why.setdefault(m["equivalent"], {}).setdefault(m["file"].rsplit("/", 1)[-1], [])
            if m["line"] not in lines:
                lines.append(m["line"])
        for why, files in by_why.items():
            # the page keeps under its size limit as judgments accumulate: a long reason is cut
            # here, the judgments file keeps it whole
            short = why if len(why) <= MAX_REASON else why[:MAX_REASON].rsplit(" ", 1)[0] + " …"
            out.append(f"- {short}: " + ", ".join(f"`{f}:{','.join(map(str, ls))}`" for f, ls in files.items()))
    exempt = res.get("exempt") or []
    if exempt:
        out += ["", f"Lines not mutated (`# pragma: no mutate`, each with its reason): {len(exempt)}", ""]
        for m in exempt:
            code = m["code"].replace("`", "'")
            out.append(f"- `{m['file']}:{m['line']}` `{code}`: {m['why']}")
    return out


def render(results_dir: Path = RESULTS_DIR, plots: bool = True) -> str:
    """The results page's markdown; with `plots`, the history PNGs beside it are (re)drawn too
    (the markdown is the same either way, so `--check` can compare it without drawing)."""
    records = read_records(results_dir)
    lines = ["# Benchmark results", "",
             "Generated by `ratchet results` from the recorded lines in this folder (`<bench>.jsonl`, one",
             "line per `ratchet bench NAME --record` run). Do not edit by hand: record a run and re-render.",
             "Each figure comes with the commit, the machine and its load average (1 minute, before and",
             "after the run); the machine is shared, so figures move with its load.", "",
             "| bench | latest | headline | baseline | ratio | targets |", "|---|---|---|---|---|---|"]
    order = _order(records)
    for b in order:
        rec = records[b][-1]
        spec = SPECS.get(b, BenchSpec("", ("ratio", ""), ()))
        key, unit = spec.headline
        res = rec["result"]
        lines.append(f"| [{b}](#{b}) | {rec['recorded_at'][:10]} | {_fmt(lookup(res, key))} {unit} "
                     f"| {res.get('baseline', 'n/a')} | {_fmt(res.get('ratio'))} | {_met(spec, res)} |")
    missing = [b for b in SPECS if b not in records]
    if missing:
        lines += ["", "Not recorded yet: " + ", ".join(f"`{b}`" for b in missing) + "."]
    if (results_dir / "scorecard.md").exists():
        lines += ["", "The reference workload's scorecard (`ratchet demo --full`): [scorecard.md](scorecard.md)."]
    for b in list(SPECS) + sorted(b for b in records if b not in SPECS):
        if b not in records:  # a heading all the same, so links to it hold before the first record
            lines += ["", f"## {b}", "", f"What it measures: {SPECS[b].what}. Not recorded yet: "
                      f"`ratchet bench {b} --record`."]
            continue
        rows = records[b]
        rec = rows[-1]
        spec = SPECS.get(b, BenchSpec("", ("ratio", ""), ()))
        res = rec["result"]
        m = rec.get("machine") or {}
        lines += ["", f"## {b}", ""]
        if spec.what:
            lines += [f"What it measures: {spec.what}. Ratio: {spec.ratio_means}.", ""]
        lines += [f"Latest: {rec['recorded_at']} at commit `{rec.get('commit')}`"
                  f"{' (with uncommitted changes)' if rec.get('dirty') else ''}, {m.get('cores')} cores, "
                  f"{m.get('mem_gib')} GiB, load {_fmt(rec.get('loadavg_1m'))}, {_fmt(rec.get('wall_s'))} s.",
                  "", f"    {_command(rec)}", "",
                  "| figure | value |", "|---|---|"]
        for k, v in res.items():
            if isinstance(v, (dict, list)) and len(json.dumps(v)) > 120:
                continue  # long structures stay in the JSON line
            lines.append(f"| `{k}` | {_fmt(v)} |")
        for t in spec.targets:
            m_ = t.met(res)
            lines.append(f"| target: {t.label} | {'met' if m_ else 'not met' if m_ is False else 'not measured'} |")
        if b == "mutation":
            lines += ["", f"Per file, the survivors that need a test, the survivors judged equivalent and the lines "
                          f"not mutated: [{MUTATION_PAGE}]({MUTATION_PAGE})."]
        if len(rows) > 1:
            key, unit = spec.headline
            lines += ["", "History (newest first):", "", f"| recorded | commit | {key} | ratio | load |", "|---|---|---|---|---|"]
            for r in reversed(rows[-HISTORY_ROWS:]):
                lines.append(f"| {r['recorded_at'][:16]} | `{r.get('commit')}` | {_fmt(lookup(r['result'], key))} "
                             f"| {_fmt(r['result'].get('ratio'))} | {_fmt(r.get('loadavg_1m'))} |")
        if len(rows) >= PLOT_MIN_RECORDS:
            png = results_dir / f"{b}.png"
            if plots:
                _plot(b, spec, rows, png)
            lines += ["", f"![{b} history]({png.name})"]
    return "\n".join(lines) + "\n"


MUTATION_PAGE = "mutation.md"


def render_mutation(results_dir: Path = RESULTS_DIR) -> str | None:
    """The latest mutation record in detail (its own page: the lists grow with every judged
    survivor and would push the results page past its size limit); None without a record."""
    rows = read_records(results_dir).get("mutation")
    if not rows:
        return None
    rec = rows[-1]
    return "\n".join(["# Mutation testing: the latest run in detail", "",
                      "Generated by `ratchet results` from the last line of `mutation.jsonl`. Do not edit by hand.",
                      f"The run: {rec['recorded_at']} at commit `{rec.get('commit')}`, {_command(rec)}; its "
                      f"figures and history: [the results page](README.md#mutation).",
                      *_mutation_detail(rec["result"])]) + "\n"


README = REPO / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def readme_block(results_dir: Path = RESULTS_DIR) -> str:
    """One line per recorded bench for the project README, linking to the results page."""
    records = read_records(results_dir)
    lines = [START, ""]
    for b in _order(records):
        rec = records[b][-1]
        spec = SPECS.get(b, BenchSpec("", ("ratio", ""), ()))
        key, unit = spec.headline
        res = rec["result"]
        lines.append(f"- [`{b}`](docs/results/README.md#{b}): {_fmt(lookup(res, key))} {unit}; ratio "
                     f"{_fmt(res.get('ratio'))} ({spec.ratio_means}); {_met(spec, res)} ({rec['recorded_at'][:10]})")
    missing = [b for b in SPECS if b not in records]
    if missing:
        lines.append("- not recorded yet: " + ", ".join(f"`{b}`" for b in missing))
    return "\n".join(lines + ["", END])


def replace_block(text: str, block: str) -> str:
    import re

    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {START} ... {END} block in the README")
    return pattern.sub(lambda _m: block, text, count=1)


def write_page(results_dir: Path = RESULTS_DIR) -> Path:
    """Render the results page, and the README's results lines when these are the project's results."""
    path = results_dir / "README.md"
    results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(render(results_dir))
    detail = render_mutation(results_dir)
    if detail is not None:
        (results_dir / MUTATION_PAGE).write_text(detail)
    if results_dir.resolve() == RESULTS_DIR.resolve() and README.exists():
        text = README.read_text()
        if START in text:
            README.write_text(replace_block(text, readme_block(results_dir)))
    return path


def stale(results_dir: Path = RESULTS_DIR) -> list[str]:
    """The generated files that differ from what the recorded lines render (empty: up to date)."""
    out = []
    page = results_dir / "README.md"
    if not page.exists() or page.read_text() != render(results_dir, plots=False):
        out.append(str(page))
    detail, mpage = render_mutation(results_dir), results_dir / MUTATION_PAGE
    if detail is not None and (not mpage.exists() or mpage.read_text() != detail):
        out.append(str(mpage))
    if results_dir.resolve() == RESULTS_DIR.resolve() and README.exists():
        text = README.read_text()
        if START not in text or replace_block(text, readme_block(results_dir)) != text:
            out.append(str(README))
    return out
