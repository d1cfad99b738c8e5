"""The serving worker: Kafka in, Kafka out, around one engine's ServingCore.

Three consumers in one loop (vLLM's generate is not re-entrant, so one thread drives it):

- ``infer.requests`` in group ``<prefix>-serving``: requests, partitioned by policy;
- ``load.requests`` in group ``<prefix>-engines``: cold loads, shared by all engines of a model;
- ``serving.events`` + ``load.events`` in a group of this engine's own: alias moves (resolution
  cache + prefetch) and loads other engines finished.

Offsets are committed after the results of a poll were published (at-least-once; a result is
keyed by request_id, so consumers dedupe). Undecodable records go to the dead-letter topic.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from kafka import KafkaConsumer

from schemas.events import AdapterLoaded, AliasMoved, InferRequested, LoadFailed, LoadRequested
from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.clients import make_consumer
from streams.consumer import dead_letter
from streams.producer import EventProducer
from streams.topics import DLQ, topic_for
from workers.serving.core import ServingCore

log = structlog.get_logger()


def run_steps(
    step: Callable[[], int], stop: threading.Event | None, idle_timeout_s: float | None
) -> None:
    """Call ``step`` (returns how much it handled) until ``stop`` is set or nothing was handled
    for ``idle_timeout_s``."""
    stop = stop or threading.Event()
    last = time.monotonic()
    while not stop.is_set():
        if step():
            last = time.monotonic()
        elif idle_timeout_s is not None and time.monotonic() - last > idle_timeout_s:
            break


class ServingWorker:
    def __init__(self, settings: MintSettings, core: ServingCore, *, group: str = "serving"):
        self.settings, self.core = settings, core
        self.group = group
        self.producer = EventProducer(settings, client_id=f"serving-{core.engine_id}")
        t = settings.topic
        self._infer = make_consumer(settings, t("infer.requests"),
                                    group_id=f"{settings.topic_prefix}-{group}")  # fmt: skip
        self._loads = make_consumer(settings, t("load.requests"),
                                    group_id=f"{settings.topic_prefix}-engines")  # fmt: skip
        # Its own group: every engine must see every alias move and load event.
        self._events = make_consumer(
            settings, t("serving.events"), t("load.events"),
            group_id=f"{settings.topic_prefix}-engine-{core.engine_id}-{uuid.uuid4().hex[:8]}",
        )  # fmt: skip
        self.dlq = topic_for(settings, DLQ)

    def _poll(self, consumer: KafkaConsumer, timeout_ms: int) -> list[tuple[Any, Any]]:
        batches = consumer.poll(timeout_ms=timeout_ms)
        out = []
        for records in batches.values():
            for rec in records:
                try:
                    out.append((decode_event(rec.value), rec))
                except SchemaError as e:
                    key, value, headers = dead_letter(rec, e.reason, e, self.group)
                    self.producer.send_raw(self.dlq, value, key, headers)
        return out

    def _publish(self, envs: list) -> None:
        envs = envs + self.core.drain_events()
        if envs:
            self.producer.publish_many(envs)

    def step(self, timeout_ms: int = 100) -> int:
        """One round over the three consumers; returns how many records it handled."""
        core, n = self.core, 0
        events = self._poll(self._events, 10)
        for env, _ in events:
            if isinstance(env.payload, AliasMoved):
                self._publish(core.on_alias_moved(env))
            elif isinstance(env.payload, (AdapterLoaded, LoadFailed)):
                self._publish(core.on_load_event(env))
        if events:
            self._events.commit()
        n += len(events)

        reqs = self._poll(self._infer, timeout_ms)
        out = []
        for env, _ in reqs:
            if isinstance(env.payload, InferRequested):
                out += core.on_infer(env)
        out += core.serve()
        self._publish(out)
        if reqs:
            self._infer.commit()
        n += len(reqs)

        loads = self._poll(self._loads, 10 if reqs else 20)
        if loads:
            self._publish(core.on_load_requests(
                [e for e, _ in loads if isinstance(e.payload, LoadRequested)]))  # fmt: skip
            self._loads.commit()
        n += len(loads)
        return n

    def run(self, stop: threading.Event | None = None, idle_timeout_s: float | None = None):
        log.info("serving worker started", engine_id=self.core.engine_id)
        try:
            run_steps(self.step, stop, idle_timeout_s)
        finally:
            self.close()
        return self.core.stats

    def close(self) -> None:
        for c in (self._infer, self._loads, self._events):
            c.close(autocommit=False)
        self.producer.close()
