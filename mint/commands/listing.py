"""What list commands answer, one way for all: a table for people, or ``-o json`` (one JSON
object per line, for ``jq`` and scripts). Either goes to stdout; messages and logs go to stderr."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from mint.commands.options import limit_option, stack


def _output_option(for_people: str, json_is: str) -> Any:
    return click.option(
        "-o",
        "--output",
        type=click.Choice([for_people, "json"]),
        default=for_people,
        help=f"{for_people}: for people; json: {json_is} (for jq and scripts).",
    )


output_option = _output_option("table", "one object per line")
# A listing newest first: how many rows, and how they print.
listing_options = stack(limit_option, output_option)
# Commands that print one object (`revision show`, `policies show`): readable text or one JSON line.
object_output_option = _output_option("text", "one object")

Cell = Callable[[Mapping[str, Any]], str]


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def echo_json(value: Any) -> None:
    """``value`` as one JSON line on stdout (times in ISO 8601, anything else not JSON as text)."""
    click.echo(json.dumps(value, default=_plain, ensure_ascii=False))


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
            echo_json(row)
        return
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(cell(row) for cell in columns.values()))
    out.print(table)


def when(key: str) -> Cell:
    return lambda row: f"{row[key]:%Y-%m-%d %H:%M:%S}"


def text(key: str, empty: str = "-") -> Cell:
    return lambda row: empty if row[key] in (None, "", []) else str(row[key])
