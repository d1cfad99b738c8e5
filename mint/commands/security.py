"""`mint security …`: service credentials for a deployment (secret files, ACLs, roles)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from mint.commands.errors import one_line_errors
from schemas.settings import get_settings

console = Console(stderr=True)

DIR = click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path),
    required=True,
    help="Secrets folder: one password per file, kafka-<principal> and cassandra-<role>.",
)


@click.group("security")
def security() -> None:
    """Credentials: one Kafka principal and one Cassandra role per service.

    \b
    A deployment runs, once:
      mint security secrets --dir /secrets   create the missing password files (0600)
      (the broker formats its storage with the SCRAM users: see deploy/)
      mint security apply --dir /secrets     Kafka ACLs and Cassandra roles, as the super users
      mint security tenant T --dir /secrets  a principal that reads only tenant T's answers
    Then each process gets MINT_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT (or SASL_SSL),
    MINT_KAFKA_USERNAME, MINT_KAFKA_PASSWORD_FILE, MINT_CASSANDRA_USERNAME and
    MINT_CASSANDRA_PASSWORD_FILE of its own principal. Locally: `mint dev up --secure`.
    """


@security.command("secrets")
@DIR
@one_line_errors
def secrets_cmd(folder: Path) -> None:
    """Create the password files that do not exist yet (existing ones are kept)."""
    from mint.security import ensure_secrets

    created = ensure_secrets(folder)
    console.print(f"{len(created)} created in {folder}: {', '.join(created) or 'none needed'}")


@security.command("apply")
@DIR
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=90.0,
    help="Seconds to wait for the services to accept the admin logins.",
)
@one_line_errors(ValueError, RuntimeError)  # mint.security's own input and timeout errors
def apply_cmd(folder: Path, timeout_s: float) -> None:
    """Create the Kafka ACLs and the Cassandra roles (idempotent)."""
    from mint.security import apply

    applied = apply(get_settings(), folder, timeout_s)
    console.print(f"{applied['acls']} Kafka ACLs, {applied['roles']} Cassandra roles applied")


@security.command("tenant")
@click.argument("tenant")
@DIR
@one_line_errors(RuntimeError)  # the broker's refusals (streams/acls.py)
def tenant_cmd(tenant: str, folder: Path) -> None:
    """A downstream principal for TENANT that reads only TENANT's answers.

    \b
    Makes (idempotent, as the Kafka super user) the principal downstream-TENANT with its
    password file kafka-downstream-TENANT in --dir, ACLs that let it read the topics and join
    the groups named <prefix>.tenant.TENANT.* and nothing else, and the topic
    <prefix>.tenant.TENANT.infer.results, which `mint worker router` fills with the tenant's
    answers. Hand the tenant's system that password file; it consumes that topic in a group
    named <prefix>.tenant.TENANT.<anything>.
    """
    from mint.security import admin_settings, ensure_secret
    from streams.acls import apply_tenant, tenant_principal
    from streams.topics import tenant_namespace, tenant_topic

    settings = get_settings()
    namespace = tenant_namespace(settings, tenant)  # a bad name before any file is made
    name = f"kafka-{tenant_principal(tenant)}"
    created = ensure_secret(folder, name)
    created_topics = apply_tenant(
        admin_settings(settings, folder), tenant, (folder / name).read_text().strip()
    )
    console.print(
        f"principal {tenant_principal(tenant)}: password {folder / name} "
        f"({'created' if created else 'kept'}); reads {namespace}* only; answers on "
        f"{tenant_topic(settings, tenant)} "
        f"({'created' if created_topics else 'exists'})"
    )


def _tables(names: tuple[str, ...]) -> str:
    """Table names, with the catalog's and the access tables' groups named once."""
    from catalog.roles import ACCESS, CATALOG, TABLES

    if set(names) == set(TABLES):
        return "every table"
    out, rest = [], list(names)
    for group, label in ((CATALOG, "catalog"), (ACCESS, "access (keys, rates)")):
        if set(group) <= set(rest):
            out.append(label)
            rest = [t for t in rest if t not in group]
    return ", ".join(out + rest) or "-"


@security.command("principals")
@one_line_errors
def principals_cmd() -> None:
    """What each Kafka principal may read, write and join (topics without the prefix), and
    which Cassandra tables its role reads and modifies."""
    from catalog.roles import RIGHTS
    from streams.acls import PRINCIPALS

    def cassandra(name: str) -> str:
        r = RIGHTS.get(name)
        if r is None:
            return "-"
        cell = f"reads: {_tables(r.reads)}"
        if r.modifies:
            cell += f"\nmodifies: {_tables(r.modifies)}"
        return cell + ("\nmigrations (CREATE)" if r.schema else "")

    table = Table("principal", "reads", "writes", "groups", "Cassandra")
    for name, g in PRINCIPALS.items():
        writes = "\n".join(g.writes + (("tenant.*",) if g.tenant_writes else ()))
        table.add_row(
            name,
            "\n".join(g.reads) or "-",
            writes or "-",
            ", ".join(g.groups) or "-",
            cassandra(name),
        )
    table.add_row("downstream-<tenant>", "tenant.<tenant>.*", "-", "tenant.<tenant>.*", "-")
    table.add_row(
        "operator",
        "every topic",
        "requests, serving.commands, policy.config",
        "operator*, replay.*",
        cassandra("operator"),
    )
    table.add_row("admin", "super user", "super user", "-", "superuser")
    Console().print(table)


COMMANDS: list[click.Command] = [security]
