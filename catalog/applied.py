"""Which events the catalog applied: the ``applied_events`` rows that make the projection (and a
registration by source event) idempotent.

``AppliedEvents`` is a part of ``CatalogRepository`` (mixed in, which prepares the statements
below), on ``CatalogBase`` (``base.py``: ``_run`` and ``_one``). ``registration.py`` records
through it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from cassandra import ConsistencyLevel
from cassandra.query import BatchStatement, BatchType

from catalog.base import CatalogBase
from catalog.models import Revision, utc

# Unlogged batches of applied_events rows span partitions: kept within Cassandra's warning.
_APPLIED_BATCH = 10

APPLIED_STATEMENTS = {
    "_get_applied": (
        "SELECT event_id, type, tenant, policy, revision, outcome FROM {ks}.applied_events "
        "WHERE event_id = ?"
    ),
    "_ins_applied": (
        "INSERT INTO {ks}.applied_events "
        "(event_id, type, tenant, policy, revision, outcome, applied_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
    ),
    "_get_applied_ids": "SELECT event_id FROM {ks}.applied_events WHERE event_id IN ?",
}


class AppliedEvents(CatalogBase):
    """The applied-events half of ``CatalogRepository``."""

    def is_applied(self, event_id: uuid.UUID) -> bool:
        return self._one(self._get_applied, (event_id,)) is not None

    def applied_among(self, event_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Which of ``event_ids`` were applied: one read (``IN``) per hundred."""
        done: set[uuid.UUID] = set()
        for k in range(0, len(event_ids), 100):
            rows = self._run(self._get_applied_ids, (list(event_ids[k : k + 100]),))
            done.update(r.event_id for r in rows)
        return done

    def record_applied(
        self,
        event_id: uuid.UUID,
        type_: str,
        tenant: str,
        policy: str,
        *,
        revision: int | None = None,
        outcome: str = "applied",
        at: datetime | None = None,
    ) -> None:
        self._run(self._ins_applied, (event_id, type_, tenant, policy, revision, outcome, utc(at)))

    def record_applied_many(self, rows: Iterable[tuple]) -> None:
        """``record_applied`` for many events, each row ``(event_id, type, tenant, policy,
        revision, outcome, at)``: unlogged batches of a few partitions, one request each."""
        rows = list(rows)
        for k in range(0, len(rows), _APPLIED_BATCH):
            batch = BatchStatement(
                BatchType.UNLOGGED, consistency_level=ConsistencyLevel.LOCAL_QUORUM
            )
            for event_id, type_, tenant, policy, revision, outcome, at in rows[
                k : k + _APPLIED_BATCH
            ]:
                batch.add(
                    self._ins_applied, (event_id, type_, tenant, policy, revision, outcome, utc(at))
                )
            self._run(batch, ())

    def _record_applied(self, event_id, rev: Revision, outcome, at) -> None:
        if event_id is not None:
            self.record_applied(
                event_id,
                "revision.registered",
                rev.tenant,
                rev.policy,
                revision=rev.revision,
                outcome=outcome,
                at=at,
            )
