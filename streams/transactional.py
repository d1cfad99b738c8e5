"""Consume-process-produce exactly once, with Kafka transactions.

``process(envelope, record)`` returns the events to publish for one input (pure: no side effects
outside Kafka, since a retried or aborted batch calls it again). For each poll, the outputs, any
dead letters and the input offsets are committed in one transaction, so a ``read_committed``
reader sees each input's outputs exactly once, even when the processor dies mid-transaction
(the next instance with the same ``transactional_id`` aborts what the dead one left open).

    run_transactional(settings, ["eval.results"], "promoter", "promoter-0", decide_promotion)

Use one ``transactional_id`` per processor instance that is stable across restarts (e.g.
``<processor>-<host or ordinal>``). Outputs go to their type's registry topic unless
``output_topic`` (a broker name) is given.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError, ProducerFencedError
from kafka.structs import OffsetAndMetadata

from schemas.envelope import Envelope
from schemas.registry import encode_event
from schemas.settings import MintSettings
from streams.clients import make_consumer, make_producer
from streams.polling import poll_records
from streams.records import ConsumerStats, RecordLoop, RetryPolicy, Stopped
from streams.topics import DLQ, topic_for, topic_for_type

log = structlog.get_logger()

Process = Callable[[Envelope[Any], ConsumerRecord], Iterable[Envelope[Any]]]
Out = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]


def run_transactional(
    settings: MintSettings,
    topics: Iterable[str],
    group_id: str,
    transactional_id: str,
    process: Process,
    *,
    stop: threading.Event | None = None,
    retry: RetryPolicy | None = None,
    max_records: int | None = None,
    idle_timeout_s: float | None = None,
    output_topic: str | None = None,
    group_instance_id: str | None = None,
) -> ConsumerStats:
    """Run until ``stop`` is set, ``max_records`` inputs were committed, or idle for
    ``idle_timeout_s``. Poison inputs and inputs whose ``process`` keeps failing are
    dead-lettered inside the same transaction."""
    names = [topic_for(settings, t) for t in topics]
    stop = stop or threading.Event()
    batch: list[Out] = []  # the current record's outputs or dead letter, for the transaction
    dlq = topic_for(settings, DLQ)

    def handle(env: Envelope[Any], record: ConsumerRecord) -> None:
        batch[:] = [
            (output_topic or topic_for_type(settings, o.type), o.key, encode_event(o), [])
            for o in process(env, record)
        ]

    def sink(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        batch[:] = [(dlq, key, value, headers)]

    # The shared per-record rules: poison at once and a record that keeps failing go to the
    # dead-letter topic (inside this transaction); transient failures are waited out, never
    # dead-lettered.
    loop = RecordLoop(
        settings, group_id, handle, retry or RetryPolicy(), None, stop, dead_letter_sink=sink
    )
    stats = loop.stats

    def outputs_for(record: ConsumerRecord) -> list[Out]:
        batch.clear()
        loop.process(record)
        return list(batch)

    producer = make_producer(
        settings, transactional_id=transactional_id, client_id=transactional_id
    )
    consumer = make_consumer(
        settings,
        group_id=group_id,
        isolation_level="read_committed",
        client_id=group_id,
        session_timeout_ms=10_000,
        # Static membership by transactional id: a restarted instance takes its partitions back.
        group_instance_id=group_instance_id or transactional_id,
    )
    for name in names:  # metadata first, so the first assignment already sees every partition
        consumer.partitions_for_topic(name)
    consumer.subscribe(names)
    try:
        producer.init_transactions()  # fences and aborts a dead predecessor's open transaction
        last_seen = time.monotonic()
        while not stop.is_set():
            if max_records is not None and stats.records >= max_records:
                break
            budget = None if max_records is None else max_records - stats.records
            batches = poll_records(consumer, 200, budget)
            if not batches:
                if not consumer.assignment():  # idle time counts once assigned
                    last_seen = time.monotonic()
                elif idle_timeout_s is not None and time.monotonic() - last_seen > idle_timeout_s:
                    break
                continue
            last_seen = time.monotonic()
            snapshot = (stats.handled, stats.dead_lettered, stats.retries, dict(stats.reasons))
            try:
                _one_transaction(producer, consumer, batches, outputs_for)
            except Stopped:
                with contextlib.suppress(KafkaError):
                    producer.abort_transaction()  # uncommitted: the next instance redoes it
                break
            except ProducerFencedError:
                raise  # another instance took over this transactional_id: stop here
            except KafkaError as e:
                log.warning("transaction aborted, retrying the batch", error=str(e))
                stats.handled, stats.dead_lettered, stats.retries, stats.reasons = snapshot
                with contextlib.suppress(KafkaError):
                    producer.abort_transaction()
                for tp, records in batches.items():
                    consumer.seek(tp, records[0].offset)
    finally:
        consumer.close(autocommit=False)
        producer.close()
    return stats


def _one_transaction(
    producer: Any,
    consumer: Any,
    batches: dict[TopicPartition, list[ConsumerRecord]],
    outputs_for: Callable[[ConsumerRecord], list[Out]],
) -> None:
    producer.begin_transaction()
    offsets = {}
    for tp, records in batches.items():
        for record in records:
            for topic, key, value, headers in outputs_for(record):
                producer.send(topic, value, key, headers=headers)
            offsets[tp] = OffsetAndMetadata(record.offset + 1, "", -1)
    producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
    producer.commit_transaction()
