"""Options that several commands declare alike, declared once: the same flag, default and help
wherever it appears, so a change to one (a default, its wording) reaches every command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def stack(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator for ``options`` as a command lists them, top first (so --help keeps that
    order)."""

    def apply(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


def wait_option(default: float = 60.0, what: str = "the controller's answer") -> Callable:
    """``--timeout``: how long a command waits for the event its command causes."""
    return click.option("--timeout", default=default, help=f"Seconds to wait for {what}.")


# Listings: how many rows (newest first).
limit_option = click.option("--limit", default=20)
# Who a catalog command is recorded as (created_by, moved_by).
by_option = click.option("--by", default="cli")
# Why an alias moves (`mint promote`, `mint rollback`).
reason_option = click.option(
    "--reason", default="", show_default=False, help="Recorded in the alias history."
)
# The engines' workers: the name the catalog knows their base model by.
base_model_name_option = click.option(
    "--base-model-name", default=None, help="base model name in the catalog"
)
