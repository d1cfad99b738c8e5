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


def test_policies_list_shows_each_rows_tenant(monkeypatch) -> None:
    """`mint policies list` (every tenant) and `mint policies list TENANT` both name the tenant
    of each row, in the table and in JSON."""
    from types import SimpleNamespace

    from mint.cli import main
    from mint.commands import revisions

    created = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)
    policies = {"acme": ["math"], "globex": ["chat"]}

    class Repo:
        def list_tenants(self):
            return list(policies)

        def list_policies(self, tenant):
            return [
                SimpleNamespace(policy=p, base_model="tiny", created_at=created, retired_at=None)
                for p in policies[tenant]
            ]

        def list_revisions(self, tenant, policy, page_size):
            return [SimpleNamespace(revision=3)], None

        def list_aliases(self, tenant, policy):
            return [SimpleNamespace(alias="prod", revision=3)]

    class _Open:
        def __enter__(self):
            return Repo()

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(revisions, "catalog_repo", _Open)
    monkeypatch.setenv("COLUMNS", "120")
    every = CliRunner().invoke(main, ["policies", "list"])
    assert every.exit_code == 0, every.output
    header, *rows = [line for line in every.output.splitlines() if "│" in line or "┃" in line]
    assert header.split("┃")[1].strip() == "tenant"
    cells = [[c.strip() for c in r.split("│")[1:3]] for r in rows]
    assert cells == [["acme", "math"], ["globex", "chat"]]
    one = CliRunner().invoke(main, ["policies", "list", "acme"])
    assert one.exit_code == 0 and "tenant" in one.output and "acme" in one.output, one.output
    assert "globex" not in one.output
    line = CliRunner().invoke(main, ["policies", "list", "acme", "-o", "json"]).output
    assert json.loads(line)["tenant"] == "acme"
