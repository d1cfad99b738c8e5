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
  ``mint_consumer_waiting_out_outage`` is 1, ``mint_consumer_transient_failures_total``
  counts the attempts and ``/readyz`` answers 503 (``MINT_METRICS_PORT``, streams.health).
- Poison records (not JSON, invalid, unknown type or version) go to the dead-letter topic at once.
  A dead letter keeps the original key and value bytes; ``mint.dlq.*`` headers name the reason,
  the error and the original topic/partition/offset (``schemas.events.DeadLetter``). The offset
  is committed only after the broker confirmed the dead letter: nothing is dropped, and no
  partition is blocked forever.
- Records of one partition are handled in order, one at a time.
- A commit the broker cannot take now (it is restarting) is tried again at the next poll, never
  fatal. A member whose commits the group refuses for a minute on end has fallen out of the
  group without rejoining: it raises ``OutOfGroup`` and its process exits, so that a restart
  rejoins instead of a zombie answering what the partitions' new owner answers too.

Topics are registry names (``export.events``); ``raw_topics`` takes broker names instead. Extra
keyword arguments go to ``KafkaConsumer`` (e.g. ``group_instance_id="projector-0"`` for static
membership: a restarted instance gets its partitions back without waiting for a rebalance).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from schemas.envelope import Envelope
from schemas.events.dead_letter import DeadLetter
from schemas.exceptions import SchemaError
from schemas.logs import bound_event
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams import health
from streams.answered import AnswerLog
from streams.clients import make_consumer
from streams.exceptions import OutOfGroup, TransientError
from streams.metrics import TRANSIENT, ConsumerGauges, RecordCounters
from streams.producer import EventProducer
from streams.topics import DLQ, topic_for

log = structlog.get_logger()

Handler = Callable[[Envelope[Any], ConsumerRecord], None]
# (key, value, headers) of a dead letter -> delivered (confirmed send, or added to a transaction)
DeadLetterSink = Callable[[bytes | None, bytes | None, list[tuple[str, bytes]]], None]


def serve_metrics(port: int | None) -> None:
    """Serve this process's ``/metrics``, ``/healthz`` and ``/readyz`` (streams.health)."""
    health.serve(port)


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


class RecordLoop:
    """The per-record rules (decode, retry, wait out outages, dead-letter), shared by
    :class:`ConsumerLoop`, :func:`run_range` and ``streams.transactional``."""

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
                if attempt >= self.retry.max_attempts:
                    self._to_dlq(record, "handler_failed", e, attempt, env)
                    return True
                return False

            if not self.attempt(call, give_up):
                return
            if duplicate:
                self._count("duplicates")
                self._counts.inc(record.topic, "duplicate")
                log.info("redelivered request was already answered; skipped", topic=record.topic,
                         partition=record.partition, offset=record.offset)  # fmt: skip
            else:
                self._count("handled")
                self._counts.inc(record.topic, "handled")

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
                        log.warning("transient failure, retrying until it passes", attempt=outage,
                                    delay_s=delay, error=f"{type(e).__name__}: {e}"[:500])  # fmt: skip
                    else:
                        if give_up(e):
                            return False
                        failures += 1
                        self._count("retries")
                        delay = self.retry.delay(failures)
                        log.warning("handler failed, retrying", attempt=failures, delay_s=delay,
                                    error=f"{type(e).__name__}: {e}")  # fmt: skip
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


class Stopped(Exception):
    pass


def _reraise(error: Exception) -> bool:
    raise error


CommitOutcome = Literal["committed", "refused", "deferred"]


def commit_offsets(consumer: KafkaConsumer, offsets: dict[TopicPartition, int]) -> CommitOutcome:
    """Commit ``offsets`` (next offset to read per partition).

    "committed": the broker took them. "refused": the group did not, because this member is not
    (or no longer) in its current generation, e.g. a handler outlived max_poll_interval_ms; the
    partitions' owner gets the records again. "deferred": a rebalance is under way, or the
    broker is away (killed, restarting); the next poll's commit tries again. Neither is an error
    (handlers are idempotent on event_id, answers deduped); anything else propagates."""
    if not offsets:
        return "committed"
    try:
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
        return "committed"
    except RebalanceInProgressError as e:  # this member is rejoining: no verdict on membership
        log.info("offset commit waits for the rebalance under way", error=str(e))
        return "deferred"
    except CommitFailedError as e:
        log.warning("offset commit refused by the group; records will be redelivered",
                    error=str(e))  # fmt: skip
        return "refused"
    except Exception as e:
        if not is_transient(e):
            raise
        # An engine must outlive a broker restart, not crash on it.
        log.warning("offset commit failed for now; retried on the next poll", error=str(e))
        return "deferred"


class MembershipWatch:
    """Turns a member that the group keeps refusing into an error. A refused commit is normal
    once (a rebalance; kafka-python rejoins on the next poll), but commits refused for
    ``limit_s`` with none taken mean this process fell out of its group without rejoining (seen
    under heavy CPU load: heartbeats stopped, fetching went on). Outages ("deferred") say
    nothing about membership."""

    def __init__(self, group_id: str, limit_s: float = 60.0, gap_s: float = 15.0,
                 clock=time.monotonic) -> None:  # fmt: skip
        self.group_id, self.limit_s, self.gap_s, self.clock = group_id, limit_s, gap_s, clock
        self._refused_since: float | None = None
        self._last_refused = 0.0

    def rejoined(self) -> None:
        """An assignment arrived: this member is in the group again."""
        self._refused_since = None

    def note(self, outcome: CommitOutcome) -> None:
        if outcome == "committed":
            self._refused_since = None
        elif outcome == "refused":
            now = self.clock()
            # A streak is refusals one after another (a zombie commits at every poll); one that
            # comes long after the last is a new rebalance, not the same absence.
            if self._refused_since is None or now - self._last_refused > self.gap_s:
                self._refused_since = now
            self._last_refused = now
            if now - self._refused_since > self.limit_s:
                raise OutOfGroup(
                    f"group {self.group_id} has refused every offset commit of this member for "
                    f"{now - self._refused_since:.0f} s: it is out of the group without having "
                    "rejoined. Exiting, so that a restart rejoins (its requests are redelivered "
                    "from the committed offsets)"
                )


def _commit(consumer: KafkaConsumer, done: dict[TopicPartition, int]) -> None:
    commit_offsets(consumer, {tp: off + 1 for tp, off in done.items()})


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
    loop: RecordLoop,
    batches: dict[TopicPartition, list[ConsumerRecord]],
    end: dict[TopicPartition, int],
    commit: bool = True,
) -> None:
    """Handle one range-read poll's records in order, committing what was finished."""
    done: dict[TopicPartition, int] = {}
    try:
        for tp, records in batches.items():
            for record in records:
                if record.offset >= end.get(tp, 0):
                    break
                loop.process(record)
                done[tp] = record.offset
    finally:
        if commit:
            _commit(consumer, done)


class ConsumerLoop:
    """One consumer in one group under the shared rules (see the module's docstring).

    ``run()`` drives it alone (that is :func:`run_consumer`); a host that interleaves several
    consumers in one thread (the serving engine: one vLLM engine, not re-entrant) calls
    ``step()`` on each in turn and passes every loop the same ``keepalive`` (see
    :func:`hold_all`), so that an outage waited out in one loop keeps all of them in their groups.

    ``before_commit`` (optional) runs after each poll's records were handled and before their
    offsets are committed, even for an empty poll: a host that batches work (queue in the
    handler, generate for the whole batch here) publishes its results there, so an offset is
    committed only after what it led to was published. Its transient failures are waited out
    like a handler's; any other failure propagates (the poll stays uncommitted).

    Work that outlives its poll (a request waiting for a cold load): the handler calls
    ``hold(record, key)`` and the host ``release(key)`` once the answer is published. A
    partition's offset is committed only up to its oldest held record, so a crash redelivers
    every request that was not answered. ``answers={"infer.requests": "infer.results"}`` skips a
    redelivered request whose answer is already on the results topic (streams.answered), so the
    records answered after a held one are not answered twice. ``on_revoked(partitions)`` tells
    the host that a rebalance took partitions away for good: it drops their held work (the new
    owner gets it again from the committed offset).

    ``follow_from_ms``: no group; read every partition of ``topics`` from that time on (or from
    the end) and commit nothing: what an engine does to follow alias moves.

    ``parallel_keys=N``: a poll's records of different keys run on N threads, each key's in
    order (records are keyed by policy); the poll commits when all of it finished. For handlers
    that wait on I/O per record, e.g. the projector's compare-and-set writes.
    """

    def __init__(
        self,
        settings: MintSettings,
        topics: Iterable[str],
        group_id: str,
        handler: Handler,
        *,
        stop: threading.Event | None = None,
        retry: RetryPolicy | None = None,
        raw_topics: bool = False,
        producer: EventProducer | None = None,
        before_commit: Callable[[], None] | None = None,
        keepalive: Callable[[bool], None] | None = None,
        answers: dict[str, str] | None = None,
        on_revoked: Callable[[set[TopicPartition]], None] | None = None,
        follow_from_ms: int | None = None,
        parallel_keys: int = 1,
        **consumer_options: Any,
    ) -> None:
        if parallel_keys > 1 and before_commit is not None:
            raise ValueError("parallel_keys needs a handler that finishes its record itself")
        self.names = list(topics) if raw_topics else [topic_for(settings, t) for t in topics]
        # Handlers of different keys (policies) of one poll run on this many threads; one key's
        # records stay in order on one thread (the projector: each registration waits on LWTs).
        self._pool = ThreadPoolExecutor(parallel_keys, thread_name_prefix=f"{group_id}-key") \
            if parallel_keys > 1 else None  # fmt: skip
        self.group_id = group_id
        self.stop = stop or threading.Event()
        self.before_commit = before_commit
        self.on_revoked = on_revoked
        self.grouped = follow_from_ms is None
        self._next: dict[TopicPartition, int] = {}  # after the last finished record
        self._committed: dict[TopicPartition, int] = {}
        self._held: dict[TopicPartition, dict[int, Any]] = {}  # offset -> key
        self._held_keys: dict[Any, list[tuple[TopicPartition, int]]] = {}
        self._answer_logs = {topic_for(settings, req): AnswerLog(settings, topic_for(settings, res))
                             for req, res in (answers or {}).items()}  # fmt: skip
        self._answered: dict[TopicPartition, set[Any]] = {}
        self._owned: set[TopicPartition] = set()
        self._waited_seen = 0
        self._membership = MembershipWatch(group_id)
        serve_metrics(settings.metrics_port)
        health.register(group_id)
        self._gauges = ConsumerGauges(group_id)  # lag per partition, held records
        keepalive = keepalive or self.hold_all_partitions
        if self._pool is not None:  # threads waiting out one outage must not poll at once
            keepalive = _serialized(keepalive)
        self._loop = RecordLoop(settings, group_id, handler, retry or RetryPolicy(), producer,
                                self.stop, keepalive,
                                skip=self._already_answered if self._answer_logs else None)  # fmt: skip
        # 10 s (not kafka-python's 45 s) so a crashed worker's partitions move on soon; a worker
        # restarted with the same ``group_instance_id`` (static membership) takes them back.
        options = {"isolation_level": "read_committed", "client_id": group_id,
                   "session_timeout_ms": 10_000}  # fmt: skip
        options.update(consumer_options)
        try:
            if self.grouped:
                self.consumer = make_consumer(settings, group_id=group_id, **options)
            else:
                options.pop("session_timeout_ms")
                self.consumer = make_consumer(settings, group_id=None, **options)
        except BaseException:
            self._loop.close()
            raise
        for name in self.names:  # metadata first: the first assignment sees every partition
            if not self.consumer.partitions_for_topic(name):
                log.warning("topic has no partitions yet; create it with ensure_topics", topic=name)
        if self.grouped:
            self.consumer.subscribe(self.names, listener=_Listener(self))
        else:
            self._follow(follow_from_ms)
        log.info("consumer started", topics=self.names, group=group_id if self.grouped else None)

    def _follow(self, since_ms: int) -> None:
        c = self.consumer
        tps = [TopicPartition(n, p) for n in self.names for p in c.partitions_for_topic(n) or ()]
        c.assign(tps)
        found = c.offsets_for_times({tp: since_ms for tp in tps}) if tps else {}
        for tp in tps:
            if found.get(tp) is not None:
                c.seek(tp, found[tp].offset)
            else:
                c.seek_to_end(tp)

    @property
    def stats(self) -> ConsumerStats:
        return self._loop.stats

    # Held work and redelivered answers.

    def hold(self, record: ConsumerRecord, key: Any) -> None:
        """Keep ``record``'s offset uncommitted until ``release(key)``."""
        tp = TopicPartition(record.topic, record.partition)
        self._held.setdefault(tp, {})[record.offset] = key
        self._held_keys.setdefault(key, []).append((tp, record.offset))

    def release(self, key: Any) -> bool:
        """The work held under ``key`` is done (its answer was published)."""
        found = self._held_keys.pop(key, None)
        for tp, offset in found or ():
            self._held.get(tp, {}).pop(offset, None)
        return found is not None

    def held(self) -> int:
        return sum(len(v) for v in self._held.values())

    def owns(self, tp: TopicPartition) -> bool:
        return tp in self.consumer.assignment()

    def _maybe_revoked(self, tp: TopicPartition) -> bool:
        # Only a poll can revoke, and a handler polls only while it waits out an outage.
        waited = self.stats.transient_retries
        if waited == self._waited_seen:
            return False
        self._waited_seen = waited
        return not self.owns(tp)

    def _already_answered(self, env: Envelope[Any], record: ConsumerRecord) -> bool:
        answer_log = self._answer_logs.get(record.topic)
        if answer_log is None:
            return False
        tp = TopicPartition(record.topic, record.partition)
        seen = self._answered.get(tp)
        if seen is None:  # the first record of this assignment: what was answered already?
            count = len(self.consumer.partitions_for_topic(record.topic) or ())
            seen = self._answered[tp] = answer_log.since(record.partition, count, record.timestamp)
        return env.event_id in seen

    # Rebalances. kafka-python runs these on its IO thread while this loop's thread waits in
    # poll() or close(), so they may touch the host's state but must not block on the consumer
    # (no commit here: each step already committed what was finished, and a redelivered request
    # that was answered since is skipped by the answers check). Under the eager protocol
    # "revoked" names every partition, yet kafka-python keeps the position of each one that comes
    # back in the new assignment: only a partition that did not come back is lost.

    def _assigned(self, _added: set[TopicPartition]) -> None:
        self._membership.rejoined()
        now = set(self.consumer.assignment())
        self._lose(self._owned - now)
        for tp in now - self._owned:
            self._forget(tp)
        self._owned = now
        log.info("partitions assigned", group=self.group_id,
                 partitions=sorted(f"{tp.topic}[{tp.partition}]" for tp in now))  # fmt: skip

    def _lose(self, tps: set[TopicPartition]) -> None:
        if self.on_revoked is not None and tps:
            self.on_revoked(tps)
        for tp in tps:
            self._forget(tp)
        self._owned -= tps

    def _forget(self, tp: TopicPartition) -> None:
        self._next.pop(tp, None)
        self._committed.pop(tp, None)
        self._answered.pop(tp, None)
        for offset, key in self._held.pop(tp, {}).items():
            places = self._held_keys.get(key, [])
            if (tp, offset) in places:
                places.remove((tp, offset))
            if not places:
                self._held_keys.pop(key, None)

    def _commit_ready(self) -> None:
        """Commit each partition up to its oldest held record (or all it finished)."""
        if not self.grouped:
            return
        offsets = {}
        for tp, nxt in self._next.items():
            held = self._held.get(tp)
            target = min(min(held), nxt) if held else nxt
            if target > self._committed.get(tp, -1):
                offsets[tp] = target
        if not offsets:
            return
        outcome = commit_offsets(self.consumer, offsets)
        if outcome == "committed":
            self._committed.update(offsets)
        self._membership.note(outcome)

    def hold_all_partitions(self, waiting: bool) -> None:
        """Pause (True) or resume (False) this consumer's partitions. Paused partitions fetch
        nothing, but poll() keeps the member in its group (heartbeat and max_poll_interval), so
        an outage does not move partitions around for nothing."""
        consumer = self.consumer
        if waiting:
            consumer.pause(*consumer.assignment())
            # Long enough for a rebalance begun here to finish, so the commit after it holds.
            for tp, records in consumer.poll(timeout_ms=300).items():
                consumer.seek(tp, records[0].offset)  # newly assigned mid-poll: read them later
        else:
            consumer.resume(*consumer.paused())

    def step(self, timeout_ms: int = 200, max_records: int | None = None) -> int:
        """One poll: handle its records, run ``before_commit``, commit. Returns how many records
        it finished. Raises Stopped when stop is set during a wait (nothing more is committed)."""
        batches = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        before = self.stats.records
        if self._pool is not None and batches:
            try:
                self._process_by_key(batches)
            finally:
                self._commit_ready()
            self._gauges.update(self.consumer, self.held)
            return self.stats.records - before
        finished: dict[TopicPartition, int] = {}
        try:
            for tp, records in batches.items():
                for record in records:
                    if self.grouped and self._maybe_revoked(tp):
                        break  # revoked while a handler waited out an outage: the owner has it
                    self._loop.process(record)
                    finished[tp] = record.offset + 1
                    if self.before_commit is None:
                        self._next[tp] = record.offset + 1
            if self.before_commit is not None:
                self._loop.attempt(self.before_commit, _reraise)
                for tp, nxt in finished.items():
                    if self.owns(tp) or not self.grouped:
                        self._next[tp] = nxt
        finally:
            self._commit_ready()
        self._gauges.update(self.consumer, self.held)  # at most once a second; no broker call
        return self.stats.records - before

    def _process_by_key(self, batches: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """A poll's records, each key's in order, different keys on the pool's threads: a key
        is a policy, so per-policy order holds; a poll is committed once all of it is done."""
        runs: dict[bytes | None, list[ConsumerRecord]] = {}  # one policy's, of every topic
        for records in batches.values():
            for record in records:
                runs.setdefault(record.key, []).append(record)

        def run(records: list[ConsumerRecord]) -> None:
            for record in records:
                self._loop.process(record)

        futures = [self._pool.submit(run, records) for records in runs.values()]
        for future in futures:
            future.result()  # re-raises Stopped (or a failure): nothing of this poll commits
        for tp, records in batches.items():
            if not self.grouped or self.owns(tp):
                self._next[tp] = records[-1].offset + 1

    @property
    def assigned(self) -> bool:
        return bool(self.consumer.assignment())

    def run(
        self, max_records: int | None = None, idle_timeout_s: float | None = None
    ) -> ConsumerStats:
        """Step until stop is set, ``max_records`` were finished, or nothing arrived for
        ``idle_timeout_s`` once partitions were assigned; then close."""
        last_seen = time.monotonic()
        try:
            while not self.stop.is_set():
                if max_records is not None and self.stats.records >= max_records:
                    break
                budget = None if max_records is None else max_records - self.stats.records
                if self.step(200, budget) or not self.assigned:
                    last_seen = time.monotonic()  # idle time counts once assigned
                elif idle_timeout_s is not None and time.monotonic() - last_seen > idle_timeout_s:
                    break
        except Stopped:
            pass
        finally:
            self.close()
        return self.stats

    def close(self) -> None:
        self._gauges.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.consumer.close(autocommit=False)
        for answer_log in self._answer_logs.values():
            answer_log.close()
        self._loop.close()
        log.info("consumer stopped", group=self.group_id, handled=self.stats.handled,
                 dead_lettered=self.stats.dead_lettered, duplicates=self.stats.duplicates)  # fmt: skip


def _serialized(fn: Callable[[bool], None]) -> Callable[[bool], None]:
    lock = threading.Lock()

    def call(waiting: bool) -> None:
        with lock:
            fn(waiting)

    return call


class _Listener(ConsumerRebalanceListener):
    def __init__(self, loop: ConsumerLoop) -> None:
        self.loop = loop

    def on_partitions_revoked(self, revoked) -> None:
        pass  # a notification: what is really lost shows in the next assignment

    def on_partitions_lost(self, lost) -> None:  # evicted from the group: gone for sure
        self.loop._lose(set(lost))

    def on_partitions_assigned(self, assigned) -> None:
        self.loop._assigned(set(assigned))


def hold_all(loops: Callable[[], Iterable[ConsumerLoop]]) -> Callable[[bool], None]:
    """A keepalive for loops that share one thread: while one waits out an outage, every one of
    them pauses and keeps polling (a consumer not polled for max_poll_interval leaves its group)."""

    def keepalive(waiting: bool) -> None:
        for loop in loops():
            loop.hold_all_partitions(waiting)

    return keepalive


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
    loop = ConsumerLoop(settings, topics, group_id, handler, stop=stop, retry=retry,
                        raw_topics=raw_topics, producer=producer, **consumer_options)  # fmt: skip
    return loop.run(max_records, idle_timeout_s)


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
    commit: bool = True,
) -> ConsumerStats:
    """Feed the records ``start[tp] <= offset < end[tp]`` to ``handler`` with the same retry and
    dead-letter rules, committing progress under ``group_id`` (replay re-drives use a fresh one;
    ``commit=False``: a read that keeps no position, e.g. an engine's bootstrap)."""
    stop = stop or threading.Event()
    loop = RecordLoop(settings, group_id, handler, retry or RetryPolicy(), None, stop)
    pending = {tp: off for tp, off in start.items() if off < end.get(tp, 0)}
    consumer = make_consumer(settings, group_id=group_id if commit else None,
                             isolation_level="read_committed", client_id=group_id)  # fmt: skip
    try:
        consumer.assign(list(pending))
        for tp, off in pending.items():
            consumer.seek(tp, off)
        while pending and not stop.is_set():
            batches = consumer.poll(timeout_ms=500)
            before = loop.stats.records
            _drain(consumer, loop, batches, end, commit=commit)
            if progress and loop.stats.records > before:
                progress(loop.stats.records - before)
            for tp in list(pending):
                # position() passes transaction markers too, so this ends even on a marker.
                if consumer.position(tp) >= end[tp]:
                    del pending[tp]
                    consumer.pause(tp)
    except Stopped:
        pass
    finally:
        consumer.close(autocommit=False)
        loop.close()
    return loop.stats
