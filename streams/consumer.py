"""The consumer loop every MinT processor runs.

Usage (a worker's ``main``)::

    from streams.consumer import run_consumer, stop_on_signals

    def handle(envelope, record):      # schemas.Envelope, kafka ConsumerRecord
        ...                            # must be idempotent on envelope.event_id

    stop = stop_on_signals()           # SIGTERM/SIGINT: finish the record, commit, leave
    run_consumer(settings, ["export.events"], "catalog-projector", handle, stop=stop)

Guarantees:

- An offset is committed only after the handler returned (or the record was dead-lettered), so
  a crash re-delivers what was not committed: at-least-once; handlers dedupe on ``event_id``.
- Two kinds of handler failure. *Transient* (:func:`is_transient`: Cassandra, the broker or the
  store unavailable; ``ConnectionError``/``TimeoutError``, ``streams.TransientError``, retriable
  Kafka errors) is retried with capped exponential backoff for as long as it lasts, and never
  dead-lettered: an outage delays work, it does not lose or reject it. Any other exception is
  retried up to ``max_attempts`` times, then the record goes to the dead-letter topic with the
  error (a handler that refuses a record for good raises at once, e.g. a catalog Conflict).
  While an outage is waited out the consumer's partitions are paused and it keeps polling, so
  it stays in its group (no rebalance storm) and fetches nothing new; the gauge
  ``mint_consumer_waiting_out_outage`` is 1 and ``mint_consumer_transient_failures_total``
  counts the attempts (``MINT_METRICS_PORT`` serves them).
- Poison records (not JSON, invalid, unknown type or version) go to the dead-letter topic at once.
  A dead letter keeps the original key and value bytes; ``mint.dlq.*`` headers name the reason,
  the error and the original topic/partition/offset (``schemas.events.DeadLetter``). The offset
  is committed only after the broker confirmed the dead letter: nothing is dropped, and no
  partition is blocked forever.
- Records of one partition are handled in order, one at a time.

Topics are registry names (``export.events``); ``raw_topics`` takes broker names instead. Extra
keyword arguments go to ``KafkaConsumer`` (e.g. ``group_instance_id="projector-0"`` for static
membership: a restarted instance gets its partitions back without waiting for a rebalance).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata
from prometheus_client import Counter, Gauge, start_http_server

from schemas.envelope import Envelope
from schemas.events.dead_letter import DeadLetter
from schemas.exceptions import SchemaError
from schemas.logs import bound_event
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.clients import make_consumer
from streams.exceptions import TransientError
from streams.producer import EventProducer
from streams.topics import DLQ, topic_for

log = structlog.get_logger()

Handler = Callable[[Envelope[Any], ConsumerRecord], None]

RECORDS = Counter("mint_consumer_records", "records finished by a consumer loop",
                  ["group", "outcome"])  # fmt: skip
TRANSIENT = Counter("mint_consumer_transient_failures",
                    "handler failures that were waited out (never dead-lettered)", ["group"])  # fmt: skip
WAITING = Gauge("mint_consumer_waiting_out_outage",
                "1 while the loop waits out a transient failure with its partitions paused",
                ["group"])  # fmt: skip
_metrics_started: set[int] = set()


def serve_metrics(port: int | None) -> None:
    """Serve this process's Prometheus metrics on ``port`` (once per process; None: not)."""
    if port is not None and port not in _metrics_started:
        start_http_server(port)
        _metrics_started.add(port)
        log.info("metrics served", port=port)


def is_transient(error: BaseException) -> bool:
    """A failure that passes by itself (retry it as long as it lasts), not one of the record."""
    if isinstance(error, TransientError | ConnectionError | TimeoutError):
        return True
    return isinstance(error, KafkaError) and bool(error.retriable)


@dataclass
class ConsumerStats:
    handled: int = 0
    dead_lettered: int = 0
    retries: int = 0
    transient_retries: int = 0  # of failures that were not the record's (never dead-lettered)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return self.handled + self.dead_lettered


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))


def dead_letter(
    record: ConsumerRecord,
    reason: str,
    error: BaseException | str,
    group: str,
    attempts: int = 1,
    envelope: Envelope[Any] | None = None,
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """(key, value, headers) of the dead letter for ``record``: original bytes, reason headers."""
    letter = DeadLetter(
        reason=reason,  # type: ignore[arg-type]
        error=f"{type(error).__name__}: {error}"[:4000]
        if isinstance(error, BaseException)
        else str(error)[:4000],  # fmt: skip
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        group=group,
        attempts=attempts,
        event_type=envelope.type if envelope else None,
        event_id=str(envelope.event_id) if envelope else None,
    )
    kept = [(k, v) for k, v in (record.headers or []) if not k.startswith("mint.dlq.")]
    return record.key, record.value, kept + letter.to_headers()


class _Loop:
    """Shared per-record logic of run_consumer and run_range."""

    def __init__(
        self,
        settings: MintSettings,
        group_id: str,
        handler: Handler,
        retry: RetryPolicy,
        producer: EventProducer | None,
        stop: threading.Event,
        keepalive: Callable[[bool], None] | None = None,
    ) -> None:
        self.settings, self.group_id, self.handler, self.retry = settings, group_id, handler, retry
        self.stop = stop
        # keepalive(True) while an outage is waited out (pause and keep polling), (False) after.
        self.keepalive = keepalive or (lambda waiting: None)
        self._own_producer = producer is None
        self.producer = producer or EventProducer(settings, client_id=f"{group_id}-dlq")
        self.dlq = topic_for(settings, DLQ)
        self.stats = ConsumerStats()

    def _to_dlq(
        self, record: ConsumerRecord, reason: str, error: Any, attempts: int, env: Any = None
    ) -> None:
        key, value, headers = dead_letter(record, reason, error, self.group_id, attempts, env)
        self.producer.send_raw(self.dlq, value, key, headers)
        self.stats.dead_lettered += 1
        self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1
        RECORDS.labels(self.group_id, "dead_lettered").inc()
        log.warning("dead-lettered", reason=reason, error=str(error)[:300], topic=record.topic,
                    partition=record.partition, offset=record.offset)  # fmt: skip

    def process(self, record: ConsumerRecord) -> None:
        try:
            env = decode_event(record.value)
        except SchemaError as e:
            self._to_dlq(record, e.reason, e, 1)
            return
        with bound_event(event_id=str(env.event_id), type=env.type, policy=env.policy_id,
                         correlation_id=str(env.correlation_id)):  # fmt: skip
            attempt = outage = 0
            while True:
                try:
                    self.handler(env, record)
                    self.stats.handled += 1
                    RECORDS.labels(self.group_id, "handled").inc()
                    if outage:
                        WAITING.labels(self.group_id).set(0)
                        self.keepalive(False)
                        log.info("transient failure passed", attempts=outage)
                    return
                except Exception as e:
                    if is_transient(e):  # not the record's fault: wait it out, never dead-letter
                        outage += 1
                        self.stats.transient_retries += 1
                        TRANSIENT.labels(self.group_id).inc()
                        WAITING.labels(self.group_id).set(1)
                        delay = self.retry.delay(outage)
                        log.warning("transient failure, retrying until it passes", attempt=outage,
                                    delay_s=delay, error=f"{type(e).__name__}: {e}"[:500])  # fmt: skip
                    else:
                        attempt += 1
                        if attempt >= self.retry.max_attempts:
                            self._to_dlq(record, "handler_failed", e, attempt, env)
                            return
                        self.stats.retries += 1
                        delay = self.retry.delay(attempt)
                        log.warning("handler failed, retrying", attempt=attempt, delay_s=delay,
                                    error=f"{type(e).__name__}: {e}")  # fmt: skip
                    if self._wait(delay, outage > 0):
                        raise _Stopped from None  # leave it uncommitted: redelivered later

    def _wait(self, delay: float, in_outage: bool) -> bool:
        """Sleep ``delay`` (True: stop was asked); during an outage keep the group membership."""
        deadline = time.monotonic() + delay
        while True:
            if in_outage:
                self.keepalive(True)
            left = deadline - time.monotonic()
            if left <= 0:
                return self.stop.is_set()
            if self.stop.wait(min(left, 1.0)):
                return True

    def close(self) -> None:
        if self._own_producer:
            self.producer.close()


class _Stopped(Exception):
    pass


def _commit(consumer: KafkaConsumer, done: dict[TopicPartition, int]) -> None:
    if not done:
        return
    try:
        consumer.commit({tp: OffsetAndMetadata(off + 1, "", -1) for tp, off in done.items()})
    except (CommitFailedError, RebalanceInProgressError) as e:
        # The group moved these partitions on (e.g. a handler outlived max_poll_interval_ms):
        # the new owner gets the records again, and handlers are idempotent on event_id.
        log.warning("offset commit lost to a rebalance; records will be redelivered", error=str(e))


def stop_on_signals(*signals: int) -> threading.Event:
    """An Event set by SIGTERM/SIGINT (or ``signals``): pass it as ``stop=`` from a worker's main
    so the loop finishes the current record, commits, and leaves the group cleanly."""
    import signal as _signal

    stop = threading.Event()
    for sig in signals or (_signal.SIGTERM, _signal.SIGINT):
        _signal.signal(sig, lambda *_: stop.set())
    return stop


def _drain(
    consumer: KafkaConsumer,
    loop: _Loop,
    batches: dict[TopicPartition, list[ConsumerRecord]],
    end: dict[TopicPartition, int] | None = None,
) -> None:
    """Handle one poll's records partition by partition, committing what was finished."""
    done: dict[TopicPartition, int] = {}
    try:
        for tp, records in batches.items():
            for record in records:
                if end is not None and record.offset >= end.get(tp, 0):
                    break
                loop.process(record)
                done[tp] = record.offset
    finally:
        _commit(consumer, done)


def run_consumer(
    settings: MintSettings,
    topics: Iterable[str],
    group_id: str,
    handler: Handler,
    *,
    stop: threading.Event | None = None,
    retry: RetryPolicy | None = None,
    max_records: int | None = None,
    idle_timeout_s: float | None = None,
    raw_topics: bool = False,
    producer: EventProducer | None = None,
    **consumer_options: Any,
) -> ConsumerStats:
    """Consume ``topics`` as member of ``group_id`` until ``stop`` is set (or ``max_records``
    records were finished, or nothing arrived for ``idle_timeout_s``). Returns the counts."""
    names = list(topics) if raw_topics else [topic_for(settings, t) for t in topics]
    stop = stop or threading.Event()
    serve_metrics(settings.metrics_port)
    consumer: KafkaConsumer | None = None

    def keepalive(waiting: bool) -> None:
        # Paused partitions fetch nothing, but poll() keeps the member in the group (heartbeat
        # and max_poll_interval), so an outage does not move partitions around for nothing.
        if waiting:
            consumer.pause(*consumer.assignment())
            # Long enough for a rebalance begun here to finish, so the commit after it holds.
            for tp, records in consumer.poll(timeout_ms=300).items():
                consumer.seek(tp, records[0].offset)  # newly assigned mid-poll: read them later
        else:
            consumer.resume(*consumer.paused())

    loop = _Loop(settings, group_id, handler, retry or RetryPolicy(), producer, stop, keepalive)
    # 10 s (not kafka-python's 45 s) so a crashed worker's partitions move on soon; a worker
    # restarted with the same ``group_instance_id`` (static membership) takes them back at once.
    options = {"isolation_level": "read_committed", "client_id": group_id,
               "session_timeout_ms": 10_000}  # fmt: skip
    options.update(consumer_options)
    consumer = make_consumer(settings, group_id=group_id, **options)
    for name in names:  # metadata first, so the first assignment already sees every partition
        if not consumer.partitions_for_topic(name):
            log.warning("topic has no partitions yet; create it with ensure_topics", topic=name)
    consumer.subscribe(names)
    last_seen = time.monotonic()
    log.info("consumer started", topics=names, group=group_id)
    try:
        while not stop.is_set():
            if max_records is not None and loop.stats.records >= max_records:
                break
            budget = None if max_records is None else max_records - loop.stats.records
            batches = consumer.poll(timeout_ms=200, max_records=budget)
            if batches or not consumer.assignment():  # idle time counts once assigned
                last_seen = time.monotonic()
                _drain(consumer, loop, batches)
            elif idle_timeout_s is not None and time.monotonic() - last_seen > idle_timeout_s:
                break
    except _Stopped:
        pass
    finally:
        consumer.close(autocommit=False)
        loop.close()
    log.info("consumer stopped", group=group_id, handled=loop.stats.handled,
             dead_lettered=loop.stats.dead_lettered)  # fmt: skip
    return loop.stats


def run_range(
    settings: MintSettings,
    start: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
    group_id: str,
    handler: Handler,
    *,
    stop: threading.Event | None = None,
    retry: RetryPolicy | None = None,
    progress: Callable[[int], None] | None = None,
) -> ConsumerStats:
    """Feed the records ``start[tp] <= offset < end[tp]`` to ``handler`` with the same retry and
    dead-letter rules, committing progress under ``group_id`` (replay re-drives use a fresh one)."""
    stop = stop or threading.Event()
    loop = _Loop(settings, group_id, handler, retry or RetryPolicy(), None, stop)
    pending = {tp: off for tp, off in start.items() if off < end.get(tp, 0)}
    consumer = make_consumer(settings, group_id=group_id, isolation_level="read_committed")
    try:
        consumer.assign(list(pending))
        for tp, off in pending.items():
            consumer.seek(tp, off)
        while pending and not stop.is_set():
            batches = consumer.poll(timeout_ms=500)
            before = loop.stats.records
            _drain(consumer, loop, batches, end)
            if progress and loop.stats.records > before:
                progress(loop.stats.records - before)
            for tp in list(pending):
                # position() passes transaction markers too, so this ends even on a marker.
                if consumer.position(tp) >= end[tp]:
                    del pending[tp]
                    consumer.pause(tp)
    except _Stopped:
        pass
    finally:
        consumer.close(autocommit=False)
        loop.close()
    return loop.stats
