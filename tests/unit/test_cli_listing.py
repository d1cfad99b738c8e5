"""List commands' answers: a table for people, or one JSON object per line (-o json)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import click
from click.testing import CliRunner
from rich.console import Console

from mint.commands.listing import output_option, print_rows, text, when

ROWS = [
    {"revision": 2, "aliases": ["prod"], "created_at": datetime(2026, 12, 6, 17, 0, tzinfo=UTC)},
    {"revision": 1, "aliases": [], "created_at": datetime(2026, 12, 5, 9, 30, tzinfo=UTC)},
]
COLUMNS = {
    "rev": text("revision"),
    "aliases": lambda r: ", ".join(r["aliases"]) or "-",
    "created": when("created_at"),
}


def _command():
    buffer = io.StringIO()

    @click.command()
    @output_option
    def listing(output: str) -> None:
        print_rows(Console(file=buffer, width=120), ROWS, COLUMNS, output, title="t/p")

    return listing, buffer


def test_json_is_one_whole_object_per_line_on_stdout() -> None:
    command, table = _command()
    result = CliRunner().invoke(command, ["-o", "json"])
    assert result.exit_code == 0 and table.getvalue() == ""
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert rows[0] == {
        "revision": 2,
        "aliases": ["prod"],
        "created_at": "2026-12-06T17:00:00+00:00",
    }
    assert rows[1]["aliases"] == []


def test_the_default_is_a_table_with_the_columns_people_read() -> None:
    command, table = _command()
    assert CliRunner().invoke(command, []).exit_code == 0
    shown = table.getvalue()
    assert "2026-12-06 17:00:00" in shown and "prod" in shown and "t/p" in shown
    assert "-" in shown.splitlines()[-2]  # revision 1 has no alias


def test_a_bad_output_names_the_choices() -> None:
    command, _ = _command()
    result = CliRunner().invoke(command, ["-o", "yaml"])
    assert result.exit_code == 2 and "'table', 'json'" in result.output
