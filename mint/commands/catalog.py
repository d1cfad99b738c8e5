"""`mint catalog …`: migrations, rebuild from the log, policies, revisions, aliases."""

from __future__ import annotations

import functools
import json
import sys
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

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


@catalog.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--keyspace", default=None, help="Keyspace to import into (default MINT_KEYSPACE).")
@click.option(
    "--workers",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Writer processes (each its own connection) beside the one reading the file; 0 "
    "writes from the reading process.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Requests in flight each.",
)
@click.option(
    "--chunk-rows",
    type=click.IntRange(1),
    default=20_000,
    show_default=True,
    help="Lines per chunk (checkpoint step).",
)
@click.option(
    "--restart", is_flag=True, help="Discard the checkpoint and import from the first line."
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Checkpoint file (default FILE.import-state.json).",
)
@click.option(
    "--rejects",
    "rejects_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Rejected lines (default FILE.rejects.jsonl).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON line.")
@_fail_on_catalog_errors
def import_cmd(
    file: Path,
    keyspace: str | None,
    workers: int,
    concurrency: int,
    chunk_rows: int,
    restart: bool,
    state_path: Path | None,
    rejects_path: Path | None,
    as_json: bool,
) -> None:
    """Import revisions from another registry: FILE is JSON Lines, one revision a line.

    \b
    {"tenant": "acme", "policy": "math-rl", "revision": 3,
     "digest": "sha256:<64 hex>", "uri": "s3://adapters/acme/math-rl/3",
     "base_model": "qwen3-30b-a3b", "created_at": "2025-01-02T03:04:05Z",
     "rank": 8, "aliases": ["prod"]}

    created_at, rank and aliases are optional. JSONL only: Parquet needs pyarrow, which MinT
    does not install. A bad line goes to FILE.rejects.jsonl with its line number and reason;
    the rest are imported. The import checkpoints after every chunk (FILE.import-state.json): run
    the same command again after a crash to continue where it stopped; running it again after it
    finished leaves the same catalog. Imported revisions are not in the event log, so
    `mint catalog rebuild` does not recreate them (keep the file).

    Exit status: 0 imported, 3 imported with rejected lines, 1 error.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from catalog.cluster import CassandraUnavailable
    from catalog.exceptions import CatalogError
    from catalog.importer import import_file

    settings = get_settings()
    ks = keyspace or settings.keyspace
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[rows]:,} revisions, {task.fields[rejected]:,} rejected"),
        TextColumn("[cyan]{task.fields[rate]:,.0f} rows/s"),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )
    task = progress.add_task("import", total=file.stat().st_size, rows=0, rejected=0, rate=0)

    def on_progress(p) -> None:
        progress.update(task, completed=p.bytes_done, rows=p.counts.accepted,
                        rejected=p.counts.rejected, rate=p.rows_per_s,
                        description="re-reading checkpointed lines" if p.rereading else "import")  # fmt: skip

    try:
        with _session(settings) as session, progress:
            result = import_file(
                session, ks, file, settings=settings, workers=workers, concurrency=concurrency,
                chunk_rows=chunk_rows, restart=restart, state_path=state_path,
                rejects_path=rejects_path, on_progress=on_progress,
            )  # fmt: skip
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: run the same command again to continue "
                      "from the last checkpoint")  # fmt: skip
        sys.exit(130)
    except (CatalogError, CassandraUnavailable):
        raise  # ConnectionErrors, hence OSErrors: printed by _fail_on_catalog_errors
    except OSError as e:  # the file, its checkpoint or its rejects file
        raise click.ClickException(
            f"{e}; pass --state and --rejects to keep the checkpoint and rejects elsewhere"
        ) from e
    c = result.counts
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        resumed = f" (resumed after line {result.resumed_from_line:,})" if result.resumed_from_line else ""  # fmt: skip
        console.print(
            f"{file} -> {ks}{resumed}: {c.accepted:,} revisions imported, {c.duplicates:,} "
            f"duplicate lines, {c.rejected:,} rejected; {result.written_this_run:,} rows in "
            f"{result.seconds:.1f} s ({result.rows_per_s:,.0f} rows/s)"
        )
        if c.rejected:
            console.print(f"[yellow]rejected lines:[/yellow] {result.rejects_path}")
    sys.exit(3 if c.rejected else 0)


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
