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
    """Raise from a handler to ask for a retry with backoff (e.g. a store or database blip).

    The consumer loop also retries other exceptions; this one just says "expected, not a bug".
    """


__all__ = ["KafkaUnavailable", "PublishError", "StreamsError", "TopicError", "TransientError"]
