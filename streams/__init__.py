"""Kafka plumbing: topic registry, producers, consumer loops, dead letters, replay.

- ``ensure_topics(settings)``: create the registry's topics (idempotent) before workers start.
- ``EventProducer(settings).publish(envelope)``: send to the type's topic, wait for the ack.
- ``run_consumer(settings, ["export.events"], "group", handler)``: the at-least-once loop with
  retries and dead letters; ``handler(envelope, record)`` must be idempotent on ``event_id``.
- ``run_transactional(...)``: consume-process-produce exactly once (streams.transactional).
"""

from streams.clients import KafkaUnavailable, make_admin, make_consumer, make_producer
from streams.consumer import (
    ConsumerStats,
    Handler,
    RetryPolicy,
    run_consumer,
    run_range,
    stop_on_signals,
)
from streams.exceptions import PublishError, StreamsError, TopicError, TransientError
from streams.producer import EventProducer
from streams.topics import DLQ, POLICY_STATE, TOPICS, ensure_topics, topic_for, topic_for_type

__all__ = [
    "DLQ",
    "POLICY_STATE",
    "TOPICS",
    "ConsumerStats",
    "EventProducer",
    "Handler",
    "KafkaUnavailable",
    "PublishError",
    "RetryPolicy",
    "StreamsError",
    "TopicError",
    "TransientError",
    "ensure_topics",
    "make_admin",
    "make_consumer",
    "make_producer",
    "run_consumer",
    "run_range",
    "stop_on_signals",
    "topic_for",
    "topic_for_type",
]
