"""`mint models …`: tiny real-architecture models for tests, demos and benchmarks."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
