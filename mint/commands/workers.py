"""`mint worker …`: run one long-lived worker (projector, trainer, serving, …) in the foreground."""

from __future__ import annotations

import click


@click.group("worker")
def worker() -> None:
    """Run one MinT worker in the foreground (a consumer-group member; start more to scale out)."""


COMMANDS: list[click.Command] = [worker]
