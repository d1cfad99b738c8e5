"""The adapter catalog on Cassandra: schema, repository, projection of lifecycle events.

Usage: ``cluster, session = connect(settings)``; ``migrate(session, settings.keyspace,
settings.keyspace_replication)`` (idempotent); ``repo = CatalogRepository(session,
settings.keyspace)``; ``repo.resolve("acme/math-rl@prod")`` returns a ``Resolved``.
"""

from catalog.cluster import CassandraUnavailable, connect, ensure_keyspace
from catalog.exceptions import (
    AliasConflict,
    AliasNotFound,
    CatalogError,
    CatalogUnavailable,
    Conflict,
    CrossTenantReference,
    InvalidReference,
    MalformedDigest,
    MigrationError,
    NotFound,
    PolicyExists,
    PolicyNotFound,
    PolicyRetired,
    RegistrationInProgress,
    RevisionNotFound,
)
from catalog.migrate import migrate
from catalog.models import Alias, AliasMove, Policy, Resolved, Revision
from catalog.projection import Outcome, apply_event, execute_serving_command
from catalog.refs import Ref, parse_ref
from catalog.repository import CatalogRepository

__all__ = [
    "Alias",
    "AliasConflict",
    "AliasMove",
    "AliasNotFound",
    "CassandraUnavailable",
    "CatalogError",
    "CatalogRepository",
    "CatalogUnavailable",
    "Conflict",
    "CrossTenantReference",
    "InvalidReference",
    "MalformedDigest",
    "MigrationError",
    "NotFound",
    "Outcome",
    "Policy",
    "PolicyExists",
    "PolicyNotFound",
    "PolicyRetired",
    "Ref",
    "RegistrationInProgress",
    "Resolved",
    "Revision",
    "RevisionNotFound",
    "apply_event",
    "connect",
    "ensure_keyspace",
    "execute_serving_command",
    "migrate",
    "parse_ref",
]
