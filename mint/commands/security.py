"""`mint security …`: service credentials for a deployment (secret files, ACLs, roles)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from schemas.settings import get_settings

console = Console(stderr=True)

DIR = click.option("--dir", "folder", type=click.Path(path_type=Path), required=True,
                   help="Secrets folder: one password per file, kafka-<principal> and "
                        "cassandra-<role>.")  # fmt: skip


@click.group("security")
def security() -> None:
    """Credentials: one Kafka principal and one Cassandra role per service.

    \b
    A deployment runs, once:
      mint security secrets --dir /secrets   create the missing password files (0600)
      (the broker formats its storage with the SCRAM users: see deploy/)
      mint security apply --dir /secrets     Kafka ACLs and Cassandra roles, as the super users
    Then each process gets MINT_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT (or SASL_SSL),
    MINT_KAFKA_USERNAME, MINT_KAFKA_PASSWORD_FILE, MINT_CASSANDRA_USERNAME and
    MINT_CASSANDRA_PASSWORD_FILE of its own principal. Locally: `mint dev up --secure`.
    """


@security.command("secrets")
@DIR
def secrets_cmd(folder: Path) -> None:
    """Create the password files that do not exist yet (existing ones are kept)."""
    from mint.security import ensure_secrets

    created = ensure_secrets(folder)
    console.print(f"{len(created)} created in {folder}: {', '.join(created) or 'none needed'}")


@security.command("apply")
@DIR
@click.option("--timeout", "timeout_s", type=float, default=90.0, show_default=True,
              help="Seconds to wait for the services to accept the admin logins.")  # fmt: skip
def apply_cmd(folder: Path, timeout_s: float) -> None:
    """Create the Kafka ACLs and the Cassandra roles (idempotent)."""
    from mint.security import apply

    try:
        applied = apply(get_settings(), folder, timeout_s)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        console.print(f"[red]error:[/red] {e}")
        sys.exit(1)
    console.print(f"{applied['acls']} Kafka ACLs, {applied['roles']} Cassandra roles applied")


@security.command("principals")
def principals_cmd() -> None:
    """What each Kafka principal may read, write and join (topics without the prefix)."""
    from catalog.roles import ROLES
    from streams.acls import PRINCIPALS

    table = Table("principal", "reads", "writes", "groups", "Cassandra")
    for name, g in PRINCIPALS.items():
        table.add_row(name, "\n".join(g.reads) or "-", "\n".join(g.writes) or "-",
                      ", ".join(g.groups) or "-", ", ".join(ROLES.get(name, ())) or "-")  # fmt: skip
    table.add_row("operator", "every topic", "requests, serving.commands, policy.config",
                  "operator*, replay.*", ", ".join(ROLES["operator"]))  # fmt: skip
    table.add_row("admin", "super user", "super user", "-", "superuser")
    Console().print(table)


COMMANDS: list[click.Command] = [security]
