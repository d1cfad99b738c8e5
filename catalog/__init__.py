"""The adapter catalog on Cassandra: schema, repository, projection of lifecycle events."""

from catalog.cluster import CassandraUnavailable, connect, ensure_keyspace

__all__ = ["CassandraUnavailable", "connect", "ensure_keyspace"]
