"""`mint catalog …`: migrations, rebuild from the log, policies, revisions, aliases."""

from __future__ import annotations

import functools
import json
import sys
import uuid
from collections.abc import Callable
from contextlib import contextmanager

import click
from rich.console import Console
from rich.table import Table

from schemas.settings import MintSettings, get_settings

console = Console(stderr=True)
out = Console()


@contextmanager
def _session(settings: MintSettings):
    from catalog.cluster import connect

    cluster, session = connect(settings)
    try:
        yield session
    finally:
        cluster.shutdown()


def _fail_on_catalog_errors(fn: Callable) -> Callable:
    """Print catalog/driver errors as one clear line and exit 1 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from catalog.cluster import CassandraUnavailable
        from catalog.exceptions import CatalogError

        try:
            return fn(*args, **kwargs)
        except (CatalogError, CassandraUnavailable) as e:
            console.print(f"[red]error:[/red] {e}")
            sys.exit(1)

    return wrapper


def _split(policy_id: str) -> tuple[str, str]:
    tenant, sep, policy = policy_id.partition("/")
    if not sep:
        raise click.BadParameter(f"{policy_id!r} is not tenant/policy (e.g. acme/math-rl)")
    return tenant, policy


@click.group("catalog")
def catalog() -> None:
    """The adapter catalog on Cassandra (keyspace MINT_KEYSPACE)."""


@catalog.command("migrate")
@click.option("--keyspace", default=None, help="Keyspace to migrate (default MINT_KEYSPACE).")
@_fail_on_catalog_errors
def migrate_cmd(keyspace: str | None) -> None:
    """Create the keyspace if needed and apply pending schema migrations (idempotent).

    Replication comes from MINT_KEYSPACE_REPLICATION: SimpleStrategy RF 1 locally; on a cluster
    use e.g. "{'class': 'NetworkTopologyStrategy', 'dc1': 3}".
    """
    from catalog.migrate import applied_versions, migrate

    settings = get_settings()
    ks = keyspace or settings.keyspace
    with _session(settings) as session:
        done = migrate(session, ks, settings.keyspace_replication)
        versions = applied_versions(session, ks)
    console.print(f"keyspace {ks}: applied now {done or 'nothing'}; at versions {versions}")


@catalog.command("rebuild")
@click.option(
    "--into",
    "target",
    default=None,
    help="Empty keyspace to rebuild into (default: <MINT_KEYSPACE>_rebuild_<random>).",
)
@click.option(
    "--compare/--no-compare",
    default=True,
    show_default=True,
    help="Compare the rebuilt catalog with the live one (MINT_KEYSPACE).",
)
@click.option(
    "--drop/--keep",
    default=False,
    show_default=True,
    help="Drop the rebuilt keyspace afterwards (e.g. after a successful check).",
)
@_fail_on_catalog_errors
def rebuild_cmd(target: str | None, compare: bool, drop: bool) -> None:  # fmt: skip
    """Replay the event log from the start into an empty keyspace; compare with the live one.

    Exit 1 when events were refused or the rebuilt catalog differs from the live one.
    """
    from catalog.rebuild import rebuild
    from catalog.snapshot import compare as compare_keyspaces
    from workers.projector import LogStats, read_log

    settings = get_settings()
    target = target or f"{settings.keyspace}_rebuild_{uuid.uuid4().hex[:8]}"
    stats = LogStats()
    ok = True
    with _session(settings) as session:
        try:
            report = rebuild(
                session, target, settings.keyspace_replication, read_log(settings, stats=stats)
            )
            console.print(f"replayed {stats.records} records ({stats.per_topic}; "
                          f"{stats.undecodable} undecodable) into {target}: "
                          f"{dict(report.outcomes)}")  # fmt: skip
            for f in report.failures:
                console.print(f"  [yellow]refused[/yellow] {f}")
            ok = not report.failures
            if compare:
                diff = compare_keyspaces(session, settings.keyspace, target)
                console.print(diff.summary())
                verdict = "[green]identical[/green]" if diff.identical else "[red]DIFFERENT[/red]"
                console.print(f"{settings.keyspace} vs {target}: {verdict}")
                ok = ok and diff.identical
        finally:
            if drop:
                session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=120)
    sys.exit(0 if ok else 1)


@catalog.command("create-policy")
@click.argument("policy_id")
@click.option("--base-model", required=True, help="Base model id or path the policy trains on.")
@click.option("--by", default="cli", show_default=True)
@_fail_on_catalog_errors
def create_policy_cmd(policy_id: str, base_model: str, by: str) -> None:
    """Create POLICY_ID (tenant/policy); idempotent for the same base model."""
    from catalog.repository import CatalogRepository

    settings = get_settings()
    with _session(settings) as session:
        p = CatalogRepository(session, settings.keyspace).create_policy(
            *_split(policy_id), base_model, by=by
        )
    console.print(f"policy {p.name} on {p.base_model} (created {p.created_at:%Y-%m-%d %H:%M})")


@catalog.command("resolve")
@click.argument("reference")
@_fail_on_catalog_errors
def resolve_cmd(reference: str) -> None:
    """Resolve tenant/policy@alias, @N or @sha256:… and print it as JSON."""
    from catalog.repository import CatalogRepository

    settings = get_settings()
    with _session(settings) as session:
        r = CatalogRepository(session, settings.keyspace).resolve(reference)
    out.print_json(json.dumps(r.__dict__))


@catalog.command("revisions")
@click.argument("policy_id")
@click.option("--limit", default=20, show_default=True)
@_fail_on_catalog_errors
def revisions_cmd(policy_id: str, limit: int) -> None:
    """List a policy's revisions, newest first."""
    from catalog.repository import CatalogRepository

    settings = get_settings()
    table = Table("rev", "digest", "store uri", "parent", "created", "by")
    with _session(settings) as session:
        repo = CatalogRepository(session, settings.keyspace)
        for i, r in enumerate(repo.iter_revisions(*_split(policy_id))):
            if i >= limit:
                break
            table.add_row(str(r.revision), r.digest[:19] + "…", r.store_uri,
                          str(r.parent_revision or "-"), f"{r.created_at:%Y-%m-%d %H:%M:%S}",
                          r.created_by)  # fmt: skip
    out.print(table)


@catalog.command("history")
@click.argument("reference")
@click.option("--limit", default=20, show_default=True)
@_fail_on_catalog_errors
def history_cmd(reference: str, limit: int) -> None:
    """Show an alias's moves (tenant/policy@alias), newest first."""
    from catalog.refs import parse_ref
    from catalog.repository import CatalogRepository

    ref = parse_ref(reference)
    if ref.alias is None:
        raise click.BadParameter(f"{reference!r} names no alias (tenant/policy@alias)")
    settings = get_settings()
    table = Table("seq", "from", "to", "kind", "when", "who", "why")
    with _session(settings) as session:
        moves = CatalogRepository(session, settings.keyspace).alias_history(
            ref.tenant, ref.policy, ref.alias, limit=limit
        )
    for m in moves:
        table.add_row(str(m.seq), str(m.from_revision or "-"), str(m.to_revision or "-"), m.kind,
                      f"{m.moved_at:%Y-%m-%d %H:%M:%S}", m.moved_by, m.reason)  # fmt: skip
    out.print(table)


def _execute_and_publish(payload, tenant: str, policy: str, by: str) -> None:
    """Run a serving command against the catalog (compare-and-set) and publish the resulting
    alias.moved fact, so the event log stays the source of truth for a rebuild."""
    from catalog.projection import execute_serving_command
    from catalog.repository import CatalogRepository
    from schemas import make_event
    from streams.producer import EventProducer

    settings = get_settings()
    cmd = make_event(payload, tenant=tenant, policy=policy, producer=f"cli/{by}")
    with _session(settings) as session:
        fact = execute_serving_command(
            CatalogRepository(session, settings.keyspace), cmd, producer=f"cli/{by}"
        )
    with EventProducer(settings) as producer:
        producer.publish(fact)
    p = fact.payload
    console.print(f"{tenant}/{policy}@{p.alias}: {p.from_revision or '-'} -> {p.to_revision} "
                  f"({p.cause}; event {fact.event_id})")  # fmt: skip


@catalog.command("promote")
@click.argument("reference")
@click.option("--to", "to", type=int, required=True, help="Revision number to point at.")
@click.option(
    "--expected",
    type=int,
    default=None,
    help="Move only if the alias points here now (compare-and-set).",
)
@click.option("--reason", default="")
@click.option("--by", default="cli", show_default=True)
@_fail_on_catalog_errors
def promote_cmd(reference: str, to: int, expected: int | None, reason: str, by: str) -> None:  # fmt: skip
    """Point tenant/policy@alias at revision --to."""
    from catalog.refs import parse_ref
    from schemas.events import PromoteCommand

    ref = parse_ref(reference)
    _execute_and_publish(
        PromoteCommand(alias=ref.alias or "prod", revision=to, expected_revision=expected,
                       reason=reason, requested_by=by),
        ref.tenant, ref.policy, by,
    )  # fmt: skip


@catalog.command("rollback")
@click.argument("reference")
@click.option("--to", "to", type=int, default=None, help="Revision (default: the previous one).")
@click.option("--reason", default="rollback", show_default=True)
@click.option("--by", default="cli", show_default=True)
@_fail_on_catalog_errors
def rollback_cmd(reference: str, to: int | None, reason: str, by: str) -> None:
    """Move tenant/policy@alias back to its previous target (or to --to)."""
    from catalog.refs import parse_ref
    from schemas.events import RollbackCommand

    ref = parse_ref(reference)
    _execute_and_publish(
        RollbackCommand(alias=ref.alias or "prod", to_revision=to, reason=reason, requested_by=by),
        ref.tenant, ref.policy, by,
    )  # fmt: skip


COMMANDS: list[click.Command] = [catalog]
