"""How a gateway instance hears back: one follower of an answers topic, and one acked send.

Every answer the gateway waits for (the engines' on ``infer.results``, the trainer's on
``train.step.results``, the controller's on ``serving.events``) is read the same way: every
partition from its end, positioned before anything is asked, without a consumer group (so
instances never split answers among themselves and nothing is committed), on a thread of its
own that hands each record to the owner's ``route``. A read that fails is retried (the client
reconnects by itself) and a record ``route`` cannot take never stops the others. With ``key``,
only the partition that records of that key land on is read (``infer.deltas``: each instance
reads the partition of its own id, gateway.deltas).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import structlog
from kafka.consumer.fetcher import ConsumerRecord

from schemas.envelope import Envelope
from schemas.registry import encode_event
from schemas.settings import MintSettings
from streams.exceptions import TopicError
from streams.follower import Follower, Start
from streams.topics import partition_for_key

log = structlog.get_logger()


class AnswerFollower:
    """Follows ``topic`` from its end (or ``start``) on a thread named ``name``;
    ``route(record)`` per record, ``on_error(record)`` after ``route`` raised (logged here);
    ``key``: only its partition."""

    def __init__(
        self,
        settings: MintSettings,
        topic: str,
        *,
        client_id: str,
        name: str,
        route: Callable[[ConsumerRecord], None],
        on_error: Callable[[ConsumerRecord], None] = lambda _record: None,
        key: bytes | None = None,
        start: Start = "end",
    ) -> None:
        self.settings, self.topic, self.client_id, self.name = settings, topic, client_id, name
        self.route, self.on_error, self.key, self.start_at = route, on_error, key, start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower: Follower | None = None

    def start(self) -> None:
        """Fix the positions at the ends, then follow. Returns once they are fixed, so an
        answer to anything asked afterwards is seen."""
        follower = Follower(self.settings, client_id=self.client_id, fetch_max_wait_ms=100)
        tps = follower.partitions(self.topic)
        if not tps:
            follower.close()
            raise TopicError(
                f"topic {self.topic} has no partitions: create the topics first "
                "(`mint topics --create`)"
            )
        if self.key is not None:  # producers place this key by the default partitioner
            only = partition_for_key(self.key, len(tps))
            tps = [tp for tp in tps if tp.partition == only]
        follower.assign(tps, self.start_at)
        self._follower = follower
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        log.info("following answers", topic=self.topic, partitions=len(tps), thread=self.name)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        assert self._follower is not None
        for records in self._follower.follow(self._stop, timeout_ms=200, retry_errors=True):
            for record in records:
                try:
                    self.route(record)
                except Exception:  # one odd record must not stop the others' answers
                    log.exception(
                        "could not route an answer",
                        topic=self.topic,
                        partition=record.partition,
                        offset=record.offset,
                    )
                    self.on_error(record)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._follower is not None:
            self._follower.close()


class CountingRouter:
    """What the gateway's routers of an answers topic share (gateway.replies, gateway.deltas):
    one :class:`AnswerFollower` handing each record to ``route``, a lock over the owner's
    waiting requests, and ``counts`` of what each record was to this instance (``own``,
    ``late``, ``foreign`` or ``undecodable``; a record ``route`` raised on counts undecodable).
    The follower's client id is ``<instance id>-<what>``, its thread ``gateway-<what>``."""

    def __init__(
        self,
        settings: MintSettings,
        topic: str,
        instance_id: str,
        what: str,
        route: Callable[[ConsumerRecord], None],
        key: bytes | None = None,
    ) -> None:
        self.topic = topic
        self._lock = threading.Lock()
        self.counts = {"own": 0, "late": 0, "foreign": 0, "undecodable": 0}
        self._follower = AnswerFollower(
            settings,
            topic,
            client_id=f"{instance_id}-{what}",
            name=f"gateway-{what}",
            route=route,
            on_error=lambda _record: self._count("undecodable"),
            key=key,
        )

    def start(self) -> None:
        """Fix the positions at the ends, then follow (returns once they are fixed)."""
        self._follower.start()

    @property
    def alive(self) -> bool:
        return self._follower.alive

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def close(self) -> None:
        self._follower.close()


async def send_acked(producer: Any, topic: str, env: Envelope[Any], timeout_s: float = 10) -> None:
    """Send ``env`` to ``topic`` and wait (without blocking the event loop) for the broker's
    ack, so a caller's requests keep their order and a refusal is the caller's error."""
    loop = asyncio.get_running_loop()
    acked = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if not acked.done():
            acked.set_result(None) if error is None else acked.set_exception(error)

    sent = producer.send(topic, encode_event(env), env.key)
    sent.add_callback(lambda _meta: loop.call_soon_threadsafe(settle, None))
    sent.add_errback(lambda e: loop.call_soon_threadsafe(settle, e))
    async with asyncio.timeout(timeout_s):
        await acked
