"""What list commands answer, one way for all: a table for people, or ``-o json`` (one JSON
object per line, for ``jq`` and scripts). Either goes to stdout; messages and logs go to stderr."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    help="table: for people; json: one object per line (for jq and scripts).",
)

# Commands that print one object (`revision show`, `policies show`): readable text or one JSON line.
object_output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    help="text: for people; json: one object (for jq and scripts).",
)

Cell = Callable[[Mapping[str, Any]], str]


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def print_rows(
    out: Console,
    rows: list[dict[str, Any]],
    columns: Mapping[str, Cell],
    output: str,
    title: str | None = None,
) -> None:
    """``rows`` as ``output`` says: each row's fields as JSON, or ``columns`` (header → how a
    row shows in that column) as one table."""
    if output == "json":
        for row in rows:
            click.echo(json.dumps(row, default=_plain, ensure_ascii=False))
        return
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(cell(row) for cell in columns.values()))
    out.print(table)


def when(key: str) -> Cell:
    return lambda row: f"{row[key]:%Y-%m-%d %H:%M:%S}"


def text(key: str, empty: str = "-") -> Cell:
    return lambda row: empty if row[key] in (None, "", []) else str(row[key])
