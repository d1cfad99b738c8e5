"""Errors of the Kafka plumbing. ``KafkaUnavailable`` lives in streams.clients (re-exported)."""

from __future__ import annotations

from streams.clients import KafkaUnavailable


class StreamsError(Exception):
    """Base error of streams/."""


class TopicError(StreamsError, ValueError):
    """A topic name is not in the registry, or the broker refused to create it."""


class PublishError(StreamsError, ConnectionError):
    """The broker did not confirm a send in time; the event may not be durable."""


class TransientError(StreamsError):
    """Raise from a handler when the record is fine but a dependency is not (store, database,
    broker unavailable). The consumer loop retries it with capped backoff for as long as it
    lasts, partitions paused and /readyz saying so, and never dead-letters the record."""


class OutOfGroup(StreamsError):
    """The group has refused this member's commits for too long: it no longer owns what it
    reads (a zombie that could answer what the partitions' new owner answers too). The worker
    exits so that its restart rejoins as itself (static membership)."""


__all__ = [
    "KafkaUnavailable",
    "OutOfGroup",
    "PublishError",
    "StreamsError",
    "TopicError",
    "TransientError",
]
