"""Cassandra sessions built from the settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cassandra import (
    AuthenticationFailed,
    ConsistencyLevel,
    DriverException,
    OperationTimedOut,
    Timeout,
    Unauthorized,
    Unavailable,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.connection import ConnectionBusy, ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy
from cassandra.protocol import ErrorMessage, IsBootstrappingErrorMessage, OverloadedErrorMessage
from cassandra.query import BoundStatement, PreparedStatement, SimpleStatement

from catalog.exceptions import CatalogRefused, CatalogUnauthorized, CatalogUnavailable
from schemas.settings import MintSettings


class CassandraUnavailable(CatalogUnavailable):
    """No Cassandra node answered at the configured contact points (at connect: a
    ConnectionError, and transient like every CatalogUnavailable)."""


# Everything the driver raises for a request: its own errors, NoHostAvailable and
# ConnectionException (not DriverExceptions), and server errors it passes on as they came
# (SyntaxException is an ErrorMessage). ``driver_error`` sorts them into the two kinds below.
DRIVER_ERRORS = (
    DriverException,
    NoHostAvailable,
    ConnectionException,
    ConnectionBusy,
    ErrorMessage,
)

# Transient: the cluster, not the request, is the problem (unavailable, timed out, no host,
# connection dropped). NoHostAvailable (every node down or restarting) is the common case on a
# one-node cluster; it stays transient whatever its per-host errors say, because a restarting
# node also fails authentication for a while (system_auth not readable yet).
TRANSIENT_DRIVER_ERRORS = (
    NoHostAvailable,
    Unavailable,
    Timeout,  # ReadTimeout, WriteTimeout
    OperationTimedOut,
    ConnectionException,  # ConnectionShutdown and the like
    ConnectionBusy,
    OverloadedErrorMessage,
    IsBootstrappingErrorMessage,
    ConnectionError,
    TimeoutError,
)


# Protocol v5's CAS_WRITE_UNKNOWN, which the driver passes on as a bare ErrorMessage: a Paxos
# round (an LWT, or a SERIAL read finishing one) was accepted by fewer than a quorum while a
# node restarted. Its outcome is unknown, as after a CAS WriteTimeout: read again and retry.
CAS_WRITE_UNKNOWN = 0x1700


def _transient(error: BaseException) -> bool:
    if isinstance(error, TRANSIENT_DRIVER_ERRORS):
        return True
    return isinstance(error, ErrorMessage) and getattr(error, "code", None) == CAS_WRITE_UNKNOWN


def statement_text(stmt: Any) -> str:
    """The CQL of a statement as passed to ``session.execute``, for error messages."""
    if isinstance(stmt, BoundStatement):
        stmt = stmt.prepared_statement
    if isinstance(stmt, PreparedStatement | SimpleStatement):
        stmt = stmt.query_string
    return " ".join(stmt.split())[:300] if isinstance(stmt, str) else type(stmt).__name__


def driver_error(
    error: BaseException,
    doing: str,
    stmt: Any = None,
    then: str = "the worker retries until it answers",
) -> CatalogUnavailable | CatalogRefused:
    """The catalog error for a driver failure while ``doing`` (e.g. "request on keyspace 'mint'").

    CatalogUnavailable (transient: wait it out) when the cluster is away; otherwise Cassandra
    answered and refused (Unauthorized, InvalidRequest, SyntaxException, ConfigurationException,
    AlreadyExists, ReadFailure...): CatalogUnauthorized or CatalogRefused, which fail loudly
    (a record's dead letter, a worker's exit) instead of stalling a worker forever. ``then``
    says what happens after an outage (who retries)."""
    what = f"{type(error).__name__}: {error}"
    on = f" (statement: {statement_text(stmt)})" if stmt is not None else ""
    if _transient(error):
        return CatalogUnavailable(
            f"Cassandra did not answer a {doing}{on} ({what}); check `mint dev status` or the "
            f"cluster: {then}"
        )
    if isinstance(error, Unauthorized):
        return CatalogUnauthorized(
            f"Cassandra refused a {doing}{on}: the role lacks a grant ({what}). Grant the "
            "permission named above to the worker's role (catalog/roles.py, `mint security "
            "apply`), then replay what was dead-lettered; retrying cannot help"
        )
    return CatalogRefused(
        f"Cassandra refused a {doing}{on} ({what}). The schema is missing or behind (run `mint "
        "catalog migrate`) or the statement is wrong; retrying cannot help"
    )


def connect(settings: MintSettings, keyspace: str | None = None) -> tuple[Cluster, Session]:
    """Open a cluster and session; the caller shuts the cluster down."""
    cluster = Cluster(
        settings.cassandra_contact_points,
        port=settings.cassandra_port,
        execution_profiles={
            EXEC_PROFILE_DEFAULT: ExecutionProfile(
                load_balancing_policy=DCAwareRoundRobinPolicy(), request_timeout=30
            )
        },
        protocol_version=5,
        connect_timeout=10,
        auth_provider=PlainTextAuthProvider(
            settings.cassandra_username, settings.cassandra_secret()
        )
        if settings.cassandra_username
        else None,
    )
    try:
        session = cluster.connect(keyspace)
    except NoHostAvailable as e:
        cluster.shutdown()
        if any(isinstance(err, AuthenticationFailed) for err in e.errors.values()):
            raise CassandraUnavailable(
                f"Cassandra at {settings.cassandra_hosts}:{settings.cassandra_port} refused the "
                f"credentials of role {settings.cassandra_username or '(none)'!r}: set "
                f"MINT_CASSANDRA_USERNAME and MINT_CASSANDRA_PASSWORD(_FILE) ({e})"
            ) from e
        raise CassandraUnavailable(
            f"no Cassandra node at {settings.cassandra_hosts}:{settings.cassandra_port}: start one "
            f"with `mint dev up` or point MINT_CASSANDRA_HOSTS at your cluster ({e})"
        ) from e
    return cluster, session


def ensure_keyspace(session: Session, keyspace: str, replication: str) -> None:
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}")


def prepare(session: Session, cql: str, doing: str) -> PreparedStatement:
    """``session.prepare(cql)`` with its failure sorted by :func:`driver_error`: a statement on a
    table that was never migrated fails at start-up with CatalogRefused naming it."""
    try:
        return session.prepare(cql)
    except DRIVER_ERRORS as e:
        raise driver_error(e, doing, cql) from e


class Statements:
    """How every catalog class prepares and runs its statements, one way: prepared once at
    LOCAL_QUORUM (``serial``: a conditional write, whose Paxos phase runs at LOCAL_SERIAL;
    ``serial_read``: a read that sees every conditional write before it), and a driver failure
    sorted by :func:`driver_error` into CatalogUnavailable or CatalogRefused naming the
    statement. ``about`` names what the statements serve in messages (default: the keyspace);
    ``then`` says who retries after an outage."""

    def __init__(
        self, session: Session, keyspace: str, *, about: str | None = None, then: str = "then retry"
    ) -> None:
        self.session, self.then = session, then
        self._on = f"{about} in keyspace {keyspace!r}" if about else f"keyspace {keyspace!r}"
        self._for = "for" if about else "on"

    def prepare(
        self,
        cql: str,
        *,
        serial: bool = False,
        serial_read: bool = False,
        fetch_size: int | None = None,
    ) -> PreparedStatement:
        stmt = prepare(self.session, cql, f"prepare {self._for} {self._on}")
        stmt.consistency_level = (
            ConsistencyLevel.LOCAL_SERIAL if serial_read else ConsistencyLevel.LOCAL_QUORUM
        )
        if serial:
            stmt.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
        if fetch_size is not None:
            stmt.fetch_size = fetch_size
        return stmt

    def prepare_table(
        self, owner: object, table: Mapping[str, str], *, fields: Mapping[str, str], **kw: Any
    ) -> None:
        """Prepare each ``name: CQL`` of ``table`` (formatted with ``fields``, e.g. the
        keyspace ``ks``) as the attribute ``owner.<name>``, with ``prepare``'s options ``kw``: a
        class keeps its statements as tables, one per kind (reads, conditional writes, …)."""
        for name, cql in table.items():
            setattr(owner, name, self.prepare(cql.format(**fields), **kw))

    def run(self, stmt: Any, params: tuple | list | None = None, **kw: Any) -> Any:
        """``session.execute`` (its ResultSet) with a driver failure as a catalog error."""
        try:
            return self.session.execute(stmt, params or None, **kw)
        except DRIVER_ERRORS as e:
            raise driver_error(e, f"request {self._for} {self._on}", stmt, then=self.then) from e
