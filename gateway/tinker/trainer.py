"""The trainer behind Kafka, as the Tinker API sees it: ``train.step.requested`` out on
``train.steps`` (keyed by policy, so one policy's calls keep their order), answers in from
``train.step.results``.

The answers are followed like the engines' (gateway.replies), without a consumer group, but
every instance reads every answer: the call may have been taken by another instance, which may
be gone, so each answer goes to the futures table by its ``request_id`` and tenant, which
settles it here or records it in the shared rows (gateway.tinker.futures). A starting instance
reads from ``catch_up_s`` ago, so answers given while no instance ran are recorded too.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import structlog

from gateway.errors import Unavailable
from gateway.following import AnswerFollower, send_acked
from gateway.tinker.futures import FuturesTable
from schemas.envelope import Envelope
from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.clients import make_producer
from streams.follower import Since
from streams.topics import topic_for

log = structlog.get_logger()


class Trainer(Protocol):
    """Where training calls go (KafkaTrainer, or a fake in unit tests)."""

    @property
    def healthy(self) -> bool: ...
    def start(self, futures: FuturesTable) -> None: ...
    def close(self) -> None: ...
    async def publish(self, env: Envelope[Any]) -> None: ...


class KafkaTrainer:
    def __init__(
        self,
        settings: MintSettings,
        instance_id: str,
        *,
        retry_after_s: int = 5,
        catch_up_s: float = 300.0,
    ) -> None:
        self.settings, self.instance_id, self.retry_after_s = settings, instance_id, retry_after_s
        self.catch_up_s = catch_up_s
        self.requests = topic_for(settings, "train.steps")
        self.results = topic_for(settings, "train.step.results")
        self.producer = make_producer(
            settings, client_id=f"{instance_id}-train-steps", linger_ms=0, max_block_ms=5000
        )
        self.counts = {"answered": 0, "known": 0, "undecodable": 0}
        self._answers: AnswerFollower | None = None

    def start(self, futures: FuturesTable) -> None:
        """Fix the answers' positions at their ends, then follow them (before any call)."""
        self.producer.partitions_for(self.requests)

        def undecodable(_record) -> None:
            self.counts["undecodable"] += 1

        self._answers = AnswerFollower(
            self.settings,
            self.results,
            client_id=f"{self.instance_id}-train-results",
            name="tinker-results",
            route=lambda record: self._route(record.value, futures),
            on_error=undecodable,
            start=Since(int((time.time() - self.catch_up_s) * 1000)),
        )
        self._answers.start()

    @property
    def healthy(self) -> bool:
        return self._answers is not None and self._answers.alive

    def _route(self, value: bytes | None, futures: FuturesTable) -> None:
        try:
            env = decode_event(value or b"")
            rid = env.payload.request_id
        except (SchemaError, AttributeError):
            self.counts["undecodable"] += 1
            return
        # known: answered before (or no future of any instance: expired, another deployment's)
        answered = futures.answer_threadsafe(rid, env.payload, env.tenant)
        self.counts["answered" if answered else "known"] += 1

    async def publish(self, env: Envelope[Any]) -> None:
        """Send one command and wait for the broker's ack (so calls keep their order)."""
        try:
            await send_acked(self.producer, self.requests, env)
        except Exception as e:
            raise Unavailable(
                f"the call could not be queued for the trainer ({type(e).__name__}); retry shortly",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from e

    def close(self) -> None:
        if self._answers is not None:
            self._answers.close()
        self.producer.close(timeout=5)
