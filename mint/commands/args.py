"""Command-line arguments every command parses the same way."""

from __future__ import annotations

import click

from schemas.names import split_policy_id


def tenant_policy(reference: str) -> tuple[str, str]:
    """``acme/math-rl`` (or ``acme/math-rl@prod``: the alias is ignored) → ``("acme",
    "math-rl")``, both names checked where they enter; a bad one is a usage error (exit 2)."""
    try:
        return split_policy_id(reference.partition("@")[0])
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
