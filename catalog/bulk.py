"""Bulk import of whole policies (migrations from another catalog, benchmarks, test fixtures).

It writes exactly the rows the repository writes, but without lightweight transactions: the
caller guarantees that nobody else writes these policies meanwhile. Batches are UNLOGGED and never
span partition keys: a policy's revisions, digest rows, aliases and history all have the key
(tenant, policy), so Cassandra applies each batch as one mutation on one replica set; policy rows
are batched per tenant. Many requests stay in flight through ``execute_concurrent``; run several
processes for more throughput (the Python driver is CPU-bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from catalog.exceptions import CatalogUnavailable
from catalog.refs import check_alias, check_digest, check_name
from catalog.repository import utc

# Statements per UNLOGGED batch: all of one partition key, well under batch_size_fail_threshold.
_BATCH = 50


@dataclass(frozen=True)
class BulkPolicy:
    tenant: str
    policy: str
    base_model: str
    # (digest, store_uri) for revisions 1, 2, 3…
    revisions: list[tuple[str, str]]
    aliases: dict[str, int] = field(default_factory=dict)
    created_at: datetime | None = None


@dataclass
class BulkResult:
    policies: int = 0
    revisions: int = 0
    rows: int = 0  # every row written, index and alias rows included
    requests: int = 0


class BulkLoader:
    def __init__(self, session: Session, keyspace: str, *, concurrency: int = 64) -> None:
        self.session = session
        self.concurrency = concurrency
        ks = keyspace
        p = self._prepare
        self._tenant = p(f"INSERT INTO {ks}.tenants (tenant, created_at) VALUES (?, ?)")
        self._policy = p(
            f"INSERT INTO {ks}.policies (tenant, policy, base_model, created_at, created_by) "
            "VALUES (?, ?, ?, ?, 'bulk')"
        )
        self._revision = p(
            f"INSERT INTO {ks}.revisions (tenant, policy, revision, latest_revision, digest, "
            "store_uri, base_model, created_at, created_by, metadata) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'bulk', '{}')"
        )
        self._digest = p(
            f"INSERT INTO {ks}.revisions_by_digest (tenant, policy, digest, revision) "
            "VALUES (?, ?, ?, ?)"
        )
        self._alias = p(
            f"INSERT INTO {ks}.aliases (tenant, policy, alias, revision, digest, store_uri, seq, "
            "moved_at, moved_by) VALUES (?, ?, ?, ?, ?, ?, 1, ?, 'bulk')"
        )
        self._history = p(
            f"INSERT INTO {ks}.alias_history (tenant, policy, alias, seq, to_revision, moved_at, "
            "moved_by, reason, kind) VALUES (?, ?, ?, 1, ?, ?, 'bulk', 'bulk load', 'promote')"
        )
        self._tenants_seen: set[str] = set()

    def _prepare(self, cql: str):
        stmt = self.session.prepare(cql)
        stmt.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        return stmt

    def _batch(self, rows: list[tuple]) -> BatchStatement:
        batch = BatchStatement(BatchType.UNLOGGED, consistency_level=ConsistencyLevel.LOCAL_QUORUM)
        for stmt, values in rows:
            batch.add(stmt, values)
        return batch

    def _requests(self, policies: Iterable[BulkPolicy], result: BulkResult) -> Iterator[tuple]:
        by_tenant: dict[str, list[tuple]] = {}
        for bp in policies:
            check_name("tenant", bp.tenant)
            check_name("policy", bp.policy)
            at = utc(bp.created_at)
            t, p, n = bp.tenant, bp.policy, len(bp.revisions)
            if t not in self._tenants_seen:
                self._tenants_seen.add(t)
                result.rows += 1
                yield self._tenant, (t, at)
            # Policy rows share the tenant's partition: batch them per tenant.
            pending = by_tenant.setdefault(t, [])
            pending.append((self._policy, (t, p, bp.base_model, at)))
            if len(pending) >= _BATCH:
                yield self._batch(pending), None
                pending.clear()
            # Every other row of the policy has the partition key (tenant, policy): revisions,
            # digest index, aliases and history go out as one mutation per batch.
            rows = []
            for i, (digest, uri) in enumerate(bp.revisions, start=1):
                check_digest(digest)
                rows.append((self._revision, (t, p, i, n, digest, uri, bp.base_model, at)))
                rows.append((self._digest, (t, p, digest, i)))
            for alias, number in bp.aliases.items():
                check_alias(alias)
                digest, uri = bp.revisions[number - 1]
                rows.append((self._alias, (t, p, alias, number, digest, uri, at)))
                rows.append((self._history, (t, p, alias, number, at)))
            for k in range(0, len(rows), _BATCH):
                yield self._batch(rows[k : k + _BATCH]), None
            result.policies += 1
            result.revisions += n
            result.rows += 1 + len(rows)
        for pending in by_tenant.values():
            if pending:
                yield self._batch(pending), None

    def load(self, policies: Iterable[BulkPolicy]) -> BulkResult:
        result = BulkResult()
        requests = _Counted(self._requests(policies, result))
        outcomes = execute_concurrent(
            self.session, requests, concurrency=self.concurrency, raise_on_first_error=False,
            results_generator=True,
        )  # fmt: skip
        for ok, value in outcomes:
            if not ok:
                raise CatalogUnavailable(
                    f"bulk load failed after {result.policies} policies: {value}; re-run it "
                    "(every write is an idempotent upsert)"
                ) from value
        result.requests = requests.n
        return result


class _Counted:
    def __init__(self, it: Iterator) -> None:
        self.it, self.n = it, 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.it)
        self.n += 1
        return item
