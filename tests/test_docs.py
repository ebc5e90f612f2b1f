"""The docs describe the code as it is: every command and flag they name exists, every environment
variable the code reads is in the configuration table, every relative link resolves, every
warehouse table, view and column is documented, and the generated blocks match their sources."""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from pipelines import cli_docs
from pipelines.cli import build_parser
from ratchet import results

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
CONFIG_PAGE = DOCS / "configuration.md"
WAREHOUSE_PAGE = DOCS / "warehouse.md"
# Product code: every environment variable read here is a setting a user may meet.
CODE_DIRS = ("ratchet", "sandboxes", "assets", "resources", "pipelines", "deploy", "bench")


def _md_files() -> list[Path]:
    return [README, REPO / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


# ------------------------------------------------------------------------------------- commands

def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


# `ratchet SUB [args]` inside inline code or a code block; args stop at the end of the span/line.
_CMD = re.compile(r"(?<![\w/.-])ratchet[ \t]+([a-z][a-z-]*)([^`\n|]*)")


def _commands(text: str):
    spans = re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", text)
    for span in spans:
        for m in _CMD.finditer(span):
            yield m.group(1), m.group(2)


def _check_command(parser, sub: str, rest: str) -> list[str]:
    subs = _choices(parser)
    if rest.startswith(":"):          # "ratchet holdout: ..." is an error message's prefix, not a command
        return []
    if sub not in subs:
        return [f"`ratchet {sub}`: no such command (have {sorted(subs)})"]
    p = subs[sub]
    words = [w.rstrip("\\`'\".,;:)") for w in rest.split()]
    words = [w for w in words if w]
    nested = _choices(p)
    if nested:
        if not words or words[0].startswith("-") or words[0] in ("show|unlock", "show/unlock"):
            return []
        if words[0] not in nested:
            return [f"`ratchet {sub} {words[0]}`: no such command (have {sorted(nested)})"]
        p, words = nested[words[0]], words[1:]
    if sub == "bench":       # flags after NAME belong to the bench, except --record
        head = []
        for w in words:
            if not w.startswith("-"):
                break
            head.append(w)
        words = head + [w for w in words if w == "--record"]
    allowed = _flags(p) | _flags(parser)
    bad = []
    for w in words:
        flag = re.match(r"\[?(--?[a-z][a-z-]*)", w)
        if flag and flag.group(1) not in allowed:
            bad.append(f"`ratchet {sub}`: no flag {flag.group(1)}")
    return bad


def test_every_ratchet_command_and_flag_in_the_docs_exists():
    parser = build_parser()
    bad = []
    seen = 0
    for md in _md_files():
        for sub, rest in _commands(md.read_text()):
            seen += 1
            bad += [f"{md.relative_to(REPO)}: {b}" for b in _check_command(parser, sub, rest)]
    assert seen > 20, "the docs name hardly any command: the pattern is broken"
    assert not bad, "\n".join(bad)


def test_the_check_catches_an_invented_flag():
    parser = build_parser()
    assert _check_command(parser, "ingest", " PATH --tenant T --frobnicate") == ["`ratchet ingest`: no flag --frobnicate"]
    assert _check_command(parser, "holdout", " unlock --reason R --actor A") == []
    assert _check_command(parser, "bench", " --record ingest --n 1000") == []
    assert _check_command(parser, "teleport", "") != []


def test_readme_command_table_is_generated_from_the_parser():
    text = README.read_text()
    block = text[text.index(cli_docs.START):text.index(cli_docs.END) + len(cli_docs.END)]
    assert block == cli_docs.table(), "README's command table is stale: run `python -m pipelines.cli_docs --write`"


# ------------------------------------------------------------------------------------- environment

_READ = re.compile(r"""(?:os\.environ\.get\(|os\.environ\[|os\.getenv\(|getenv\()\s*['"]([A-Z][A-Z0-9_]+)['"]\s*(\]\s*=(?!=))?""")
_YAML_ENV = re.compile(r"^\s*(?:env:\s*|-\s+)([A-Z][A-Z0-9_]{3,})\s*$", re.M)


def _env_reads() -> dict[str, str]:
    found: dict[str, str] = {}
    for d in CODE_DIRS:
        for path in (REPO / d).rglob("*.py"):
            for m in _READ.finditer(path.read_text()):
                if not m.group(2):                       # os.environ["X"] = ... writes, it does not read
                    found.setdefault(m.group(1), str(path.relative_to(REPO)))
    for path in (REPO / "deploy").rglob("*.yaml"):
        for m in _YAML_ENV.finditer(path.read_text()):
            found.setdefault(m.group(1), str(path.relative_to(REPO)))
    for path in (REPO / "tests").rglob("*.py"):          # the suite's own switches
        for m in _READ.finditer(path.read_text()):
            if m.group(1).startswith("RATCHET_") and not m.group(2):
                found.setdefault(m.group(1), str(path.relative_to(REPO)))
    return found


def test_every_environment_variable_read_is_in_the_configuration_table():
    reads = _env_reads()
    assert {"RATCHET_HOME", "RATCHET_SUITE_CACHE", "RATCHET_DOCKER_CACHE", "RATCHET_NO_QUOTA_MOUNT"} <= set(reads)
    documented = set(re.findall(r"^\|[^\n]*", CONFIG_PAGE.read_text(), re.M))
    table = "\n".join(documented)
    missing = {v: where for v, where in reads.items() if f"`{v}`" not in table}
    assert not missing, f"read by the code, not in {CONFIG_PAGE.relative_to(REPO)}'s tables: {missing}"


# ------------------------------------------------------------------------------------- links

def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"[`*_]", lambda m: "_" if m.group(0) == "_" else "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    out, counts = set(), {}
    for h in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        a = _anchor(h)
        n = counts.get(a, 0)
        out.add(a if n == 0 else f"{a}-{n}")
        counts[a] = n + 1
    return out


def _links(md: Path):
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if not re.match(r"^[a-z]+:", target):
            yield target


def test_every_relative_link_resolves():
    bad = []
    for md in _md_files():
        for target in _links(md):
            path, _, frag = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md.relative_to(REPO)}: {target} (no such file)")
            elif frag and dest.suffix == ".md" and frag not in _anchors(dest):
                bad.append(f"{md.relative_to(REPO)}: {target} (no heading #{frag})")
    assert not bad, "\n".join(bad)


def test_anchor_rule():
    assert _anchor("The recurring improvement cycle (`pipelines/cycle.py`)") == \
        "the-recurring-improvement-cycle-pipelinescyclepy"
    assert _anchor("reward_hacks") == "reward_hacks"


# ------------------------------------------------------------------------------------- warehouse

def test_every_warehouse_table_view_and_column_is_documented(tmp_path):
    from ratchet.warehouse import Warehouse

    wh = Warehouse(tmp_path / "w.duckdb")
    wh.ensure_schema()
    with wh.connect() as con:
        objects = con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                              "ORDER BY 1").fetchall()
        columns = {t: [c for (c,) in con.execute("SELECT column_name FROM information_schema.columns "
                                                 "WHERE table_name = ? ORDER BY ordinal_position", [t]).fetchall()]
                   for (t,) in objects}
    assert len(columns) >= 40
    page = WAREHOUSE_PAGE.read_text()
    sections = {}
    for block in re.split(r"^### ", page, flags=re.M)[1:]:
        title, _, body = block.partition("\n")
        for name in re.split(r",\s*", title.strip()):
            sections[name] = body
    missing = [t for t in columns if t not in sections]
    assert not missing, f"tables/views with no '### name' section in docs/warehouse.md: {missing}"
    undocumented = {t: [c for c in cols if f"`{c}`" not in sections[t]] for t, cols in columns.items()}
    # a view documented as "same columns as X" inherits X's list
    for t, body in sections.items():
        m = re.search(r"same columns(?: as `(\w+)`)?", body)
        if t in undocumented and m:
            src = m.group(1)
            if src and src in columns:
                undocumented[t] = [c for c in undocumented[t] if c not in columns[src]]
    undocumented = {t: cs for t, cs in undocumented.items() if cs}
    assert not undocumented, f"columns docs/warehouse.md does not name: {undocumented}"


# ------------------------------------------------------------------------------------- generated, sizes

def test_results_page_and_readme_lines_are_what_the_recorded_lines_render():
    assert results.stale() == [], "run `ratchet results` after recording (the page is generated)"


def test_rendering_the_same_lines_twice_gives_the_same_page():
    with tempfile.TemporaryDirectory() as d:
        for f in results.RESULTS_DIR.glob("*.jsonl"):
            (Path(d) / f.name).write_text(f.read_text())
        assert results.render(Path(d), plots=False) == results.render(Path(d), plots=False)
        if results.RESULTS_DIR.joinpath("README.md").exists():
            assert results.render(Path(d), plots=False) == results.RESULTS_DIR.joinpath("README.md").read_text()


def test_sizes():
    assert len(README.read_text().splitlines()) <= 300
    big = [f"{p.relative_to(REPO)} ({p.stat().st_size // 1024} KB)" for p in DOCS.rglob("*.md")
           if "experiments" not in p.parts and p.stat().st_size > 40 * 1024]
    assert not big, f"docs pages over 40 KB (split them or move history to docs/experiments): {big}"


# Technical senses of the word: pytest's sessions, fixture scope and hook arguments, process sessions
# (setsid, bwrap's --new-session), the ATIF `session_id` field and sample names, and in code the
# reference agents' `Session` class.
_TECHNICAL = re.compile(r"session_?id|scope=.session.|session-scoped|pytest session|warm-up pytest session|"
                        r"sessionstart|sessionfinish|start_new_session|new-session|setsid|"
                        r"\bsession[-.]\w|self\.session|lim\.session|\(self, session\)|\(session\)|= session,|session router", re.I)
_CLASS = re.compile(r"\bSession\b")


def _technical(line: str) -> bool:
    path = line.split(":", 1)[0]
    return bool(_TECHNICAL.search(line) or (path.endswith(".py") and _CLASS.search(line)))


def test_no_work_session_talk_outside_the_experiments_log():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "grep", "-niw", "session", "--", ":!docs/experiments", ":!CHANGELOG.md",
                          ":!tests/test_docs.py"], cwd=REPO, capture_output=True, text=True).stdout
    bad = [ln for ln in out.splitlines() if not _technical(ln)]
    assert not bad, "the word 'session' outside technical uses:\n" + "\n".join(bad[:40])


def test_every_experiment_entry_is_in_the_index():
    folder = DOCS / "experiments"
    index = (folder / "README.md").read_text()
    missing = [p.name for p in sorted(folder.glob("20*.md")) if f"({p.name})" not in index]
    assert not missing, f"docs/experiments/README.md does not list: {missing}"
