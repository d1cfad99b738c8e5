"""Rebuild a catalog by replaying the event log into an empty keyspace."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import structlog
from cassandra.cluster import Session

from catalog.exceptions import CatalogError, Conflict
from catalog.migrate import migrate
from catalog.projection import apply_event, apply_events
from catalog.repository import CatalogRepository
from catalog.snapshot import TABLES
from schemas import Envelope

log = structlog.get_logger()

# Events per chunk: large enough that a policy's exports arrive together (registered as one
# lightweight transaction), small enough to show progress every few seconds.
CHUNK = 4096


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
    parallel: int = 16,
    progress: Callable[[int], None] | None = None,
) -> RebuildReport:
    """Migrate ``keyspace`` (which must hold no catalog rows) and apply ``events`` in log order
    per policy, as the live projector does: a chunk of the log at a time, each policy's events
    of the chunk in order on one of ``parallel`` threads, consecutive exports registered
    together (``apply_events``); a run the catalog refuses part of is applied again one event at
    a time. Events the catalog refuses are counted and listed, as the projector dead-letters
    them. ``progress(n)``: called with the events applied after each chunk."""
    migrate(session, keyspace, replication)
    for table in TABLES:
        if session.execute(f"SELECT * FROM {keyspace}.{table} LIMIT 1").one() is not None:
            raise Conflict(
                f"keyspace {keyspace!r} is not empty (table {table} has rows): rebuild into a "
                f"new keyspace, or drop this one first (DROP KEYSPACE {keyspace})"
            )
    repo = CatalogRepository(session, keyspace)
    report = RebuildReport(keyspace)
    lock = threading.Lock()

    def apply_run(run: list[Envelope[Any]]) -> None:
        try:
            outcomes = [o.value for o in apply_events(repo, run, routes=True)]
        except CatalogError:  # an event of the run is refused: find which, one at a time
            outcomes = [one(env) for env in run]
        with lock:
            report.outcomes.update(outcomes)

    def one(env: Envelope[Any]) -> str:
        try:
            return apply_event(repo, env, routes=True).value
        except CatalogError as e:
            with lock:
                if len(report.failures) < max_failures:
                    report.failures.append(f"{env.type} {env.event_id}: {e}")
            log.warning("rebuild: event refused", event_id=str(env.event_id), error=str(e))
            return "failed"

    with ThreadPoolExecutor(parallel, thread_name_prefix="rebuild") as pool:
        for chunk in _chunks(events, CHUNK):
            runs: dict[str, list[Envelope[Any]]] = {}
            for env in chunk:
                runs.setdefault(env.policy_id, []).append(env)
            list(pool.map(apply_run, runs.values()))  # re-raises an outage: the rebuild stops
            if progress is not None:
                progress(len(chunk))
    return report


def _chunks(events: Iterable[Envelope[Any]], size: int) -> Iterator[list[Envelope[Any]]]:
    it = iter(events)
    while chunk := list(islice(it, size)):
        yield chunk


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
        problems.append(
            f"applied_events differ: only in the catalog {sorted(live - replayed)[:3]}, "
            f"only in the replay {sorted(replayed - live)[:3]}"
        )
    return problems
