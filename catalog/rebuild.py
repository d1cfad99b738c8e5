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
