"""What every gateway instance of a deployment knows about the Tinker API's calls: models,
futures, re-sent calls and saved states, kept in the catalog (catalog.tinker_calls, Cassandra)
so that a call made on one instance is answered on any other, and a restart forgets nothing.

:class:`SharedCalls` is the interface; ``catalog.tinker_calls.TinkerCalls`` implements it on
Cassandra, :class:`MemoryCalls` in this process (unit tests, one instance without a catalog).
Blocking methods: the API calls them off the event loop. Outcomes travel as JSON text and the
SDK's protobuf bytes (:func:`record_of`, :func:`outcome_of`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from catalog.tinker_calls import FutureRecord, ModelRecord
from gateway.tinker.calls import remember
from gateway.tinker.futures import Done, Entry, Failed, Outcome

__all__ = ["FutureRecord", "MemoryCalls", "ModelRecord", "SharedCalls", "outcome_of", "record_of"]


class SharedCalls(Protocol):
    def add_model(self, tenant: str, m: ModelRecord) -> None: ...
    def model(self, tenant: str, policy: str) -> ModelRecord | None: ...
    def add_future(self, tenant: str, f: FutureRecord) -> None: ...
    def settle(self, tenant: str, f: FutureRecord) -> None: ...
    def future(self, tenant: str, request_id: str) -> FutureRecord | None: ...
    def renew(self, tenant: str, request_id: str, until: datetime) -> None: ...
    def claim(self, tenant: str, request_id: str, seen: datetime, until: datetime) -> bool: ...
    def add_call(self, tenant: str, event_id: Any, request_id: str) -> None: ...
    def call(self, tenant: str, event_id: Any) -> str | None: ...
    def add_state(self, tenant: str, path: str, uri: str) -> None: ...
    def state(self, tenant: str, path: str) -> str | None: ...


class MemoryCalls:
    """:class:`SharedCalls` in one process's memory, bounded (the oldest rows go first)."""

    def __init__(self, max_rows: int = 100_000) -> None:
        self.max_rows = max_rows
        self._rows: dict[tuple[str, str, Any], Any] = {}
        self._lock = threading.Lock()

    def _put(self, key: tuple[str, str, Any], value: Any) -> None:
        with self._lock:
            remember(self._rows, key, value, self.max_rows)

    def _get(self, key: tuple[str, str, Any]) -> Any:
        with self._lock:
            return self._rows.get(key)

    def add_model(self, tenant: str, m: ModelRecord) -> None:
        self._put(("model", tenant, m.policy), m)

    def model(self, tenant: str, policy: str) -> ModelRecord | None:
        return self._get(("model", tenant, policy))

    def add_future(self, tenant: str, f: FutureRecord) -> None:
        self._put(("future", tenant, f.request_id), f)

    def settle(self, tenant: str, f: FutureRecord) -> None:
        old = self.future(tenant, f.request_id)  # (as an UPDATE: the lease stays)
        self._put(("future", tenant, f.request_id), replace(f, lease_until=old and old.lease_until))

    def future(self, tenant: str, request_id: str) -> FutureRecord | None:
        return self._get(("future", tenant, request_id))

    def renew(self, tenant: str, request_id: str, until: datetime) -> None:
        with self._lock:
            row = self._rows.get(("future", tenant, request_id))
            if row is not None:
                self._rows[("future", tenant, request_id)] = replace(row, lease_until=until)

    def claim(self, tenant: str, request_id: str, seen: datetime, until: datetime) -> bool:
        with self._lock:
            row = self._rows.get(("future", tenant, request_id))
            if row is None or row.lease_until != seen:
                return False
            self._rows[("future", tenant, request_id)] = replace(row, lease_until=until)
            return True

    def add_call(self, tenant: str, event_id: Any, request_id: str) -> None:
        self._put(("call", tenant, event_id), request_id)

    def call(self, tenant: str, event_id: Any) -> str | None:
        return self._get(("call", tenant, event_id))

    def add_state(self, tenant: str, path: str, uri: str) -> None:
        self._put(("state", tenant, path), uri)

    def state(self, tenant: str, path: str) -> str | None:
        return self._get(("state", tenant, path))


def record_of(
    entry: Entry, outcome: Outcome | None = None, lease_until: datetime | None = None
) -> FutureRecord:
    """A future as its shared row (pending without ``outcome``)."""
    created = datetime.fromtimestamp(entry.wall_created, UTC)
    context = json.dumps(entry.context)
    row = FutureRecord(entry.request_id, entry.kind, context, created, lease_until=lease_until)
    if isinstance(outcome, Done):
        body = None if outcome.json is None else json.dumps({"json": outcome.json})
        return replace(row, outcome=body or json.dumps({"proto": True}), proto=outcome.proto)
    if isinstance(outcome, Failed):
        failed = {"failed": outcome.message, "category": outcome.category, "queued": outcome.queued}
        return replace(row, outcome=json.dumps(failed))
    return row


def outcome_of(row: FutureRecord) -> Outcome | None:
    """A shared row's outcome (None: still pending)."""
    if row.outcome is None:
        return None
    found = json.loads(row.outcome)
    if "failed" in found:
        return Failed(found["failed"], found.get("category", "server"), found.get("queued", True))
    if row.proto is not None:
        return Done(proto=row.proto)
    return Done(json=found.get("json"))


def entry_of(tenant: str, row: FutureRecord) -> Entry:
    """A future made on another instance, as this instance's Entry (to finish its answer)."""
    entry = Entry(row.request_id, tenant, row.kind, 0.0, json.loads(row.context))
    entry.wall_created = row.created_at.timestamp()
    entry.outcome = outcome_of(row)
    return entry
