"""`mint catalog …`: migrations, rebuild from the log, policies, revisions, aliases."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
