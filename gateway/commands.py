"""Serving commands from the gateway (gateway/lifecycle.py) and the controller's answers:
commands out on their topics, ``serving.events`` followed (every partition from its end, no
consumer group) for the answer whose ``causation_id`` is the command's id: ``alias.moved``,
``canary.started`` (a canary command), ``canary.ended`` (a rollback that ends a running
canary), ``revision.tagged`` (a tag command) or ``serving.refused``. The same producer publishes the commands that have no answer
(``policy.configured``, ``feedback.submitted``)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any, Protocol

from gateway.errors import ApiError, Unavailable
from gateway.following import AnswerFollower, send_acked
from schemas.envelope import Envelope
from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings

ANSWERS = (
    "alias.moved",
    "canary.started",
    "canary.ended",
    "revision.tagged",
    "policy.retired",
    "serving.refused",
)


class MoveTimeout(ApiError):
    """504: sent, but the controller did not answer in time (never retried blindly)."""

    status, type, code = 504, "server_error", "controller_timeout"


class Commands(Protocol):
    """Serving commands and their answers (KafkaCommands, or a fake in unit tests)."""

    def start(self) -> None: ...
    def close(self) -> None: ...
    async def publish(self, env: Envelope[Any]) -> None: ...
    async def send(self, env: Envelope[Any], timeout_s: float) -> Envelope[Any]: ...


class KafkaCommands:
    """Publishes serving commands and follows ``serving.events`` (every partition from its end,
    no consumer group, positioned before any command is sent) for the answer whose
    ``causation_id`` is the command's id."""

    def __init__(self, settings: MintSettings, instance_id: str, retry_after_s: int = 5) -> None:
        from streams.topics import topic_for

        self.settings, self.instance_id, self.retry_after_s = settings, instance_id, retry_after_s
        self.events = topic_for(settings, "serving.events")
        self._pending: dict[uuid.UUID, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._lock = threading.Lock()
        self._answers: AnswerFollower | None = None
        self._producer: Any = None

    def start(self) -> None:
        from streams.clients import make_producer
        from streams.topics import ensure_topics

        ensure_topics(
            self.settings, ["serving.commands", "serving.events", "policy.config", "feedback"]
        )
        self._producer = make_producer(
            self.settings, client_id=f"{self.instance_id}-commands", linger_ms=0, max_block_ms=5000
        )
        self._answers = AnswerFollower(
            self.settings,
            self.events,
            client_id=f"{self.instance_id}-serving",
            name="lifecycle-answers",
            route=self._route,
        )
        self._answers.start()

    def _route(self, record: Any) -> None:
        if not self._pending or not record.value:
            return
        try:
            env = decode_event(record.value)
        except SchemaError:
            return
        with self._lock:
            waiting = self._pending.get(env.causation_id) if env.type in ANSWERS else None
        if waiting is not None:
            loop, fut = waiting
            loop.call_soon_threadsafe(lambda f=fut, e=env: f.done() or f.set_result(e))

    async def publish(self, env: Envelope[Any]) -> None:
        """Send ``env`` to its payload's topic and wait for the broker's ack."""
        from streams.topics import topic_for

        try:
            await send_acked(self._producer, topic_for(self.settings, env.payload.topic), env)
        except Exception as e:  # the broker did not take it: nothing was asked
            raise Unavailable(
                f"the command could not be queued ({type(e).__name__}); nothing was sent, "
                "retry shortly",
                code="commands_unavailable",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from e

    async def send(self, env: Envelope[Any], timeout_s: float) -> Envelope[Any]:
        """Publish a serving command and wait for the controller's answer to it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        with self._lock:
            self._pending[env.event_id] = (loop, fut)
        try:
            await self.publish(env)
            try:
                return await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                raise MoveTimeout(
                    f"the controller did not answer within {timeout_s:g} s; the command stays "
                    "queued and is carried out when the controller runs: check the policy's "
                    "aliases (or the revision's tags) before sending it again"
                ) from None
        finally:
            with self._lock:
                self._pending.pop(env.event_id, None)

    def close(self) -> None:
        if self._answers is not None:
            self._answers.close()
        if self._producer is not None:
            self._producer.close(timeout=5)
