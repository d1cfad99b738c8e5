"""`mint replay`, `mint tail`, `mint topics`: operator tools over the event log."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from mint.commands.errors import one_line_errors
from schemas.settings import MintSettings, get_settings

console = Console(stderr=True)
out = Console(highlight=False, soft_wrap=True)


def _broker_topic(settings: MintSettings, name: str) -> str:
    """A registry name (export.events) gets the prefix; anything else is a broker name."""
    from streams.topics import TOPICS

    return settings.topic(name) if name in TOPICS else name


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 time (e.g. 2026-12-02T13:00:00Z)"
        ) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)  # naive times are UTC


@click.command("replay")
@click.argument("topic")
@click.option("--from-time", help="start at the first record at or after this ISO time (UTC)")
@click.option("--to-time", help="stop before the first record at or after this ISO time")
@click.option("--from-offset", type=click.IntRange(min=0), help="start offset, every partition")
@click.option("--to-offset", type=click.IntRange(min=0), help="end offset (exclusive)")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="only these partitions (repeatable)",
)
@click.option("--to-topic", help="re-publish into this topic (registry or broker name)")
@click.option("--processor", help="re-drive this processor (module:factory) in a fresh group")
@click.option("--group", help="consumer group for --processor (default: a fresh replay.* group)")
@click.option("--dry-run", is_flag=True, help="print what would happen, change nothing")
@one_line_errors
def replay(
    topic,
    from_time,
    to_time,
    from_offset,
    to_offset,
    partitions,
    to_topic,
    processor,
    group,
    dry_run,
) -> None:
    """Replay TOPIC (registry name like export.events, or a broker name) between two times or
    offsets: re-publish into --to-topic, or re-drive --processor through a fresh consumer group.

    \b
    Examples:
      mint replay export.events --from-time 2026-12-01T00:00Z --processor workers.projector:handler
      mint replay dlq --from-offset 120 --to-offset 130 --to-topic serving.commands --dry-run
    """
    from streams.replay import fresh_group, redrive, republish, resolve_window

    if (to_topic is None) == (processor is None):
        raise click.UsageError("give exactly one of --to-topic or --processor")
    from streams.clients import require_broker

    settings = get_settings()
    require_broker(settings)
    source = _broker_topic(settings, topic)
    window = resolve_window(
        settings,
        source,
        from_time=_parse_time(from_time),
        to_time=_parse_time(to_time),
        from_offset=from_offset,
        to_offset=to_offset,
        partitions=list(partitions) or None,
    )
    table = Table("partition", "from offset", "to offset (excl.)", "records", title=source)
    for p, start, end in window.rows():
        table.add_row(str(p), str(start), str(end), str(max(0, end - start)))
    out.print(table)
    if to_topic is not None:
        target = _broker_topic(settings, to_topic)
        action = f"re-publish {window.total} records from {source} into {target}"
    else:
        group = group or fresh_group(processor)
        action = f"re-drive {processor} over {window.total} records in consumer group {group}"
    if dry_run:
        out.print(f"dry run: would {action}")
        return
    out.print(f"{action} …")
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("replaying", total=window.total)

        def advance(n: int) -> None:
            bar.advance(task, n)

        if to_topic is not None:
            sent = republish(settings, window, target, advance)
            out.print(f"re-published {sent} records into {target}")
        else:
            _, stats = redrive(settings, window, processor, group, advance)
            out.print(
                f"re-drove {stats.records} records: {stats.handled} handled, "
                f"{stats.dead_lettered} dead-lettered {stats.reasons or ''}"
            )


def format_record(record) -> str:
    """One readable line per record: time, where, key, type and a payload summary."""
    from rich.markup import escape

    from schemas import SchemaError, decode_event

    when = datetime.fromtimestamp(record.timestamp / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
    where = f"{record.topic}[{record.partition}]@{record.offset}"
    key = record.key.decode("utf-8", "replace") if record.key else "-"
    headers = dict(record.headers or [])
    dlq = ""
    if headers.get("mint.dlq.reason", b"") != b"":
        reason = headers["mint.dlq.reason"].decode()
        origin = b"/".join(
            headers.get(f"mint.dlq.{k}", b"?") for k in ("topic", "partition", "offset")
        ).decode()
        dlq = f" [red]DLQ {escape(reason)}[/red] from {escape(origin)}:"
    try:
        env = decode_event(record.value)
    except SchemaError as e:
        raw = (record.value or b"")[:60]
        return f"{when} {where} {escape(key)}{dlq} [yellow]{e.reason}[/yellow] {escape(repr(raw))}"
    fields = env.payload.model_dump(mode="json", exclude_defaults=True)
    summary = " ".join(f"{k}={json.dumps(v)}" for k, v in fields.items())
    if len(summary) > 160:
        summary = summary[:157] + "…"
    return (
        f"{when} {where} {escape(key)}{dlq} [bold]{env.type}[/bold] v{env.schema_version} "
        f"{str(env.event_id)[:8]} {escape(summary)}"
    )


@click.command("tail")
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="start at the oldest record, not the end")
@click.option("--limit", type=click.IntRange(min=1), help="stop after this many records")
@click.option("--timeout", "timeout_s", type=float, help="stop after this many idle seconds")
@one_line_errors
def tail(topic: str, from_beginning: bool, limit: int | None, timeout_s: float | None) -> None:
    """Print TOPIC's events live, one readable line each (Ctrl-C stops)."""
    from streams import Follower, TopicError
    from streams.clients import require_broker

    settings = get_settings()
    require_broker(settings)
    name = _broker_topic(settings, topic)
    follower = Follower(settings, client_id="mint-tail")
    try:
        tps = follower.partitions(name)
        if not tps:
            raise TopicError(f"topic {name!r} does not exist (see `mint topics`)")
        follower.assign(tps, "beginning" if from_beginning else "end")
        console.print(f"tailing {name} ({len(tps)} partitions) — Ctrl-C to stop")
        seen, idle_since = 0, time.monotonic()
        for batch in follower.follow(timeout_ms=300):
            records = sorted(batch, key=lambda r: (r.timestamp, r.partition, r.offset))
            if records:
                idle_since = time.monotonic()
            for record in records:
                out.print(format_record(record))
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if timeout_s is not None and time.monotonic() - idle_since > timeout_s:
                return
    except KeyboardInterrupt:
        pass
    finally:
        follower.close()


@click.command("topics")
@click.option("--create", is_flag=True, help="create missing registry topics (idempotent)")
@one_line_errors
def topics(create: bool) -> None:
    """List the topic registry (with MINT_TOPIC_PREFIX) and whether each topic exists."""
    from streams import TOPICS, ensure_topics, make_admin
    from streams.clients import require_broker

    settings = get_settings()
    require_broker(settings)
    if create:
        created = ensure_topics(settings)
        console.print(
            f"created {len(created)} topics"
            + (f": {', '.join(created)}" if created else " (all existed)")
        )
    admin = make_admin(settings)
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    table = Table("topic", "exists", "cleanup", "what")
    for spec in TOPICS.values():
        name = settings.topic(spec.name)
        table.add_row(
            name,
            "yes" if name in existing else "[red]no[/red]",
            "compact" if spec.compacted else "delete",
            spec.description,
        )
    out.print(table)


COMMANDS: list[click.Command] = [replay, tail, topics]
