"""The group consumer every MinT processor runs (streams' second part; streams/README.md).

    def handle(envelope, record):      # schemas.Envelope, kafka ConsumerRecord
        ...                            # must be idempotent on envelope.event_id

    stop = stop_on_signals()           # streams.records: SIGTERM/SIGINT finish, commit, leave
    run_consumer(settings, ["export.events"], "catalog-projector", handle, stop=stop)

Each record goes through ``streams.records`` (retries, outages waited out, dead letters). Here:

- An offset is committed only after the handler returned (or the record was dead-lettered), so
  a crash re-delivers what was not committed: at-least-once; handlers dedupe on ``event_id``.
  Records of one partition are handled in order, one at a time.
- While an outage is waited out the partitions are paused and the consumer keeps polling: it
  stays in its group (no rebalance storm) and fetches nothing new.
- An owned partition that the client stops reading (kafka-python 3.0.x; streams.stall) gets
  this loop a new consumer after 90 s, as a restart would: it rejoins and reads on from the
  committed offsets.
- A commit the broker cannot take now is tried again at the next poll. A member whose commits
  the group refuses for a minute on end fell out of it without rejoining: it raises
  ``OutOfGroup`` and its process exits, so that a restart rejoins instead of a zombie answering
  what the partitions' new owner answers too.

Topics are registry names (``export.events``). Extra keyword arguments go to ``KafkaConsumer`` (e.g. ``group_instance_id="projector-0"``: static membership,
a restarted instance gets its partitions back without waiting for a rebalance).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from schemas.settings import MintSettings
from streams import health
from streams.clients import make_consumer
from streams.deferred import DeferredWork
from streams.exceptions import KafkaUnavailable
from streams.follower import Follower, Since
from streams.metrics import ConsumerGauges
from streams.polling import MembershipWatch, commit_offsets, poll_records
from streams.producer import EventProducer
from streams.records import (
    ConsumerStats,
    Handler,
    RecordLoop,
    RetryPolicy,
    RunHandler,
    Stopped,
)
from streams.stall import Stall, StallWatch, close_quietly, report
from streams.topics import topic_for

log = structlog.get_logger()


def _reraise(error: Exception) -> bool:
    raise error


class ConsumerLoop:
    """One consumer in one group under the shared rules (see the module's docstring).

    ``run()`` drives it alone (that is :func:`run_consumer`); a host that interleaves several
    consumers in one thread (the serving engine: one vLLM engine, not re-entrant) calls
    ``step()`` on each in turn and passes every loop the same ``keepalive`` (see
    :func:`hold_all`), so that an outage waited out in one loop keeps all of them in their groups.

    ``deferred`` (a streams.deferred.DeferredWork): the policy of a host whose records are
    answered after their poll (work published before the commit, offsets held until an answer,
    redelivered answered requests skipped, revoked partitions' work dropped).

    ``follow_from_ms``: no group; read every partition of ``topics`` from that time on (or from
    the end) with a ``streams.follower.Follower``, and commit nothing: an engine's alias moves.

    ``parallel_keys=N``: a poll's records of different keys run on N threads, each key's in
    order (records are keyed by policy); the poll commits when all of it finished (handlers that
    wait on I/O per record: the projector). ``run_handler(pairs)`` (optional, with it) takes
    each key's records of a poll at once, decoded, for work done better together (a policy's
    consecutive exports in one lightweight transaction); if it raises, that run is handled one
    record at a time.

    ``stall_limit_s``: how long an owned partition may go unread before the loop replaces its
    consumer (streams.stall).
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
        producer: EventProducer | None = None,
        deferred: DeferredWork | None = None,
        keepalive: Callable[[bool], None] | None = None,
        follow_from_ms: int | None = None,
        parallel_keys: int = 1,
        run_handler: RunHandler | None = None,
        stall_limit_s: float = 90.0,
        **consumer_options: Any,
    ) -> None:
        if parallel_keys > 1 and deferred is not None:
            raise ValueError("parallel_keys needs a handler that finishes its record itself")
        if run_handler is not None and parallel_keys < 2:
            raise ValueError("run_handler needs parallel_keys > 1 (runs are built per key)")
        self._run_handler = run_handler
        self.names = [topic_for(settings, t) for t in topics]
        # Handlers of different keys (policies) of one poll run on this many threads; one key's
        # records stay in order on one thread (the projector: each registration waits on LWTs).
        self._pool = (
            ThreadPoolExecutor(parallel_keys, thread_name_prefix=f"{group_id}-key")
            if parallel_keys > 1
            else None
        )
        self.group_id = group_id
        self.stop = stop or threading.Event()
        self.deferred = deferred or DeferredWork()
        self.grouped = follow_from_ms is None
        self._next: dict[TopicPartition, int] = {}  # after the last finished record
        self._committed: dict[TopicPartition, int] = {}
        self._owned: set[TopicPartition] = set()
        self._waited_seen = 0
        self._membership = MembershipWatch(group_id)
        health.serve(settings.metrics_port)
        health.register(group_id)
        self._gauges = ConsumerGauges(group_id)  # lag per partition, held records
        keepalive = keepalive or self.hold_all_partitions
        if self._pool is not None:  # threads waiting out one outage must not poll at once
            keepalive = _serialized(keepalive)
        self._loop = RecordLoop(
            settings,
            group_id,
            handler,
            retry or RetryPolicy(),
            producer,
            self.stop,
            keepalive,
            skip=self._already_answered if self.deferred.checks_answers else None,
        )
        # 10 s (not kafka-python's 45 s) so a crashed worker's partitions move on soon; a worker
        # restarted with the same ``group_instance_id`` (static membership) takes them back.
        options = {"isolation_level": "read_committed", "client_id": group_id, **consumer_options}
        self._settings, self._options = settings, {"session_timeout_ms": 10_000, **options}
        self._stalls = StallWatch(stall_limit_s)
        self._follower: Follower | None = None
        try:
            if self.grouped:
                self.consumer = make_consumer(settings, group_id=group_id, **self._options)
            else:
                options.pop("session_timeout_ms", None)  # no group, no session
                follower = self._follower = Follower(settings, **options)
                self.consumer = follower.consumer
        except BaseException:
            self._loop.close()
            self.deferred.close()
            raise
        for name in self.names:  # metadata first: the first assignment sees every partition
            if not self.consumer.partitions_for_topic(name):
                log.warning("topic has no partitions yet; create it with ensure_topics", topic=name)
        if self.grouped:
            self.consumer.subscribe(self.names, listener=_Listener(self, self.consumer))
        else:
            follower.assign(follower.partitions(*self.names), Since(follow_from_ms))
        log.info("consumer started", topics=self.names, group=group_id if self.grouped else None)

    @property
    def stats(self) -> ConsumerStats:
        return self._loop.stats

    def owns(self, tp: TopicPartition) -> bool:
        return tp in self.consumer.assignment()

    def _maybe_revoked(self, tp: TopicPartition) -> bool:
        # Only a poll can revoke, and a handler polls only while it waits out an outage.
        waited = self.stats.transient_retries
        if waited == self._waited_seen:
            return False
        self._waited_seen = waited
        return not self.owns(tp)

    def _already_answered(self, env: Any, record: ConsumerRecord) -> bool:
        return self.deferred.answered(env, record, self.consumer.partitions_for_topic)

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
        log.info(
            "partitions assigned",
            group=self.group_id,
            partitions=sorted(f"{tp.topic}[{tp.partition}]" for tp in now),
        )

    def _lose(self, tps: set[TopicPartition]) -> None:
        self.deferred.lost(tps)
        for tp in tps:
            self._forget(tp)
        self._owned -= tps

    def _forget(self, tp: TopicPartition) -> None:
        self._next.pop(tp, None)
        self._committed.pop(tp, None)
        self.deferred.forget(tp)

    def _commit_ready(self) -> None:
        """Commit each partition up to its oldest held record (or all it finished)."""
        if not self.grouped:
            return
        offsets = {}
        for tp, nxt in self._next.items():
            target = self.deferred.commit_target(tp, nxt)
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
            for tp, records in poll_records(consumer, 300).items():
                consumer.seek(tp, records[0].offset)  # newly assigned mid-poll: read them later
        else:
            consumer.resume(*consumer.paused())

    def step(self, timeout_ms: int = 200, max_records: int | None = None) -> int:
        """One poll: handle its records, run the deferred work's ``before_commit``, commit.
        Returns how many records it finished. Raises Stopped when stop is set during a wait
        (nothing more is committed)."""
        health.polling(self.group_id, True)
        try:
            batches = poll_records(self.consumer, timeout_ms, max_records)
        finally:
            health.polling(self.group_id, False)
        stalls = self._stalls.check(self.consumer, batches)
        done = self._handle_poll(batches)
        if stalls:  # after this poll's records were handled and committed
            self._replace_consumer(stalls)
        return done

    def _handle_poll(self, batches: dict[TopicPartition, list[ConsumerRecord]]) -> int:
        before = self.stats.records
        if self._pool is not None and batches:
            try:
                self._process_by_key(batches)
            finally:
                self._commit_ready()
            self._gauges.update(self.consumer, self.deferred.held)
            return self.stats.records - before
        finished: dict[TopicPartition, int] = {}
        before_commit = self.deferred.before_commit
        try:
            for tp, records in batches.items():
                for record in records:
                    if self.grouped and self._maybe_revoked(tp):
                        break  # revoked while a handler waited out an outage: the owner has it
                    self._loop.process(record)
                    finished[tp] = record.offset + 1
                    if before_commit is None:
                        self._next[tp] = record.offset + 1
            if before_commit is not None:
                self._loop.attempt(before_commit, _reraise)
                for tp, nxt in finished.items():
                    if self.owns(tp) or not self.grouped:
                        self._next[tp] = nxt
        finally:
            self._commit_ready()
        self._gauges.update(self.consumer, self.deferred.held)  # at most 1/s; no broker call
        return self.stats.records - before

    def _replace_consumer(self, stalls: list[Stall]) -> None:
        """Close the consumer and make a new one, as a restarted worker would: it rejoins the
        group and reads on from the committed offsets (held work is dropped and redelivered;
        answered requests are skipped); without a group it goes on from the same positions.
        If no new one can be made now (the broker is away), the old one stays and is watched
        again."""
        report(self.group_id, stalls)
        self._stalls.reset()
        if self._follower is not None:
            self.consumer = self._follower.renew()
            return
        try:
            fresh = make_consumer(self._settings, group_id=self.group_id, **self._options)
        except KafkaUnavailable as e:
            log.warning("no new consumer for now; keeping the old one", error=str(e))
            return
        close_quietly(self.consumer)
        self._lose(set(self._owned))
        self.consumer = fresh
        fresh.subscribe(self.names, listener=_Listener(self, fresh))

    def _process_by_key(self, batches: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """A poll's records, each key's in order, different keys on the pool's threads: a key
        is a policy, so per-policy order holds; a poll is committed once all of it is done."""
        runs: dict[bytes | None, list[ConsumerRecord]] = {}  # one policy's, of every topic
        for records in batches.values():
            for record in records:
                runs.setdefault(record.key, []).append(record)

        def run(records: list[ConsumerRecord]) -> None:
            done = self._loop.process_run(records, self._run_handler) if self._run_handler else 0
            for record in records[done:]:
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
        self.deferred.close()
        self._loop.close()
        log.info(
            "consumer stopped",
            group=self.group_id,
            handled=self.stats.handled,
            dead_lettered=self.stats.dead_lettered,
            duplicates=self.stats.duplicates,
        )


def _serialized(fn: Callable[[bool], None]) -> Callable[[bool], None]:
    lock = threading.Lock()

    def call(waiting: bool) -> None:
        with lock:
            fn(waiting)

    return call


class _Listener(ConsumerRebalanceListener):
    """The loop's rebalance callbacks for one consumer: those of a consumer the loop replaced
    (closing, it revokes its partitions) no longer touch the loop."""

    def __init__(self, loop: ConsumerLoop, consumer: Any) -> None:
        self.loop, self.consumer = loop, consumer

    def _current(self) -> bool:
        return self.loop.consumer is self.consumer

    def on_partitions_revoked(self, revoked) -> None:
        # What is really lost shows in the next assignment; the host finishes what it has
        # running first (DeferredWork.before_rebalance), before this member rejoins.
        if self._current():
            self.loop.deferred.rebalancing()

    def on_partitions_lost(self, lost) -> None:  # evicted from the group: gone for sure
        if self._current():
            self.loop._lose(set(lost))

    def on_partitions_assigned(self, assigned) -> None:
        if self._current():
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
    max_records: int | None = None,
    idle_timeout_s: float | None = None,
    **loop_options: Any,
) -> ConsumerStats:
    """Consume ``topics`` as member of ``group_id`` until ``stop`` is set (or ``max_records``
    records were finished, or nothing arrived for ``idle_timeout_s``). Returns the counts.
    ``loop_options`` are ConsumerLoop's (stop, retry, producer, deferred, ...)."""
    loop = ConsumerLoop(settings, topics, group_id, handler, **loop_options)
    return loop.run(max_records, idle_timeout_s)
