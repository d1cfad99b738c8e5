"""Rebuild a catalog by replaying the event log into an empty keyspace."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from cassandra.cluster import Session

from catalog.exceptions import CatalogError, Conflict
from catalog.migrate import migrate
from catalog.projection import apply_event
from catalog.repository import CatalogRepository
from catalog.snapshot import TABLES
from schemas import Envelope

log = structlog.get_logger()


@dataclass
class RebuildReport:
    keyspace: str
    outcomes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def rebuild(
    session: Session,
    keyspace: str,
    replication: str,
    events: Iterable[Envelope[Any]],
    *,
    max_failures: int = 100,
) -> RebuildReport:
    """Migrate ``keyspace`` (which must hold no catalog rows) and apply ``events`` in log order.
    Events the catalog refuses are counted and listed, as the live projector dead-letters them."""
    migrate(session, keyspace, replication)
    for table in TABLES:
        if session.execute(f"SELECT * FROM {keyspace}.{table} LIMIT 1").one() is not None:
            raise Conflict(
                f"keyspace {keyspace!r} is not empty (table {table} has rows): rebuild into a "
                f"new keyspace, or drop this one first (DROP KEYSPACE {keyspace})"
            )
    repo = CatalogRepository(session, keyspace)
    report = RebuildReport(keyspace)
    for env in events:
        try:
            report.outcomes[apply_event(repo, env).value] += 1
        except CatalogError as e:
            report.outcomes["failed"] += 1
            if len(report.failures) < max_failures:
                report.failures.append(f"{env.type} {env.event_id}: {e}")
            log.warning("rebuild: event refused", event_id=str(env.event_id), error=str(e))
    return report


def replay_differences(
    session: Session, settings: Any, events: Iterable[Envelope[Any]]
) -> list[str]:
    """Rebuild the catalog from ``events`` (the log) into ``<keyspace>_rb`` and compare: the
    catalog is a projection of the log when this returns []. ``applied_events`` (dedup
    bookkeeping) must hold the same events; only its type label may differ, where the trainer
    registered a revision before announcing it (``revision.registered``)."""
    from catalog.snapshot import compare, dump

    target = f"{settings.keyspace}_rb"
    report = rebuild(session, target, settings.keyspace_replication, events)
    problems = [f"replay refused: {f}" for f in report.failures]
    content = tuple(t for t in TABLES if t != "applied_events")
    diff = compare(session, settings.keyspace, target, tables=content)
    if not diff.identical:
        problems.append(diff.summary())

    def applied(ks: str) -> set[tuple]:
        rows = dump(session, ks, ("applied_events",))["applied_events"]
        return {tuple(v for k, v in r if k not in ("type", "outcome")) for r in rows}

    live, replayed = applied(settings.keyspace), applied(target)
    if live != replayed:
        problems.append(f"applied_events differ: only in the catalog {sorted(live - replayed)[:3]}, "
                        f"only in the replay {sorted(replayed - live)[:3]}")  # fmt: skip
    return problems
