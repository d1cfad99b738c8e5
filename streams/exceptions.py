"""Errors of the Kafka plumbing."""

from __future__ import annotations

from schemas.exceptions import MintError


class StreamsError(MintError):
    """Base error of streams/."""


class KafkaUnavailable(StreamsError, ConnectionError):
    """No broker answered at the configured bootstrap servers."""


class TopicError(StreamsError, ValueError):
    """A topic name is not in the registry, or the broker refused to create it."""


class PublishError(StreamsError, ConnectionError):
    """The broker did not confirm a send in time; the event may not be durable."""


class TransientError(StreamsError):
    """Raise from a handler when the record is fine but a dependency is not (store, database,
    broker unavailable). The consumer loop retries it with capped backoff for as long as it
    lasts, partitions paused and /readyz saying so, and never dead-letters the record."""


class Refused(StreamsError, ValueError):
    """Raise from a handler to refuse a record by rule (it breaks a rule of the receiver, so it
    would fail the same way every time): the consumer loop dead-letters it at once with reason
    ``refused`` and this message in ``mint.dlq.error``, with no retries. Any ``ValueError`` or
    ``PermissionError`` is taken as a refusal too (see :data:`REFUSALS`)."""


# What the consumer loop dead-letters at once (reason "refused") instead of retrying: errors
# that say the record breaks a rule, which no retry changes. ValueError covers validation
# (pydantic's ValidationError, schemas.SchemaError, trainer BadBatch, catalog InvalidReference
# and AdapterRejected) and catalog.exceptions.CatalogRefused (Cassandra refused the statement:
# InvalidRequest, SyntaxException, ConfigurationException...); PermissionError covers
# CrossTenantReference and CatalogUnauthorized (a missing grant). Transient errors are sorted
# out first (streams.records.is_transient); anything else is unknown and gets the bounded retries.
REFUSALS: tuple[type[BaseException], ...] = (Refused, ValueError, PermissionError)


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` refuses its record for good (dead-letter it at once)."""
    return isinstance(error, REFUSALS)


class OutOfGroup(StreamsError):
    """The group has refused this member's commits for too long: it no longer owns what it
    reads (a zombie that could answer what the partitions' new owner answers too). The worker
    exits so that its restart rejoins as itself (static membership)."""


__all__ = [
    "KafkaUnavailable",
    "OutOfGroup",
    "PublishError",
    "REFUSALS",
    "Refused",
    "StreamsError",
    "TopicError",
    "TransientError",
    "is_refusal",
]
