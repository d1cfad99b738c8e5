"""`mint catalog …`: migrations, rebuild from the log, policies, revisions, aliases (and
`import`, in ``catalog_import``)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from itertools import islice
from typing import Any

import click
from rich.console import Console

from mint.commands.args import tenant_policy
from mint.commands.canary import ended_line, say
from mint.commands.cassandra import catalog_session
from mint.commands.catalog_import import import_cmd
from mint.commands.errors import one_line_errors
from mint.commands.lifecycle import move_alias, print_history
from mint.commands.listing import listing_options
from mint.commands.options import by_option, wait_option
from schemas.settings import get_settings

console = Console(stderr=True)
out = Console()


@click.group("catalog")
def catalog() -> None:
    """The adapter catalog on Cassandra (keyspace MINT_KEYSPACE)."""


@catalog.command("migrate")
@click.option("--keyspace", default=None, help="Keyspace to migrate (default MINT_KEYSPACE).")
@one_line_errors
def migrate_cmd(keyspace: str | None) -> None:
    """Create the keyspace if needed and apply pending schema migrations (idempotent).

    Replication comes from MINT_KEYSPACE_REPLICATION: SimpleStrategy RF 1 locally; on a cluster
    use e.g. "{'class': 'NetworkTopologyStrategy', 'dc1': 3}".
    """
    from catalog.migrate import applied_versions, migrate

    settings = get_settings()
    ks = keyspace or settings.keyspace
    with catalog_session(settings) as session:
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
    help="Compare the rebuilt catalog with the live one (MINT_KEYSPACE).",
)
@click.option(
    "--drop/--keep",
    default=False,
    help="Drop the rebuilt keyspace afterwards (e.g. after a successful check).",
)
@one_line_errors
def rebuild_cmd(target: str | None, compare: bool, drop: bool) -> None:
    """Replay the event log from the start into an empty keyspace; compare with the live one.

    Exit 1 when events were refused or the rebuilt catalog differs from the live one.
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from catalog.rebuild import rebuild
    from catalog.snapshot import compare as compare_keyspaces
    from streams.clients import require_broker
    from workers.projector import LogStats, read_log

    settings = get_settings()
    require_broker(settings)  # before the target keyspace is made: the log is Kafka's
    target = target or f"{settings.keyspace}_rebuild_{uuid.uuid4().hex[:8]}"
    stats = LogStats()
    ok = True
    progress = Progress(
        SpinnerColumn(),
        TextColumn("replaying the log into {task.fields[target]}: {task.completed:,.0f} events"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("rebuild", total=None, target=target)
    with catalog_session(settings) as session:
        try:
            with progress:
                report = rebuild(
                    session,
                    target,
                    settings.keyspace_replication,
                    read_log(settings, stats=stats),
                    progress=lambda n: progress.advance(task, n),
                )
            console.print(
                f"replayed {stats.records} records ({stats.per_topic}; "
                f"{stats.undecodable} undecodable) into {target}: "
                f"{dict(report.outcomes)}"
            )
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
@by_option
@one_line_errors
def create_policy_cmd(policy_id: str, base_model: str, by: str) -> None:
    """Create POLICY_ID (tenant/policy); idempotent for the same base model."""
    from catalog.repository import CatalogRepository

    settings = get_settings()
    with catalog_session(settings) as session:
        p = CatalogRepository(session, settings.keyspace).create_policy(
            *tenant_policy(policy_id), base_model, by=by
        )
    console.print(f"policy {p.name} on {p.base_model} (created {p.created_at:%Y-%m-%d %H:%M})")


@catalog.command("resolve")
@click.argument("reference")
@one_line_errors
def resolve_cmd(reference: str) -> None:
    """Resolve tenant/policy@alias, @N or @sha256:… and print it as JSON."""
    from catalog.repository import CatalogRepository

    settings = get_settings()
    with catalog_session(settings) as session:
        r = CatalogRepository(session, settings.keyspace).resolve(reference)
    out.print_json(json.dumps(r.__dict__))


@catalog.command("revisions")
@click.argument("policy_id")
@listing_options
@one_line_errors
def revisions_cmd(policy_id: str, limit: int, output: str) -> None:
    """List a policy's revisions, newest first, with their aliases, training loss and reward and
    each suite's evaluation verdict (`mint revision show REF` prints one revision whole)."""
    from mint.commands import revisions as shown

    tenant, policy = tenant_policy(policy_id)
    with shown.catalog_repo() as repo:
        revs = list(islice(repo.iter_revisions(tenant, policy), limit))
        aliases, evaluations = [], {}
        if revs:
            aliases = repo.list_aliases(tenant, policy)
            evaluations = repo.evaluations_by_revision(tenant, policy)
    shown.print_revisions(shown.revision_rows(revs, aliases, evaluations), output, store=True)


@catalog.command("history")
@click.argument("reference")
@listing_options
@one_line_errors
def history_cmd(reference: str, limit: int, output: str) -> None:
    """Show an alias's moves (tenant/policy@alias), newest first."""
    from catalog.refs import parse_ref
    from catalog.repository import CatalogRepository

    ref = parse_ref(reference)
    if ref.alias is None:
        raise click.BadParameter(f"{reference!r} names no alias (tenant/policy@alias)")
    settings = get_settings()
    with catalog_session(settings) as session:
        moves = CatalogRepository(session, settings.keyspace).alias_history(
            ref.tenant, ref.policy, ref.alias, limit=limit
        )
    print_history(moves, output)


def _move(reference: str, call: Callable[[Any, str, str], Any], timeout: float, by: str) -> None:
    """Send ``call(client, policy, alias)`` (the SDK's promote or rollback) for
    tenant/policy@alias (``prod`` when no alias is named), wait for the controller's
    ``alias.moved`` and print it."""
    from catalog.refs import parse_ref

    ref = parse_ref(reference)
    alias = ref.alias or "prod"
    moved = move_alias(
        ref.tenant,
        ref.policy,
        alias,
        lambda c: call(c, ref.policy, alias),
        timeout_s=timeout,
        by=by,
    )
    if moved.type == "canary.ended":  # a rollback ends a running canary: the alias stays
        say(ended_line(moved))
        return
    p = moved.payload
    console.print(
        f"{moved.tenant}/{moved.policy}@{p.alias}: {p.from_revision or '-'} -> "
        f"{p.to_revision} ({p.cause}; event {moved.event_id})"
    )


@catalog.command("promote")
@click.argument("reference")
@click.option("--to", "to", type=int, required=True, help="Revision number to point at.")
@click.option(
    "--expected",
    type=int,
    default=None,
    help="Move only if the alias points here now (compare-and-set).",
)
@click.option("--reason", default="", show_default=False)
@by_option
@wait_option()
@one_line_errors
def promote_cmd(
    reference: str, to: int, expected: int | None, reason: str, by: str, timeout: float
) -> None:
    """Point tenant/policy@alias at revision --to.

    Publishes serving.promote and waits for the controller (`mint worker controller`) to carry
    it out by compare-and-set, exactly as `mint promote tenant/policy@N --alias ALIAS` does
    (there @ names the revision, here the alias). A refusal prints its reason (exit 1)."""
    _move(
        reference,
        lambda c, policy, alias: c.promote(
            policy, to, alias=alias, expected_revision=expected, reason=reason
        ),
        timeout,
        by,
    )


@catalog.command("rollback")
@click.argument("reference")
@click.option("--to", "to", type=int, default=None, help="Revision (default: the previous one).")
@click.option("--reason", default="rollback")
@by_option
@wait_option()
@one_line_errors
def rollback_cmd(reference: str, to: int | None, reason: str, by: str, timeout: float) -> None:
    """Move tenant/policy@alias back to its previous target (or to --to).

    Publishes serving.rollback and waits for the controller to carry it out, as `mint rollback`
    does (a running canary of the alias is ended instead: the alias stays)."""
    _move(
        reference,
        lambda c, policy, alias: c.rollback(policy, alias=alias, to_revision=to, reason=reason),
        timeout,
        by,
    )


catalog.add_command(import_cmd)

COMMANDS: list[click.Command] = [catalog]
