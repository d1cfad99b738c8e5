"""The trainer behind Kafka, as the Tinker API sees it: ``train.step.requested`` out on
``train.steps`` (keyed by policy, so one policy's calls keep their order), answers in from
``train.step.results``.

The answers are followed like the engines' (gateway.replies): every partition from its end,
without a consumer group, skipping before decoding every record that lacks this instance's
request-id prefix. Each own answer goes to the futures table by its ``request_id``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol

import structlog

from gateway.errors import Unavailable
from gateway.tinker.futures import FuturesTable
from schemas.envelope import Envelope
from schemas.exceptions import SchemaError
from schemas.registry import decode_event, encode_event
from schemas.settings import MintSettings
from streams.clients import make_producer
from streams.exceptions import TopicError
from streams.follower import Follower
from streams.topics import topic_for

log = structlog.get_logger()


class Trainer(Protocol):
    """Where training calls go (KafkaTrainer, or a fake in unit tests)."""

    @property
    def healthy(self) -> bool: ...
    def start(self, futures: FuturesTable) -> None: ...
    def close(self) -> None: ...
    async def publish(self, env: Envelope[Any]) -> None: ...


def _done(future: asyncio.Future, error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class KafkaTrainer:
    def __init__(
        self, settings: MintSettings, instance_id: str, prefix: str, *, retry_after_s: int = 5
    ) -> None:
        self.settings, self.instance_id, self.retry_after_s = settings, instance_id, retry_after_s
        self.requests = topic_for(settings, "train.steps")
        self.results = topic_for(settings, "train.step.results")
        self._marker = prefix.encode()
        self.producer = make_producer(
            settings, client_id=f"{instance_id}-train-steps", linger_ms=0, max_block_ms=5000
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower: Follower | None = None
        self.counts = {"own": 0, "late": 0, "foreign": 0, "undecodable": 0}

    def start(self, futures: FuturesTable) -> None:
        """Fix the answers' positions at their ends, then follow them (before any call)."""
        self.producer.partitions_for(self.requests)
        follower = Follower(
            self.settings, client_id=f"{self.instance_id}-train-results", fetch_max_wait_ms=100
        )
        tps = follower.partitions(self.results)
        if not tps:
            follower.close()
            raise TopicError(
                f"topic {self.results} has no partitions: create the topics first "
                "(`mint topics --create`)"
            )
        follower.assign(tps, "end")
        self._follower = follower
        self._thread = threading.Thread(
            target=self._run, args=(follower, futures), name="tinker-results", daemon=True
        )
        self._thread.start()
        log.info("following training answers", topic=self.results, partitions=len(tps))

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, follower: Follower, futures: FuturesTable) -> None:
        for records in follower.follow(self._stop, timeout_ms=200, retry_errors=True):
            for record in records:
                try:
                    self._route(record.value, futures)
                except Exception:  # one odd record must not stop the others' answers
                    log.exception("could not route a training answer", offset=record.offset)
                    self.counts["undecodable"] += 1

    def _route(self, value: bytes | None, futures: FuturesTable) -> None:
        if not value or self._marker not in value:
            self.counts["foreign"] += 1
            return
        try:
            payload = decode_event(value).payload
            rid = payload.request_id
        except (SchemaError, AttributeError):
            self.counts["undecodable"] += 1
            return
        outcome = "own" if futures.answer_threadsafe(rid, payload) else "late"
        self.counts[outcome] += 1

    async def publish(self, env: Envelope[Any]) -> None:
        """Send one command and wait for the broker's ack (so calls keep their order)."""
        loop = asyncio.get_running_loop()
        acked = loop.create_future()
        try:
            sent = self.producer.send(self.requests, encode_event(env), env.key)
            sent.add_callback(lambda _meta: loop.call_soon_threadsafe(_done, acked, None))
            sent.add_errback(lambda e: loop.call_soon_threadsafe(_done, acked, e))
            async with asyncio.timeout(10):
                await acked
        except Exception as e:
            raise Unavailable(
                f"the call could not be queued for the trainer ({type(e).__name__}); retry shortly",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from e

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._follower is not None:
            self._follower.close()
        self.producer.close(timeout=5)
