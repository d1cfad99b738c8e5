"""Getting only this instance's answers back from ``infer.results``.

Engines answer every ``infer.requested`` exactly once on ``infer.results`` (key tenant/policy,
``causation_id`` = the request's event id). Each gateway instance follows every partition of
that topic from its end, without a consumer group (so instances never split the answers among
themselves, and nothing is committed), and completes only the futures of requests it published:
its request ids start with ``<instance id>.``, and a record whose bytes lack that marker is
skipped before it is decoded. An instance's own answer is matched by ``causation_id``; one that
nobody waits for any more (the request timed out) is counted as late.

Cost at scale: every instance reads every answer, so the bytes fetched grow with instances ×
answers (a prefix scan per record, a decode only for its own). Past a few dozen instances or a
few thousand answers per second, give each instance its own reply partition or topic (the engine
would publish to the partition a request names) instead.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import structlog

from gateway.metrics import GatewayMetrics
from schemas.envelope import Envelope
from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.exceptions import TopicError
from streams.follower import Follower
from streams.topics import topic_for

log = structlog.get_logger()


def _resolve(future: asyncio.Future, env: Envelope[Any]) -> None:
    if not future.done():
        future.set_result(env)


class ReplyRouter:
    def __init__(self, settings: MintSettings, instance_id: str, metrics: GatewayMetrics) -> None:
        self.settings, self.instance_id, self.metrics = settings, instance_id, metrics
        self.topic = topic_for(settings, "infer.results")
        self.prefix = f"{instance_id}."
        self._marker = self.prefix.encode()
        self._pending: dict[uuid.UUID, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower: Follower | None = None
        self.counts = {"own": 0, "late": 0, "foreign": 0, "undecodable": 0}

    def start(self) -> None:
        """Position at the end of every partition, then follow. Returns once the positions are
        fixed, so an answer to any request published afterwards is seen."""
        follower = Follower(
            self.settings, client_id=f"{self.instance_id}-replies", fetch_max_wait_ms=100
        )
        tps = follower.partitions(self.topic)
        if not tps:
            follower.close()
            raise TopicError(
                f"topic {self.topic} has no partitions: create the topics first "
                "(`mint topics --create`)"
            )
        follower.assign(tps, "end")  # fixed now, before any request is published
        self._follower = follower
        self._thread = threading.Thread(
            target=self._run, args=(follower,), name="gateway-replies", daemon=True
        )
        self._thread.start()
        log.info(
            "following answers", topic=self.topic, partitions=len(tps), request_prefix=self.prefix
        )

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def expect(self, event_id: uuid.UUID) -> asyncio.Future:
        """A future for the answer to the request ``event_id`` (register before publishing)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._pending[event_id] = (loop, future)
            self.metrics.pending.set(len(self._pending))
        return future

    def forget(self, event_id: uuid.UUID) -> None:
        with self._lock:
            self._pending.pop(event_id, None)
            self.metrics.pending.set(len(self._pending))

    def _run(self, follower: Follower) -> None:
        # A failed read is retried (the client reconnects by itself): keep following.
        for records in follower.follow(self._stop, timeout_ms=200, retry_errors=True):
            for record in records:
                try:
                    self._route(record.value)
                except Exception:  # one odd record must not stop the answers of all
                    log.exception(
                        "could not route an answer",
                        offset=record.offset,
                        partition=record.partition,
                    )
                    self._count("undecodable")

    def _route(self, value: bytes | None) -> None:
        if not value or self._marker not in value:
            self._count("foreign")
            return
        try:
            env = decode_event(value)
            rid = env.payload.request_id
        except (SchemaError, AttributeError):
            self._count("undecodable")
            return
        if not rid.startswith(self.prefix):  # the marker was elsewhere in the record
            self._count("foreign")
            return
        with self._lock:
            waiting = self._pending.pop(env.causation_id, None)
            self.metrics.pending.set(len(self._pending))
        if waiting is None:
            self._count("late")
            return
        loop, future = waiting
        loop.call_soon_threadsafe(_resolve, future, env)
        self._count("own")

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        self.metrics.replies.labels(outcome).inc()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._follower is not None:
            self._follower.close()
