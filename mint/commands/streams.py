"""`mint replay`, `mint tail`, `mint topics`: operator tools over the event log."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
