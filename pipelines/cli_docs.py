"""The README's command table, generated from the `ratchet` argument parser so it cannot drift.

    .venv/bin/python -m pipelines.cli_docs            # print the table
    .venv/bin/python -m pipelines.cli_docs --write    # replace the block in README.md

The block sits between `<!-- cli:start -->` and `<!-- cli:end -->`; tests/test_docs.py fails when
it differs from what the parser says.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- cli:start -->", "<!-- cli:end -->"


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name) or "", sub


def _usage(sub: argparse.ArgumentParser) -> str:
    text = " ".join(sub.format_usage().split())
    text = text.removeprefix("usage: ")
    return text.replace(" [-h]", "")


def rows(parser: argparse.ArgumentParser | None = None) -> list[tuple[str, str]]:
    """(usage, help) for every subcommand, nested ones (`holdout show`) included, in parser order."""
    if parser is None:
        from pipelines.cli import build_parser

        parser = build_parser()
    out = []
    for _name, help_, sub in _subparsers(parser):
        nested = list(_subparsers(sub))
        if nested:
            out += [(_usage(s), h) for _n, h, s in nested]
        else:
            out.append((_usage(sub), help_))
    return out


def table() -> str:
    from pipelines.cli import build_parser

    parser = build_parser()
    glob = " ".join(f"`{a.option_strings[-1]}`" for a in parser._actions if a.option_strings and a.dest != "help")
    lines = [START, "", "| command | what it does |", "|---|---|"]
    lines += [f"| `{u}` | {h} |" for u, h in rows(parser)]
    lines += ["", f"Global options (before the command): {glob}. `ratchet COMMAND --help` explains every flag.",
              "", END]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {START} ... {END} block")
    return pattern.sub(lambda _m: block, text, count=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the README's command table, from the parser")
    ap.add_argument("--write", action="store_true", help=f"replace the block in {README.name}")
    a = ap.parse_args(argv)
    block = table()
    if a.write:
        README.write_text(replace_block(README.read_text(), block))
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
