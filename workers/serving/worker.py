"""The serving worker: Kafka in, Kafka out, around one engine's ServingCore.

Two consumer loops (streams.group.ConsumerLoop: the rules every worker shares) stepped in
turn by one thread; vLLM's asynchronous engine generates on its own thread meanwhile and hands
answers back as requests finish:

- ``infer.requests`` + ``load.requests`` in group ``<prefix>-serving``, range assignment: both
  topics are keyed by policy and have as many partitions, so partition *p* of each goes to the
  same engine. An engine serves a stable share of policies, and the cold loads for them land on
  the engine that waits for them (README: routing).
- ``serving.events`` without a group: alias moves, followed from a minute before start after the
  alias cache was filled from the compacted ``policy.state``.

Handlers queue work in the core; the serving loop's deferred work (streams.deferred) runs it
before each commit (the core's sweep, the poll's loads in demand order, then the submission of
ready requests) and publishes what it led to. ``infer.cancel`` aborts a request. Queued
loads leave their queue only once they ran: an outage in the middle is waited out and the loads
run again after it (a done load is then a hit). A request delivered again with an event id the
core took already (an upstream re-sent it) is skipped without holding its offset: its first
delivery is answered once. A request's offset stays uncommitted until its answer
(``infer.completed`` or ``infer.failed``) is published: a kill -9 redelivers every request still
waiting for a load, and the new owner skips the ones whose answer is already on
``infer.results`` (streams.answered). A catalog or store outage is waited out with every
partition paused, never dead-lettered; undecodable records go to the dead-letter topic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kafka import TopicPartition
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError

from schemas.envelope import Envelope
from schemas.events import (
    AliasMoved,
    CanaryEnded,
    CanaryStarted,
    InferCancel,
    InferCompleted,
    InferFailed,
    InferRequested,
    LoadRequested,
)
from schemas.names import policy_id
from schemas.registry import encode_event
from schemas.settings import MintSettings
from streams.deferred import DeferredWork
from streams.follower import run_range
from streams.group import ConsumerLoop, hold_all
from streams.producer import EventProducer
from streams.records import RetryPolicy, Stopped
from streams.topics import POLICY_STATE, partition_for_key, topic_for, topic_for_type
from workers.serving.core import ServingCore

log = structlog.get_logger()

# Alias moves are followed from this long before the engine started: a move published while the
# engine read policy.state, and not yet projected there, is applied too (in order, per policy).
FOLLOW_OVERLAP_MS = 60_000
# How long a rebalance waits for the requests running in vLLM (max_tokens bounds each one).
REBALANCE_FINISH_S = 60.0


def run_steps(
    step: Callable[[], int], stop: threading.Event | None, idle_timeout_s: float | None
) -> None:
    """Call ``step`` (returns how much it handled) until ``stop`` is set or nothing was handled
    for ``idle_timeout_s``."""
    stop = stop or threading.Event()
    last = time.monotonic()
    try:
        while not stop.is_set():
            if step():
                last = time.monotonic()
            elif idle_timeout_s is not None and time.monotonic() - last > idle_timeout_s:
                break
    except Stopped:  # stop was set while an outage was waited out: nothing more is committed
        pass


def bootstrap_aliases(settings: MintSettings, apply: Callable[[Envelope[Any]], Any]) -> int:
    """Feed every latest alias pointer on the compacted ``policy.state`` to ``apply``."""
    from streams.clients import make_consumer

    topic = topic_for(settings, POLICY_STATE)
    probe = make_consumer(settings, group_id=None, client_id="policy-state-probe")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(probe.partitions_for_topic(topic) or ())]
        start, end = probe.beginning_offsets(tps), probe.end_offsets(tps)
    finally:
        probe.close(autocommit=False)

    def handle(env: Envelope[Any], _record) -> None:
        if isinstance(env.payload, AliasMoved):
            apply(env)

    stats = run_range(settings, start, end, "policy-state-bootstrap", handle, commit=False)
    log.info("alias cache filled from policy.state", aliases=stats.handled)
    return stats.handled


class ServingWorker:
    def __init__(
        self,
        settings: MintSettings,
        core: ServingCore,
        *,
        group: str = "serving",
        stop: threading.Event | None = None,
        instance_id: str | None = None,
    ):
        """``instance_id``: static group membership (the engine id), so a restarted engine gets
        its partitions, and so its warm adapters' traffic, back without a rebalance."""
        self.settings, self.core, self.group = settings, core, group
        self.stop = stop or threading.Event()
        # linger 0: an answer is sent at once (the default 5 ms wait is on every reply's path)
        self.producer = EventProducer(settings, client_id=f"serving-{core.engine_id}", linger_ms=0)
        self._outbox: list[Envelope[Any]] = []
        self._sent: list[tuple[Envelope[Any], Any]] = []  # sent by _emit, not confirmed yet
        self._sent_lock = threading.Lock()  # _emit also runs on the engine's thread
        self._loads_queued: list[tuple[TopicPartition, Envelope[LoadRequested]]] = []
        self._request_partition: dict[Any, TopicPartition] = {}  # held request event id -> tp
        self.loops: list[ConsumerLoop] = []
        # Loops of a host driven by the same thread (workers.evaluator.EngineHost's lanes).
        self.peers: list[ConsumerLoop] = []
        # An outage waited out in one loop pauses all of them: a loop not polled meanwhile
        # would leave its group after max_poll_interval.
        keep = hold_all(lambda: self.loops + self.peers)
        prefix = settings.topic_prefix
        self._infer_topic = topic_for(settings, "infer.requests")
        core.serves = self._serves
        core.emit = self._emit
        core.stream = self._stream
        self._delta_topic = topic_for(settings, "infer.deltas")
        # Requests are answered polls after they were read: held until their answer is out.
        self._deferred = DeferredWork(
            settings,
            before_commit=self._work,
            answers={"infer.requests": "infer.results"},
            on_revoked=self._on_revoked,
            before_rebalance=self._finish_running,
        )

        def loop(topics: list[str], group_id: str, handler, deferred: DeferredWork, **options):
            made = ConsumerLoop(
                settings,
                topics,
                group_id,
                handler,
                stop=self.stop,
                producer=self.producer,
                deferred=deferred,
                keepalive=keep,
                retry=RetryPolicy(max_attempts=3),
                # a host's evaluation wave can keep this loop unpolled longer
                # than kafka-python's default 5 min
                max_poll_interval_ms=30 * 60 * 1000,
                **options,
            )
            self.loops.append(made)
            return made

        try:
            started_ms = int(time.time() * 1000)
            bootstrap_aliases(settings, core.resolver.apply)
            self._events = loop(
                ["serving.events"],
                f"{prefix}-engine-{core.engine_id}",
                self._on_event,
                DeferredWork(before_commit=self._flush),
                follow_from_ms=started_ms - FOLLOW_OVERLAP_MS,
            )
            self._serving = loop(
                ["infer.requests", "load.requests"],
                f"{prefix}-{group}",
                self._on_record,
                self._deferred,
                # co-partitioning: partition p of both topics, one engine
                partition_assignment_strategy=(RangePartitionAssignor,),
                group_instance_id=instance_id,
            )
        except BaseException:
            self.close()
            raise

    # Routing.

    def _serves(self, tenant: str, policy: str) -> bool:
        """Does this engine own the partition that the policy's requests go to?"""
        parts = self._serving.consumer.partitions_for_topic(self._infer_topic) or set()
        if not parts:
            return True
        p = partition_for_key(policy_id(tenant, policy).encode(), len(parts))
        return self._serving.owns(TopicPartition(self._infer_topic, sorted(parts)[p]))

    def _finish_running(self) -> None:
        """A rebalance starts: let the requests running in vLLM finish and publish their answers
        before this engine rejoins, so a partition's new owner finds them answered (the waves
        finished before each poll the same way). Those past the wait are dropped later with
        their partition (aborted, answered by the new owner)."""
        if self.core.flights.wait_idle(timeout_s=REBALANCE_FINISH_S):
            log.info("running requests finished before the rebalance")
        else:
            log.warning("requests still running at the rebalance", running=self.core.in_flight)
        self._flush()

    def _on_revoked(self, tps: set[TopicPartition]) -> None:
        gone = {eid for eid, tp in self._request_partition.items() if tp in tps}
        dropped = self.core.drop(gone)
        for eid in gone:
            del self._request_partition[eid]
        self._loads_queued = [(tp, env) for tp, env in self._loads_queued if tp not in tps]
        log.info(
            "partitions revoked; their waiting requests go to the new owner",
            partitions=len(tps),
            dropped=dropped,
        )

    # Handlers (one record each) and the work each poll runs before its commit.

    def _on_event(self, env: Envelope[Any], _record) -> None:
        if isinstance(env.payload, AliasMoved):
            self._outbox += self.core.on_alias_moved(env)
        elif isinstance(env.payload, (CanaryStarted, CanaryEnded)):
            self._outbox += self.core.on_canary(env)

    def _on_record(self, env: Envelope[Any], record) -> None:
        tp = TopicPartition(record.topic, record.partition)
        if isinstance(env.payload, InferCancel):  # nothing to hold: acted on at once
            self._outbox += self.core.cancel(env)
        elif isinstance(env.payload, InferRequested):
            if self.core.seen(env.event_id):  # delivered again: answered once, nothing held
                self.core.on_infer(env)  # (counts it)
                return
            out = self.core.on_infer(env)  # raises only an outage, before taking the request
            self._deferred.hold(record, env.event_id)  # committed once answered
            self._request_partition[env.event_id] = tp
            self._outbox += out
        elif isinstance(env.payload, LoadRequested):
            self._loads_queued.append((tp, env))

    def _work(self) -> None:
        # (the core hands most of its output to _emit as it goes; this confirms the rest)
        self._outbox += self.core.sweep()
        if self._loads_queued:
            # Emptied only after they ran: an outage raised in the middle keeps them queued.
            left = self.core.on_load_requests([env for _, env in self._loads_queued])
            self._loads_queued = []
            self._outbox += left
        left = self.core.serve()
        self._outbox += left
        self._flush()

    def _emit(self, events: list[Envelope[Any]]) -> None:
        """Send answers (or a load's events) as soon as the core has them, without waiting for
        the broker: an answer leaves the moment vLLM finished its request (this runs on the
        engine's thread then). ``_flush`` confirms them, and only then releases their requests'
        offsets."""
        for env in events:
            try:
                sent = self.producer.send_async(
                    topic_for_type(self.settings, env.type), encode_event(env), env.key
                )
            except Exception:  # e.g. the send buffer is full: _flush publishes it
                sent = None
            with self._sent_lock:
                self._sent.append((env, sent))

    def _stream(self, delta: Envelope[Any], key: str) -> None:
        """(engine thread) An infer.delta, keyed by its reader: best effort, never confirmed
        (the completion carries the whole text)."""
        try:
            self.producer.send_async(self._delta_topic, encode_event(delta), key.encode())
        except Exception as e:  # a lost delta is filled in from the completion by its reader
            log.debug("delta not sent", error=str(e)[:200])

    def _flush(self) -> None:
        """Confirm what ``_emit`` sent and publish what the handlers produced; a confirmed answer
        releases its request's offset. What failed is sent again (by the retry, if this raises;
        consumers dedupe on event_id)."""
        self._outbox += self.core.drain_events()
        with self._sent_lock:
            sent, self._sent = self._sent, []
        for env, future in sent:
            try:
                if future is None:
                    raise KafkaError("not sent")
                future.get(timeout=30)
            except KafkaError:
                self._outbox.append(env)
            else:
                self._answered(env)
        if not self._outbox:
            return
        self.producer.publish_many(self._outbox)
        for env in self._outbox:
            self._answered(env)
        self._outbox.clear()  # in place: a caller may hold this list (``self._outbox += f()``)

    def _answered(self, env: Envelope[Any]) -> None:
        if isinstance(env.payload, InferCompleted | InferFailed):
            self._deferred.release(env.causation_id)
            self._request_partition.pop(env.causation_id, None)

    def step(self, timeout_ms: int = 100) -> int:
        """One round over the loops; returns how many records it finished, plus one while
        requests run in the engine (a worker that still generates is not idle)."""
        busy = 1 if self.core.in_flight else 0
        return self._events.step(10) + self._serving.step(timeout_ms) + busy

    @property
    def waiting(self) -> int:
        """Requests received and not answered yet (their offsets are held)."""
        return self._deferred.held()

    def run(self, idle_timeout_s: float | None = None):
        """Step until ``stop`` (given to the constructor) is set, or idle for ``idle_timeout_s``."""
        log.info("serving worker started", engine_id=self.core.engine_id)
        try:
            run_steps(self.step, self.stop, idle_timeout_s)
        finally:
            self.close()
        return self.core.stats

    def close(self) -> None:
        for made in self.loops:
            made.close()
        self.loops = []
        self.producer.close()
