"""Requests to the engines and their answers back: ``infer.requested`` out (one per prompt, with
its ``n`` choices), ``infer.completed`` / ``infer.failed`` in (gateway.replies), ``infer.delta``
in for streamed requests (gateway.deltas), with one deadline for all; ``infer.cancel`` out for a
request nobody waits for any more (timed out, or its client went away)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from gateway.deltas import Answers, DeltaRouter
from gateway.errors import Unavailable
from gateway.metrics import GatewayMetrics
from gateway.replies import ReplyRouter
from gateway.responses import no_answer, not_queued
from schemas.envelope import Envelope, make_event
from schemas.events import InferCancel, InferRequested
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
        self.instance_id = instance_id
        self.topic = topic_for(settings, "infer.requests")
        self.router = ReplyRouter(settings, instance_id, metrics)
        self.deltas = DeltaRouter(settings, instance_id)
        self.request_prefix = self.router.prefix
        # linger 0: a request is sent at once (the default 5 ms batches a producer's records);
        # max_block 5 s: a send never holds the event loop for kafka-python's default minute.
        self.producer = make_producer(
            settings, client_id=f"{instance_id}-requests", linger_ms=0, max_block_ms=5000
        )

    def start(self) -> None:
        self.producer.partitions_for(self.topic)  # metadata now, not on the 1st send
        self.router.start()
        self.deltas.start()

    @property
    def healthy(self) -> bool:
        return self.router.alive and self.deltas.alive

    def _send(self, env: Envelope[Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        acked = loop.create_future()
        sent = self.producer.send(self.topic, encode_event(env), env.key)
        sent.add_callback(lambda meta: loop.call_soon_threadsafe(_done, acked, meta, None))
        sent.add_errback(lambda e: loop.call_soon_threadsafe(_done, acked, None, e))
        return acked

    async def open(self, envs: list[Envelope[InferRequested]], timeout_s: float) -> Answers:
        """Publish ``envs`` and return their events as they come (deltas of those with
        ``stream_to``, then or meanwhile each one's answer). Unavailable when Kafka does not
        take them in time; the caller closes the result (which cancels what is unanswered)."""
        answers = Answers(
            envs, timeout_s, on_cancel=self.cancel, on_close=lambda: self._forget(envs)
        )
        for k, env in enumerate(envs):
            future = self.router.expect(env.event_id)
            future.add_done_callback(lambda f, k=k: f.cancelled() or answers.put(k, f.result()))
            if env.payload.stream_to is not None:
                self.deltas.listen(env.payload.request_id, lambda d, k=k: answers.put(k, d))
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(self._send(env) for env in envs))
        except TimeoutError:  # not an engine's silence: the request never reached one
            answers.close()
            self.metrics.timeouts.inc()
            log.warning("Kafka did not confirm requests", count=len(envs), timeout_s=timeout_s)
            raise not_queued(timeout_s, self.retry_after_s) from None
        except Exception as e:  # the broker did not confirm: nothing was asked
            answers.close()
            raise Unavailable(
                f"the request could not be queued for the engines ({type(e).__name__}); "
                "retry shortly",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from e
        self.metrics.infer_requests.inc(len(envs))
        return answers

    async def submit(
        self,
        envs: list[Envelope[InferRequested]],
        timeout_s: float,
    ) -> list[Envelope[Any]]:
        """Publish ``envs`` and wait for an answer to each (in order). Unavailable when Kafka
        does not take them or no engine answers within ``timeout_s`` (the requests are then
        cancelled: an engine that holds one frees its slot)."""
        answers = await self.open(envs, timeout_s)
        try:
            got = await answers.finals()
        except TimeoutError:
            self.metrics.timeouts.inc()
            raise no_answer(timeout_s, self.retry_after_s) from None
        finally:
            answers.close()
        self.metrics.engine_seconds.observe(time.perf_counter() - answers.started)
        return got

    def cancel(self, envs: list[Envelope[InferRequested]]) -> None:
        """Tell the engines nobody waits for ``envs`` any more (``infer.cancel`` with each
        request's key, so it follows the request to its engine). Best effort and without
        waiting: an engine that answered already ignores it, and ``expires_at`` still bounds
        a request whose cancel is lost."""
        for env in envs:
            cancel = make_event(
                InferCancel(request_id=env.payload.request_id, request_event_id=env.event_id),
                tenant=env.tenant,
                policy=env.policy,
                producer=f"gateway/{self.instance_id}",
                caused_by=env,
            )
            try:
                sent = self.producer.send(self.topic, encode_event(cancel), cancel.key)
            except Exception as e:  # a full buffer or no metadata: the deadline still holds
                log.warning("cancel not sent", request_id=env.payload.request_id, error=str(e))
                continue
            sent.add_errback(
                lambda e, rid=env.payload.request_id: log.warning(
                    "cancel not sent", request_id=rid, error=f"{type(e).__name__}: {e}"
                )
            )
        log.info("requests cancelled", request_ids=[e.payload.request_id for e in envs])

    def _forget(self, envs: list[Envelope[InferRequested]]) -> None:
        for env in envs:
            self.router.forget(env.event_id)
            self.deltas.forget(env.payload.request_id)

    def close(self) -> None:
        self.router.close()
        self.deltas.close()
        self.producer.close(timeout=5)
