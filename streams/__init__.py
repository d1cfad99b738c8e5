"""Kafka plumbing: topic registry, producers, consumer loops, dead letters, replay.

Delivery is in three parts (streams/README.md walks one request through them): the per-record
rules (``streams.records``), the group consumer (``streams.group``) and group-less reading
(``streams.follower``).

- ``ensure_topics(settings)``: create the registry's topics (idempotent) before workers start.
- ``EventProducer(settings).publish(envelope)``: send to the type's topic, wait for the ack.
- ``run_consumer(settings, ["export.events"], "group", handler)``: the at-least-once loop with
  retries and dead letters; ``handler(envelope, record)`` must be idempotent on ``event_id``.
- ``run_transactional(...)``: consume-process-produce exactly once (streams.transactional).
- ``Follower(settings)``: read without a group: assign, start at the beginning, the end, a time
  (``Since(ms)``) or offsets, then ``read_to`` an end or ``follow`` for ever.
"""

from streams.clients import KafkaUnavailable, make_admin, make_consumer, make_producer
from streams.exceptions import PublishError, StreamsError, TopicError, TransientError
from streams.follower import Follower, Since, run_range
from streams.group import run_consumer
from streams.producer import EventProducer
from streams.records import ConsumerStats, Handler, RetryPolicy, stop_on_signals
from streams.topics import DLQ, POLICY_STATE, TOPICS, ensure_topics, topic_for, topic_for_type

__all__ = [
    "DLQ",
    "POLICY_STATE",
    "TOPICS",
    "ConsumerStats",
    "EventProducer",
    "Follower",
    "Handler",
    "KafkaUnavailable",
    "PublishError",
    "RetryPolicy",
    "Since",
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
