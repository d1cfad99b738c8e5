"""The per-record rules every MinT reader shares: decode, retry, wait out outages, dead-letter,
and the offset commit that comes after (streams' first part; streams/README.md has the walk).

:class:`RecordLoop` is used by the group consumer (``streams.group.ConsumerLoop``), by range
reads (``streams.follower.run_range``) and by ``streams.transactional``. The rules:

- Three kinds of handler failure. *Transient* (:func:`is_transient`: Cassandra, the broker or
  the store unavailable; ``ConnectionError``/``TimeoutError``, ``streams.TransientError``,
  retriable Kafka errors) is retried with capped exponential backoff for as long as it lasts,
  and never dead-lettered: an outage delays work, it does not lose or reject it. A *refusal*
  (``streams.exceptions.is_refusal``: ``Refused``, any ``ValueError`` or ``PermissionError``,
  e.g. a validation error, ``catalog.CatalogRefused``) goes to the dead-letter topic at once
  with reason ``refused`` and the error. Any other exception is unknown: retried up to
  ``max_attempts`` times, then dead-lettered with reason ``handler_failed``.
  While an outage is waited out the loop calls ``keepalive(True)`` (a group consumer pauses its
  partitions and keeps polling, so it stays in its group and fetches nothing new); the gauge
  ``mint_consumer_waiting_out_outage`` is 1, ``mint_consumer_transient_failures_total`` counts
  the attempts and ``/readyz`` answers 503 (``MINT_METRICS_PORT``, streams.health).
- Poison records (not JSON, invalid, unknown type or version) go to the dead-letter topic at once.
  A dead letter keeps the original key and value bytes; ``mint.dlq.*`` headers name the reason,
  the error and the original topic/partition/offset (``schemas.events.DeadLetter``). A record
  counts as finished only after the broker confirmed its dead letter: nothing is dropped, and no
  partition is blocked forever.
- ``streams.polling``: a poll that meets the broker away polls nothing and tries again
  (:func:`poll_records`); a commit the broker cannot take now (it is restarting, or a rebalance
  is under way) is tried again at the next poll, never fatal (:func:`commit_offsets`);
  :class:`MembershipWatch` turns commits refused for a minute on end into ``OutOfGroup``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError

from schemas.envelope import Envelope
from schemas.events.dead_letter import DeadLetter
from schemas.exceptions import SchemaError
from schemas.logs import bound_event
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams import health
from streams.exceptions import TransientError, is_refusal
from streams.metrics import TRANSIENT, RecordCounters
from streams.producer import EventProducer
from streams.topics import DLQ, topic_for

log = structlog.get_logger()

Handler = Callable[[Envelope[Any], ConsumerRecord], None]
# One key's records of one poll, decoded, in order (ConsumerLoop's ``run_handler``).
RunHandler = Callable[[list[tuple[Envelope[Any], ConsumerRecord]]], None]
# (key, value, headers) of a dead letter -> delivered (confirmed send, or added to a transaction)
DeadLetterSink = Callable[[bytes | None, bytes | None, list[tuple[str, bytes]]], None]


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
    duplicates: int = 0  # redelivered requests that already had an answer (skipped)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return self.handled + self.dead_lettered + self.duplicates


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))


class Stopped(Exception):
    """``stop`` was set while a failure was waited out: the record stays uncommitted."""


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
        else str(error)[:4000],
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


class RecordLoop:
    """The per-record rules (decode, retry, wait out outages, dead-letter), shared by
    ``streams.group.ConsumerLoop``, ``streams.follower.run_range`` and ``streams.transactional``."""

    def __init__(
        self,
        settings: MintSettings,
        group_id: str,
        handler: Handler,
        retry: RetryPolicy,
        producer: EventProducer | None,
        stop: threading.Event,
        keepalive: Callable[[bool], None] | None = None,
        dead_letter_sink: DeadLetterSink | None = None,
        skip: Callable[[Envelope[Any], ConsumerRecord], bool] | None = None,
    ) -> None:
        self.settings, self.group_id, self.handler, self.retry = settings, group_id, handler, retry
        self.stop = stop
        # skip(env, record): True for a redelivered request that was already answered.
        self.skip = skip
        # keepalive(True) while an outage is waited out (pause and keep polling), (False) after.
        self.keepalive = keepalive or (lambda waiting: None)
        self.dlq = topic_for(settings, DLQ)
        # Where dead letters go: confirmed sends by default; a transaction adds them to its batch.
        self._own_producer = producer is None and dead_letter_sink is None
        self.producer = producer
        if dead_letter_sink is None:
            self.producer = producer or EventProducer(settings, client_id=f"{group_id}-dlq")
            dead_letter_sink = self._send_confirmed
        self.sink = dead_letter_sink
        self.stats = ConsumerStats()
        self._stats_lock = threading.Lock()  # records of different keys may run on threads
        self._counts = RecordCounters(group_id)  # mint_consumer_records_total, bound per topic

    def _count(self, name: str) -> None:
        with self._stats_lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _send_confirmed(self, key: bytes | None, value: bytes | None, headers: list) -> None:
        self.producer.send_raw(self.dlq, value, key, headers)  # type: ignore[union-attr]

    def _to_dlq(
        self, record: ConsumerRecord, reason: str, error: Any, attempts: int, env: Any = None
    ) -> None:
        self.sink(*dead_letter(record, reason, error, self.group_id, attempts, env))
        with self._stats_lock:
            self.stats.dead_lettered += 1
            self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1
        self._counts.dead_lettered(record.topic, reason)
        log.warning(
            "dead-lettered",
            reason=reason,
            error=str(error)[:300],
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )

    def process(self, record: ConsumerRecord) -> None:
        try:
            env = decode_event(record.value)
        except SchemaError as e:
            self._to_dlq(record, e.reason, e, 1)
            return
        with bound_event(
            event_id=str(env.event_id),
            type=env.type,
            policy=env.policy_id,
            correlation_id=str(env.correlation_id),
        ):
            attempt = 0
            duplicate = False

            def call() -> None:
                nonlocal duplicate
                duplicate = self.skip is not None and self.skip(env, record)
                if not duplicate:
                    self.handler(env, record)

            def give_up(e: Exception) -> bool:
                nonlocal attempt
                attempt += 1
                if is_refusal(e):  # a rule the record breaks: no retry changes that
                    self._to_dlq(record, "refused", e, attempt, env)
                    return True
                if attempt >= self.retry.max_attempts:
                    self._to_dlq(record, "handler_failed", e, attempt, env)
                    return True
                return False

            if not self.attempt(call, give_up):
                return
            if duplicate:
                self._count("duplicates")
                self._counts.inc(record.topic, "duplicate")
                log.info(
                    "redelivered request was already answered; skipped",
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                )
            else:
                self._count("handled")
                self._counts.inc(record.topic, "handled")

    def process_run(self, records: list[ConsumerRecord], run_handler: RunHandler) -> int:
        """Hand ``records`` (one key's, in order) to ``run_handler`` at once, up to the first
        that does not decode; returns how many from the start it finished. If it raises it
        finished none (it must be idempotent, like every handler): the caller goes on with
        ``process``, one record at a time, which retries, waits out outages, dead-letters."""
        pairs = []
        for record in records:
            try:
                pairs.append((decode_event(record.value), record))
            except SchemaError:
                break
        if len(pairs) < 2:
            return 0
        try:
            run_handler(pairs)
        except Exception as e:
            log.info(
                "a run failed; handling its records one by one",
                records=len(pairs),
                error=f"{type(e).__name__}: {e}"[:300],
            )
            return 0
        for _, record in pairs:
            self._count("handled")
            self._counts.inc(record.topic, "handled")
        return len(pairs)

    def attempt(self, call: Callable[[], None], give_up: Callable[[Exception], bool]) -> bool:
        """Run ``call`` until it succeeds (True), waiting out transient failures for as long as
        they last; after any other failure ``give_up(e)`` says whether to stop trying (False).
        Raises Stopped when ``stop`` is set while waiting: the record stays uncommitted."""
        failures = outage = 0
        try:
            while True:
                try:
                    call()
                    if outage:
                        log.info("transient failure passed", attempts=outage)
                    return True
                except Exception as e:
                    if is_transient(e):  # not the record's fault: wait it out, never dead-letter
                        outage += 1
                        if outage == 1:
                            health.waiting(self.group_id, True)
                        self._count("transient_retries")
                        TRANSIENT.labels(self.group_id).inc()
                        delay = self.retry.delay(outage)
                        log.warning(
                            "transient failure, retrying until it passes",
                            attempt=outage,
                            delay_s=delay,
                            error=f"{type(e).__name__}: {e}"[:500],
                        )
                    else:
                        if give_up(e):
                            return False
                        failures += 1
                        self._count("retries")
                        delay = self.retry.delay(failures)
                        log.warning(
                            "handler failed, retrying",
                            attempt=failures,
                            delay_s=delay,
                            error=f"{type(e).__name__}: {e}",
                        )
                    if self._wait(delay, outage > 0):
                        raise Stopped from None  # leave it uncommitted: redelivered later
        finally:
            if outage:
                health.waiting(self.group_id, False)
                self.keepalive(False)

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
        if self._own_producer and self.producer is not None:
            self.producer.close()


def stop_on_signals(*signals: int) -> threading.Event:
    """An Event set by SIGTERM/SIGINT (or ``signals``): pass it as ``stop=`` from a worker's main
    so the loop finishes the current record, commits, and leaves the group cleanly."""
    import signal as _signal

    stop = threading.Event()
    for sig in signals or (_signal.SIGTERM, _signal.SIGINT):
        _signal.signal(sig, lambda *_: stop.set())
    return stop
