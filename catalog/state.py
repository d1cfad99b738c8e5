"""Durable key → JSON documents for stream processors (table ``worker_state``).

A worker that decides from state (the lifecycle controller) reads the document of the key it is
handling and writes it back before it publishes what the decision leads to: after a crash the
redelivered event finds the state it produced, and nothing published was decided from state that
is gone. One partition per (name, key): a million policies are a million small partitions.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session

from catalog.cluster import Statements


class StateTable:
    """The documents of one ``name`` (e.g. ``controller.lifecycle``): ``get`` and item set."""

    def __init__(self, session: Session, keyspace: str, name: str) -> None:
        self.session, self.keyspace, self.name = session, keyspace, name
        self._cql = Statements(
            session,
            keyspace,
            about=f"worker state {name!r}",
            then="the worker retries until it answers",
        )
        self._get = self._cql.prepare(
            f"SELECT value FROM {keyspace}.worker_state WHERE name = ? AND key = ?"
        )
        self._put = self._cql.prepare(
            f"INSERT INTO {keyspace}.worker_state (name, key, value, updated_at) "
            "VALUES (?, ?, ?, ?)"
        )

    def get(self, key: str, default: Any = None) -> Any:
        row = self._cql.run(self._get, (self.name, key)).one()
        return json.loads(row.value) if row is not None else default

    def __setitem__(self, key: str, value: Any) -> None:
        self._cql.run(self._put, (self.name, key, json.dumps(value), datetime.now(UTC)))
