"""The evaluator as a Kafka worker, alone or sharing one engine with serving and rollout.

``run_evaluator_worker``: the streams consumer loop over ``eval.requests`` (group
``<prefix>-evaluator``); a request that fails twice (unknown suite, unresolvable revision, failed
load) goes to the dead-letter topic.

``EngineHost``: ONE vLLM engine (vLLM's generate is not re-entrant, and a small machine holds one
engine) driven by one thread that interleaves the serving worker's step, rollout requests and
evaluation requests. Each lane commits its offsets only after its results were published
(at-least-once; result ids derive from request ids, so consumers dedupe).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog
from kafka import KafkaConsumer

from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.clients import make_consumer
from streams.consumer import RetryPolicy, dead_letter, run_consumer
from streams.producer import EventProducer
from streams.topics import DLQ, topic_for
from workers.evaluator.core import EvaluatorCore
from workers.serving.worker import run_steps

log = structlog.get_logger()


def evaluator_group(settings: MintSettings) -> str:
    return f"{settings.topic_prefix}-evaluator"


def run_evaluator_worker(
    settings: MintSettings,
    core: EvaluatorCore,
    *,
    stop: threading.Event | None = None,
    idle_timeout_s: float | None = None,
    max_records: int | None = None,
):
    producer = EventProducer(settings, client_id=core.producer_name)

    def handle(env, _record) -> None:
        if env.type == "eval.requested":
            producer.publish(core.run(env))

    try:
        return run_consumer(settings, ["eval.requests"], evaluator_group(settings), handle,
                            stop=stop, idle_timeout_s=idle_timeout_s, max_records=max_records,
                            producer=producer,
                            retry=RetryPolicy(max_attempts=2, backoff_s=0.1))  # fmt: skip
    finally:
        producer.close()


class _Lane:
    """One topic, one group, one handler ``env -> [events]``; failures are dead-lettered."""

    def __init__(self, settings: MintSettings, name: str, group: str,
                 handler: Callable[[Any], list], producer: EventProducer) -> None:  # fmt: skip
        self.name, self.group, self.handler, self.producer = name, group, handler, producer
        self.dlq = topic_for(settings, DLQ)
        # Generating can outlast kafka-python's default poll interval on a busy CPU.
        self.consumer: KafkaConsumer = make_consumer(
            settings, topic_for(settings, name), group_id=group, client_id=group,
            max_poll_interval_ms=30 * 60 * 1000, session_timeout_ms=10_000,
        )  # fmt: skip
        self.handled = 0

    def step(self, timeout_ms: int) -> int:
        batches = self.consumer.poll(timeout_ms=timeout_ms, max_records=4)
        n = 0
        for records in batches.values():
            for rec in records:
                n += 1
                try:
                    env = decode_event(rec.value)
                except SchemaError as e:
                    self.producer.send_raw(self.dlq, *self._letter(rec, e.reason, e))
                    continue
                self._handle(rec, env)
        if n:
            self.consumer.commit()
        return n

    def _handle(self, rec, env) -> None:
        for attempt in (1, 2):
            try:
                self.producer.publish_many(self.handler(env))
                self.handled += 1
                return
            except Exception as e:  # any handler failure: one retry, then dead-letter
                log.warning("lane handler failed", lane=self.name, attempt=attempt,
                            error=f"{type(e).__name__}: {e}")  # fmt: skip
                if attempt == 2:
                    self.producer.send_raw(self.dlq, *self._letter(rec, "handler_failed", e, env))

    def _letter(self, rec, reason, error, env=None):
        key, value, headers = dead_letter(rec, reason, error, self.group, 1, env)
        return value, key, headers

    def close(self) -> None:
        self.consumer.close(autocommit=False)


class EngineHost:
    """Serving, rollout and evaluation on one engine, in one thread."""

    def __init__(self, settings: MintSettings, *, serving: Any = None, rollout: Any = None,
                 evaluator: EvaluatorCore | None = None, engine_id: str = "engine-0") -> None:  # fmt: skip
        self.settings, self.serving = settings, serving
        self.producer = EventProducer(settings, client_id=f"host-{engine_id}")
        self.lanes: list[_Lane] = []
        if rollout is not None:
            self.lanes.append(_Lane(settings, "rollout.requests", f"{settings.topic_prefix}-rollout",
                                    lambda env: [rollout.run(env)] if env.type ==
                                    "rollout.requested" else [], self.producer))  # fmt: skip
        if evaluator is not None:
            self.lanes.append(_Lane(settings, "eval.requests", evaluator_group(settings),
                                    lambda env: [evaluator.run(env)] if env.type ==
                                    "eval.requested" else [], self.producer))  # fmt: skip

    def step(self) -> int:
        n = self.serving.step(timeout_ms=50) if self.serving is not None else 0
        for lane in self.lanes:
            n += lane.step(10 if n else 50)
        return n

    def run(self, stop: threading.Event | None = None, idle_timeout_s: float | None = None):
        log.info("engine host started", lanes=[lane.name for lane in self.lanes],
                 serving=self.serving is not None)  # fmt: skip
        try:
            run_steps(self.step, stop, idle_timeout_s)
        finally:
            self.close()
        return {lane.name: lane.handled for lane in self.lanes}

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()
        if self.serving is not None:
            self.serving.close()
        self.producer.close()
