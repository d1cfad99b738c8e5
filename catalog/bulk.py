"""Bulk writes of whole policies: the writer under ``mint catalog import`` (catalog/importer.py),
which benchmarks and test fixtures load through too.

It writes exactly the rows the repository writes, but without lightweight transactions: the
caller guarantees that nobody else writes these policies meanwhile. Batches are UNLOGGED and never
span partition keys: a policy's revisions, digest rows, aliases and history all have the key
(tenant, policy), so Cassandra applies each batch as one mutation on one replica set; policy rows
are batched per tenant. Many requests stay in flight through ``execute_concurrent``; run several
processes for more throughput (the Python driver is CPU-bound).

``RowWriter`` takes rows the importer validated: values encoded here rather than bound through the driver, pointer cells written "in the past" so that a
re-import never moves what the live catalog moved since.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from catalog.cluster import Statements, driver_error

# ---------------------------------------------------------------------------- the importer's writer

# Cassandra's encodings of the column types RowWriter binds (native protocol, big-endian).
_INT = struct.Struct(">i").pack
_BIGINT = struct.Struct(">q").pack
_SHORT = struct.Struct(">H").pack

# Write time of the pointer cells an import sets (the static ``latest_revision``, alias rows and
# their first history row): 2000-01-01T00:00:00Z in microseconds plus the revision number. Every
# live write (compare-and-set, at the present time) is newer, so a re-import never moves a
# pointer back; among imports the higher revision wins, whatever order the writes land in.
PAST_US = 946_684_800_000_000


# What RowWriter writes: the rows of a registration and a promotion (catalog/repository.py,
# catalog/aliases.py), without conditions; pointer cells at a timestamp from the past (PAST_US).
_STATEMENTS = {
    "_tenant": "INSERT INTO {ks}.tenants (tenant, created_at) VALUES (?, ?)",
    "_policy": (
        "INSERT INTO {ks}.policies (tenant, policy, base_model, created_at, created_by) "
        "VALUES (?, ?, ?, ?, ?)"
    ),
    "_revision": (
        "INSERT INTO {ks}.revisions (tenant, policy, revision, digest, store_uri, "
        "base_model, created_at, created_by, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ),
    "_digest": (
        "INSERT INTO {ks}.revisions_by_digest (tenant, policy, digest, revision) VALUES (?, ?, ?, ?)"
    ),
    "_latest": (
        "UPDATE {ks}.revisions USING TIMESTAMP ? SET latest_revision = ? "
        "WHERE tenant = ? AND policy = ?"
    ),
    "_alias": (
        "INSERT INTO {ks}.aliases (tenant, policy, alias, revision, digest, store_uri, seq, "
        "moved_at, moved_by, move_reason, move_kind) "
        "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, 'import', 'promote') USING TIMESTAMP ?"
    ),
    "_history": (
        "INSERT INTO {ks}.alias_history (tenant, policy, alias, seq, to_revision, moved_at, "
        "moved_by, reason, kind) VALUES (?, ?, ?, 1, ?, ?, ?, 'import', 'promote') "
        "USING TIMESTAMP ?"
    ),
}


def partition_routing_key(*parts: str) -> bytes:
    """The routing key of a composite partition key, encoded as the driver encodes it."""
    return b"".join(_SHORT(len(b)) + b + b"\x00" for b in (p.encode() for p in parts))


class EncodedBatch(BatchStatement):
    """An UNLOGGED batch of prepared statements whose values are already CQL-encoded bytes.

    ``BatchStatement.add`` binds each statement through a ``BoundStatement`` (type dispatch,
    copies of the statement's settings): about 15 µs a statement on these CPUs, more than the
    node takes to apply the row. The importer's values are validated already and of four types
    (text, int, bigint, timestamp), so RowWriter encodes them with ``str.encode`` and ``struct``
    and hands the batch its entries as the driver (3.30) stores them, ``(True, query_id,
    values)``; ``tests/integration/catalog/test_catalog_import.py`` checks the bytes equal the
    driver's own binding.
    """

    def __init__(self, keyspace: str, routing_key: bytes, entries: list[tuple]) -> None:
        super().__init__(BatchType.UNLOGGED, consistency_level=ConsistencyLevel.LOCAL_QUORUM)
        if len(entries) >= 0xFFFF:
            raise ValueError(f"a batch holds at most {0xFFFF - 1} statements, not {len(entries)}")
        self.keyspace = keyspace
        self.routing_key = routing_key
        self._statements_and_parameters = entries


@dataclass
class RowSet:
    """Validated rows for RowWriter; times are epoch milliseconds."""

    tenants: list[tuple[str, int]] = field(default_factory=list)  # tenant, created
    # tenant, policy, base_model, created
    policies: list[tuple[str, str, str, int]] = field(default_factory=list)
    # tenant, policy, revision, digest, store_uri, base_model, created, metadata (JSON)
    revisions: list[tuple[str, str, int, str, str, str, int, str]] = field(default_factory=list)
    # tenant, policy, latest revision
    latest: list[tuple[str, str, int]] = field(default_factory=list)
    # tenant, policy, alias, revision, digest, store_uri, moved
    aliases: list[tuple[str, str, str, int, str, str, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return (
            len(self.tenants) + len(self.policies) + 2 * len(self.revisions) + 2 * len(self.aliases)
        )


class RowWriter:
    """Writes RowSets: per partition key one UNLOGGED batch of up to ``batch`` statements
    (revision rows, digest index rows, the latest-revision pointer, alias and history rows of one
    policy share the key (tenant, policy); policy rows share their tenant's), many requests in
    flight. Every write is an upsert of the same values, so writing a RowSet twice, or a part of
    it and then all of it, leaves the same rows. It takes no lightweight
    transaction: the caller keeps live writers off these policies meanwhile."""

    def __init__(
        self, session: Session, keyspace: str, *, by: str, concurrency: int = 64, batch: int = 100
    ) -> None:
        self.session, self.keyspace = session, keyspace
        self.concurrency, self.batch = concurrency, batch
        self._by = by.encode()
        Statements(session, keyspace).prepare_table(self, _STATEMENTS, fields={"ks": keyspace})

    def _requests(self, rows: RowSet) -> Iterator[tuple]:
        by, ks, size = self._by, self.keyspace, self.batch
        rq, dq, lq = self._revision.query_id, self._digest.query_id, self._latest.query_id
        aq, hq, pq = self._alias.query_id, self._history.query_id, self._policy.query_id
        # The same few texts and times recur on most rows: encode each once.
        texts: dict[str, bytes] = {}
        times: dict[int, bytes] = {}

        def text(s: str) -> bytes:
            b = texts.get(s)
            if b is None:
                b = texts[s] = s.encode()
            return b

        def ms(t: int) -> bytes:
            b = times.get(t)
            if b is None:
                b = times[t] = _BIGINT(t)
            return b

        for tenant, created in rows.tenants:
            yield self._tenant, (tenant, datetime_from_ms(created))
        # Policy rows: one partition per tenant.
        per_tenant: dict[str, list] = {}
        for tenant, policy, base_model, created in rows.policies:
            per_tenant.setdefault(tenant, []).append(
                (True, pq, [text(tenant), policy.encode(), text(base_model), ms(created), by])
            )
        for tenant, entries in per_tenant.items():
            key = partition_routing_key(tenant)
            for k in range(0, len(entries), size):
                yield EncodedBatch(ks, key, entries[k : k + size]), None
        # Everything else: one partition per policy (rows of a policy mostly come together).
        parts: dict[tuple[str, str], tuple[bytes, bytes, list]] = {}
        last_key, part = None, None
        for t, p, n, digest, uri, base_model, created, metadata in rows.revisions:
            if (t, p) != last_key:
                last_key = (t, p)
                part = parts.get(last_key)
                if part is None:
                    part = parts[last_key] = (text(t), p.encode(), [])
            te, pe, entries = part
            ne, de = _INT(n), digest.encode()
            entries.append(
                (
                    True,
                    rq,
                    [
                        te,
                        pe,
                        ne,
                        de,
                        uri.encode(),
                        text(base_model),
                        ms(created),
                        by,
                        text(metadata),
                    ],
                )
            )
            entries.append((True, dq, [te, pe, de, ne]))
        for t, p, latest in rows.latest:
            te, pe, entries = parts.get((t, p)) or parts.setdefault(
                (t, p), (text(t), p.encode(), [])
            )
            entries.append((True, lq, [_BIGINT(PAST_US + latest), _INT(latest), te, pe]))
        for t, p, alias, n, digest, uri, moved in rows.aliases:
            te, pe, entries = parts.get((t, p)) or parts.setdefault(
                (t, p), (text(t), p.encode(), [])
            )
            ae, ne, me, at = text(alias), _INT(n), ms(moved), _BIGINT(PAST_US + n)
            entries.append((True, aq, [te, pe, ae, ne, digest.encode(), uri.encode(), me, by, at]))
            entries.append((True, hq, [te, pe, ae, ne, me, by, at]))
        for (t, p), (_, _, entries) in parts.items():
            key = partition_routing_key(t, p)
            for k in range(0, len(entries), size):
                yield EncodedBatch(ks, key, entries[k : k + size]), None

    def write(self, rows: RowSet) -> int:
        """Write ``rows``; returns the number of rows written (the pointer cell not counted).
        Raises CatalogUnavailable (or CatalogRefused: driver_error) for the first failed
        request, after the others finished."""
        outcomes = execute_concurrent(
            self.session,
            self._requests(rows),
            concurrency=self.concurrency,
            raise_on_first_error=False,
            results_generator=True,
        )
        failed = [value for ok, value in outcomes if not ok]
        if failed:
            raise driver_error(
                failed[0],
                f"write to keyspace {self.keyspace!r} ({len(failed)} requests failed, "
                "the first one)",
                then="then re-run (every write is an idempotent upsert)",
            ) from failed[0]
        return len(rows)


def datetime_from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
