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


@worker.command("trainer")
@click.option(
    "--base-model", default=None, help="Model folder to keep resident (default: MINT_BASE_MODEL)."
)
@click.option(
    "--backend",
    type=click.Choice(["torch", "deepspeed"]),
    default="torch",
    show_default=True,
    help="Optimizer backend: plain torch AdamW or DeepSpeed ZeRO-2.",
)
@click.option(
    "--consumers",
    type=int,
    default=1,
    show_default=True,
    help="Consumer threads sharing the one resident base (policies train while others wait).",
)
def trainer(base_model: str | None, backend: str, consumers: int) -> None:  # fmt: skip
    """Train LoRA updates from update.requests; export, register and announce revisions."""
    from workers.trainer.worker import main

    main(base_model=base_model, backend=backend, consumers=consumers)


COMMANDS: list[click.Command] = [worker]
