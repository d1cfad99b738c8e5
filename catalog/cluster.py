"""Cassandra sessions built from the settings."""

from __future__ import annotations

from cassandra import AuthenticationFailed, DriverException
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.policies import DCAwareRoundRobinPolicy

from schemas.settings import MintSettings


class CassandraUnavailable(ConnectionError):
    """No Cassandra node answered at the configured contact points."""


# What the driver raises when the cluster, not the request, is the problem. NoHostAvailable (every
# node down or restarting) is not a DriverException, and is the common case on a one-node cluster.
DRIVER_ERRORS = (DriverException, NoHostAvailable)


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
        auth_provider=PlainTextAuthProvider(settings.cassandra_username,
                                            settings.cassandra_secret())
        if settings.cassandra_username else None,
    )  # fmt: skip
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
