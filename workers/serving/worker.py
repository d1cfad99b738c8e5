"""The serving worker: Kafka in, Kafka out, around one engine's ServingCore.

Three consumer loops (streams.consumer.ConsumerLoop: the rules every worker shares) stepped in
turn by one thread, since vLLM's generate is not re-entrant:

- ``infer.requests`` in group ``<prefix>-serving``: requests, partitioned by policy;
- ``load.requests`` in group ``<prefix>-engines``: cold loads, shared by all engines of a model;
- ``serving.events`` + ``load.events`` in a group of this engine's own: alias moves (resolution
  cache + prefetch) and loads other engines finished.

Handlers queue work in the core; each loop's ``before_commit`` runs it (a generation wave, the
poll's loads) and publishes what it led to, so an offset is committed only after its results
were published (at-least-once; a result is keyed by request_id, so consumers dedupe). A catalog
or store outage is waited out with every partition paused, never dead-lettered; undecodable
records go to the dead-letter topic at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog

from schemas.envelope import Envelope
from schemas.events import AdapterLoaded, AliasMoved, InferRequested, LoadFailed, LoadRequested
from schemas.settings import MintSettings
from streams.consumer import ConsumerLoop, RetryPolicy, Stopped, hold_all
from streams.producer import EventProducer
from workers.serving.core import ServingCore

log = structlog.get_logger()


def run_steps(
    step: Callable[[], int], stop: threading.Event | None, idle_timeout_s: float | None
) -> None:
    """Call ``step`` (returns how much it handled) until ``stop`` is set or nothing was handled
    for ``idle_timeout_s``."""
    stop = stop or threading.Event()
    last = time.monotonic()
    try:
        while not stop.is_set():
            if step():
                last = time.monotonic()
            elif idle_timeout_s is not None and time.monotonic() - last > idle_timeout_s:
                break
    except Stopped:  # stop was set while an outage was waited out: nothing more is committed
        pass


class _Outbox:
    """Events a loop's handlers produced, published (and cleared) in its ``before_commit``; what
    a failed publish left here is sent again by the retry."""

    def __init__(self, producer: EventProducer, core: ServingCore) -> None:
        self.producer, self.core, self.events = producer, core, []

    def add(self, events: list[Envelope[Any]]) -> None:
        self.events += events

    def flush(self) -> None:
        self.events += self.core.drain_events()
        if self.events:
            self.producer.publish_many(self.events)
            self.events = []


class ServingWorker:
    def __init__(
        self,
        settings: MintSettings,
        core: ServingCore,
        *,
        group: str = "serving",
        stop: threading.Event | None = None,
    ):
        self.settings, self.core, self.group = settings, core, group
        self.stop = stop or threading.Event()
        self.producer = EventProducer(settings, client_id=f"serving-{core.engine_id}")
        self._out = _Outbox(self.producer, core)
        self._loads_queued: list[Envelope[LoadRequested]] = []
        self.loops: list[ConsumerLoop] = []
        # Loops of a host driven by the same thread (workers.evaluator.EngineHost's lanes).
        self.peers: list[ConsumerLoop] = []
        # An outage waited out in one loop pauses all of them: a loop not polled meanwhile
        # would leave its group after max_poll_interval.
        keep = hold_all(lambda: self.loops + self.peers)
        prefix = settings.topic_prefix

        def loop(topics: list[str], group_id: str, handler, before_commit) -> ConsumerLoop:
            made = ConsumerLoop(settings, topics, group_id, handler, stop=self.stop,
                                producer=self.producer, before_commit=before_commit,
                                keepalive=keep, retry=RetryPolicy(max_attempts=3),
                                # a host's evaluation wave can keep this loop unpolled longer
                                # than kafka-python's default 5 min
                                max_poll_interval_ms=30 * 60 * 1000)  # fmt: skip
            self.loops.append(made)
            return made

        try:
            # Its own group: every engine must see every alias move and load event.
            self._events = loop(["serving.events", "load.events"],
                                f"{prefix}-engine-{core.engine_id}-{uuid.uuid4().hex[:8]}",
                                self._on_event, self._out.flush)  # fmt: skip
            self._infer = loop(["infer.requests"], f"{prefix}-{group}", self._on_infer,
                               self._serve)  # fmt: skip
            self._loads = loop(["load.requests"], f"{prefix}-engines", self._on_load_request,
                               self._load)  # fmt: skip
        except BaseException:
            self.close()
            raise

    # Handlers (one record each) and the work each poll runs before its commit.

    def _on_event(self, env: Envelope[Any], _record) -> None:
        if isinstance(env.payload, AliasMoved):
            self._out.add(self.core.on_alias_moved(env))
        elif isinstance(env.payload, (AdapterLoaded, LoadFailed)):
            self._out.add(self.core.on_load_event(env))

    def _on_infer(self, env: Envelope[Any], _record) -> None:
        if isinstance(env.payload, InferRequested):
            self._out.add(self.core.on_infer(env))

    def _serve(self) -> None:
        self._out.add(self.core.serve())
        self._out.flush()

    def _on_load_request(self, env: Envelope[Any], _record) -> None:
        if isinstance(env.payload, LoadRequested):
            self._loads_queued.append(env)

    def _load(self) -> None:
        if self._loads_queued:
            queued, self._loads_queued = self._loads_queued, []
            self._out.add(self.core.on_load_requests(queued))
        self._out.flush()

    def step(self, timeout_ms: int = 100) -> int:
        """One round over the three loops; returns how many records it finished."""
        n = self._events.step(10)
        handled = self._infer.step(timeout_ms)
        return n + handled + self._loads.step(10 if handled else 20)

    def run(self, idle_timeout_s: float | None = None):
        """Step until ``stop`` (given to the constructor) is set, or idle for ``idle_timeout_s``."""
        log.info("serving worker started", engine_id=self.core.engine_id)
        try:
            run_steps(self.step, self.stop, idle_timeout_s)
        finally:
            self.close()
        return self.core.stats

    def close(self) -> None:
        for made in self.loops:
            made.close()
        self.loops = []
        self.producer.close()
