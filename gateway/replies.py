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
import uuid
from typing import Any

import structlog

from gateway.following import CountingRouter
from gateway.metrics import GatewayMetrics
from schemas.envelope import Envelope
from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.topics import topic_for

log = structlog.get_logger()


def _resolve(future: asyncio.Future, env: Envelope[Any]) -> None:
    if not future.done():
        future.set_result(env)


class ReplyRouter(CountingRouter):
    def __init__(self, settings: MintSettings, instance_id: str, metrics: GatewayMetrics) -> None:
        self.settings, self.instance_id, self.metrics = settings, instance_id, metrics
        self.prefix = f"{instance_id}."
        self._marker = self.prefix.encode()
        self._pending: dict[uuid.UUID, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        super().__init__(
            settings,
            topic_for(settings, "infer.results"),
            instance_id,
            "replies",
            route=lambda record: self._route(record.value),
        )

    def start(self) -> None:
        """Position at the end of every partition, then follow. Returns once the positions are
        fixed, so an answer to any request published afterwards is seen."""
        super().start()
        log.info("following engine answers", topic=self.topic, request_prefix=self.prefix)

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
        super()._count(outcome)
        self.metrics.replies.labels(outcome).inc()
