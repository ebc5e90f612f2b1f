"""Markdown tables for asset metadata (Dagster renders them in the UI)."""
from __future__ import annotations

from typing import Any, Iterable, Sequence


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured table: the header, a `|---|` rule per column, one line per row (cells
    with `str`, as given: wrap code in backticks yourself). No rows: the header and rule only."""
    head = "| " + " | ".join(header) + " |\n|" + "---|" * len(header)
    return head + "\n" + "\n".join("| " + " | ".join(str(c) for c in r) + " |" for r in rows)
