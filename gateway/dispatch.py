"""Requests to the engines and their answers back: ``infer.requested`` out (one per choice),
``infer.completed`` / ``infer.failed`` in (gateway.replies), with one deadline for both."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from gateway.errors import Unavailable
from gateway.metrics import GatewayMetrics
from gateway.replies import ReplyRouter
from schemas.envelope import Envelope
from schemas.events import InferRequested
from schemas.registry import encode_event
from schemas.settings import MintSettings
from streams.clients import make_producer
from streams.topics import topic_for

log = structlog.get_logger()


def _done(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class KafkaEngines:
    """The engines behind Kafka, as seen by one gateway instance."""

    def __init__(
        self,
        settings: MintSettings,
        instance_id: str,
        metrics: GatewayMetrics,
        *,
        retry_after_s: int = 5,
    ) -> None:
        self.settings, self.metrics, self.retry_after_s = settings, metrics, retry_after_s
        self.topic = topic_for(settings, "infer.requests")
        self.router = ReplyRouter(settings, instance_id, metrics)
        self.request_prefix = self.router.prefix
        # linger 0: a request is sent at once (the default 5 ms batches a producer's records);
        # max_block 5 s: a send never holds the event loop for kafka-python's default minute.
        self.producer = make_producer(
            settings, client_id=f"{instance_id}-requests", linger_ms=0, max_block_ms=5000
        )

    def start(self) -> None:
        self.producer.partitions_for(self.topic)  # metadata now, not on the 1st send
        self.router.start()

    @property
    def healthy(self) -> bool:
        return self.router.alive

    def _send(self, env: Envelope[Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        acked = loop.create_future()
        sent = self.producer.send(self.topic, encode_event(env), env.key)
        sent.add_callback(lambda meta: loop.call_soon_threadsafe(_done, acked, meta, None))
        sent.add_errback(lambda e: loop.call_soon_threadsafe(_done, acked, None, e))
        return acked

    async def submit(
        self,
        envs: list[Envelope[InferRequested]],
        timeout_s: float,
    ) -> list[Envelope[Any]]:
        """Publish ``envs`` and wait for an answer to each (in order). Unavailable when Kafka
        does not take them or no engine answers within ``timeout_s``."""
        answers = [self.router.expect(env.event_id) for env in envs]
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    await asyncio.gather(*(self._send(env) for env in envs))
                except Exception as e:  # the broker did not confirm: nothing was asked
                    raise Unavailable(
                        f"the request could not be queued for the engines ({type(e).__name__}); "
                        "retry shortly",
                        headers={"Retry-After": str(self.retry_after_s)},
                    ) from e
                self.metrics.infer_requests.inc(len(envs))
                got = list(await asyncio.gather(*answers))
        except TimeoutError:
            self.metrics.timeouts.inc()
            raise Unavailable(
                f"no engine answered within {timeout_s:g} s; the engines may be starting, "
                "overloaded or down: retry later",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from None
        finally:
            for env in envs:
                self.router.forget(env.event_id)
        self.metrics.engine_seconds.observe(time.perf_counter() - t0)
        return got

    def close(self) -> None:
        self.router.close()
        self.producer.close(timeout=5)
