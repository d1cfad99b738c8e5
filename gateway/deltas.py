"""Answers as they are generated: the ``infer.delta`` events of this instance's streamed requests,
and :class:`Answers`, the events of one streamed ask in the order they arrive.

A streamed request names this instance's id in ``stream_to``; the engine publishes its deltas on
``infer.deltas`` keyed by that id, so they all land on one partition
(``streams.topics.partition_for_key``). Each instance follows only that partition, from its end,
without a group (gateway.following.AnswerFollower with ``key``), skips records of other keys that
share it before decoding them, and hands each delta to the request waiting for it by request id.
The whole answer still comes on ``infer.results`` (gateway.replies); the two topics are not
ordered together, so a reader must expect a completion before (or without) some deltas
(gateway.streaming reconciles them).

Cost: an instance reads the deltas of every instance whose id hashes to its partition (with more
instances than partitions, several share one). Adding partitions to ``infer.deltas`` moves keys:
restart the gateways after it, so each follows the partition its deltas now land on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog
from kafka.consumer.fetcher import ConsumerRecord

from gateway.following import CountingRouter
from schemas.envelope import Envelope
from schemas.events import InferCompleted, InferDelta, InferFailed, InferRequested
from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.topics import topic_for

log = structlog.get_logger()
Deliver = Callable[[Envelope[InferDelta]], None]


class DeltaRouter(CountingRouter):
    """Follows this instance's partition of ``infer.deltas`` and delivers each delta of a
    request someone listens to (``listen``) on that listener's event loop. ``start()`` returns
    once the position at the partition's end is fixed: deltas of requests published afterwards
    are seen."""

    def __init__(self, settings: MintSettings, instance_id: str) -> None:
        self.key = instance_id.encode()
        self._listeners: dict[str, tuple[asyncio.AbstractEventLoop, Deliver]] = {}
        super().__init__(
            settings,
            topic_for(settings, "infer.deltas"),
            instance_id,
            "deltas",
            route=self._route,
            key=self.key,
        )

    def listen(self, request_id: str, deliver: Deliver) -> None:
        """Call ``deliver(env)`` on the running loop for each delta of ``request_id``."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._listeners[request_id] = (loop, deliver)

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._listeners.pop(request_id, None)

    def _route(self, record: ConsumerRecord) -> None:
        if record.key != self.key:  # another instance whose id hashes to this partition
            self._count("foreign")
            return
        try:
            env = decode_event(record.value)
        except SchemaError:
            self._count("undecodable")
            return
        if not isinstance(env.payload, InferDelta):
            self._count("undecodable")
            return
        with self._lock:
            listener = self._listeners.get(env.payload.request_id)
        if listener is None:  # its request was answered, cancelled or timed out
            self._count("late")
            return
        loop, deliver = listener
        loop.call_soon_threadsafe(deliver, env)
        self._count("own")


def is_final(env: Envelope[Any]) -> bool:
    return isinstance(env.payload, InferCompleted | InferFailed)


class Answers:
    """The events of one streamed ask (``envs``, one request per prompt), in arrival order:
    ``(k, env)`` with ``k`` the request's position and ``env`` a delta, or its final answer
    (``infer.completed`` / ``infer.failed``, once). One deadline, ``timeout_s`` from now, for
    all of them. ``close()`` cancels the requests not answered yet (``on_cancel``) and stops
    the routing (``on_close``); it is idempotent and needs no event loop."""

    def __init__(
        self,
        envs: list[Envelope[InferRequested]],
        timeout_s: float,
        *,
        on_cancel: Callable[[list[Envelope[InferRequested]]], None],
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self.envs, self.timeout_s = envs, timeout_s
        self.on_cancel, self.on_close = on_cancel, on_close
        self.started = time.perf_counter()
        self.deadline = asyncio.get_running_loop().time() + timeout_s
        self.final: dict[int, Envelope[Any]] = {}
        self.closed = False
        self._queue: asyncio.Queue[tuple[int, Envelope[Any]]] = asyncio.Queue()

    def put(self, k: int, env: Envelope[Any]) -> None:
        """An event of request ``k`` (on the loop's thread). Anything after its final answer,
        or after close, is dropped."""
        if self.closed or k in self.final:
            return
        if is_final(env):
            self.final[k] = env
        self._queue.put_nowait((k, env))

    @property
    def done(self) -> bool:
        return len(self.final) == len(self.envs)

    async def next(self) -> tuple[int, Envelope[Any]]:
        """The next event; TimeoutError once the deadline passed."""
        remaining = self.deadline - asyncio.get_running_loop().time()
        if remaining <= 0 and self._queue.empty():
            raise TimeoutError
        async with asyncio.timeout(max(remaining, 0.0)):
            return await self._queue.get()

    async def first(self) -> list[tuple[int, Envelope[Any]]]:
        """Every event up to the one that makes each request heard from at least once (a delta
        or its answer): what may still turn the ask into an error response before anything is
        sent. TimeoutError at the deadline."""
        got: list[tuple[int, Envelope[Any]]] = []
        heard: set[int] = set()
        while len(heard) < len(self.envs):
            k, env = await self.next()
            got.append((k, env))
            heard.add(k)
        return got

    async def finals(self) -> list[Envelope[Any]]:
        """Each request's final answer, in order (deltas are skipped); TimeoutError at the
        deadline."""
        while not self.done:
            await self.next()
        return [self.final[k] for k in range(len(self.envs))]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        unanswered = [env for k, env in enumerate(self.envs) if k not in self.final]
        try:
            if unanswered:
                self.on_cancel(unanswered)
        finally:
            self.on_close()
