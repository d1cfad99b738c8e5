"""`mint worker …`: run one long-lived worker (projector, trainer, serving, …) in the foreground."""

from __future__ import annotations

import click


@click.group("worker")
def worker() -> None:
    """Run one MinT worker in the foreground (a consumer-group member; start more to scale out)."""


@worker.command("projector")
@click.option("--migrate/--no-migrate", "auto_migrate", default=False, show_default=True,
              help="Apply pending catalog migrations before consuming.")  # fmt: skip
def projector(auto_migrate: bool) -> None:
    """Apply export and alias-moved events to the Cassandra catalog (group catalog-projector)."""
    from workers.projector import main

    main(auto_migrate=auto_migrate)


COMMANDS: list[click.Command] = [worker]
