"""The evaluator as a Kafka worker, alone or sharing one engine with serving and rollout.

``run_evaluator_worker``: the streams consumer loop over ``eval.requests`` (group
``<prefix>-evaluator``); a request that fails twice (unknown suite, unresolvable revision, failed
load) goes to the dead-letter topic.

``EngineHost``: ONE vLLM engine (vLLM's generate is not re-entrant, and a small machine holds one
engine) driven by one thread that interleaves the serving worker's step, rollout requests and
evaluation requests. Each lane is a streams ConsumerLoop (the rules every worker shares): it
commits an offset only after the record's results were published (at-least-once; result ids
derive from request ids, so consumers dedupe), waits out an outage with every loop of the host
paused, dead-letters a request that fails twice (unknown suite, unresolvable revision), and skips
a redelivered request whose result is already published (streams.answered).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from schemas.settings import MintSettings
from streams.consumer import ConsumerLoop, RetryPolicy, hold_all, run_consumer
from streams.producer import EventProducer
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
                            producer=producer, answers={"eval.requests": "eval.results"},
                            retry=RetryPolicy(max_attempts=2, backoff_s=0.1))  # fmt: skip
    finally:
        producer.close()


class EngineHost:
    """Serving, rollout and evaluation on one engine, in one thread."""

    def __init__(self, settings: MintSettings, *, serving: Any = None, rollout: Any = None,
                 evaluator: EvaluatorCore | None = None, engine_id: str = "engine-0",
                 stop: threading.Event | None = None) -> None:  # fmt: skip
        self.settings, self.serving = settings, serving
        self.stop = stop or (serving.stop if serving is not None else threading.Event())
        self.producer = EventProducer(settings, client_id=f"host-{engine_id}")
        self.lanes: list[ConsumerLoop] = []

        def loops() -> list[ConsumerLoop]:
            return self.lanes + (serving.loops if serving is not None else [])

        if serving is not None:
            serving.peers = self.lanes  # an outage in any loop pauses every loop of the thread
        try:
            if rollout is not None:
                self._lane("rollout.requests", "rollout.results", f"{settings.topic_prefix}-rollout",
                           "rollout.requested", rollout.run, loops)  # fmt: skip
            if evaluator is not None:
                self._lane("eval.requests", "eval.results", evaluator_group(settings),
                           "eval.requested", evaluator.run, loops)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _lane(self, topic: str, results: str, group: str, event_type: str,
              run: Callable[[Any], Any], loops: Callable[[], list]) -> None:  # fmt: skip
        def handle(env, _record) -> None:
            if env.type == event_type:
                self.producer.publish(run(env))

        # Generating can outlast kafka-python's default poll interval on a busy CPU.
        self.lanes.append(ConsumerLoop(
            self.settings, [topic], group, handle, stop=self.stop, producer=self.producer,
            retry=RetryPolicy(max_attempts=2, backoff_s=0.1), keepalive=hold_all(loops),
            answers={topic: results},  # a redelivered request that was answered: skipped
            max_poll_interval_ms=30 * 60 * 1000))  # fmt: skip

    def step(self) -> int:
        n = self.serving.step(timeout_ms=50) if self.serving is not None else 0
        for lane in self.lanes:
            n += lane.step(10 if n else 50, max_records=4)
        return n

    def run(self, idle_timeout_s: float | None = None):
        """Step until ``stop`` is set, or nothing arrived for ``idle_timeout_s``."""
        log.info("engine host started", lanes=[lane.group_id for lane in self.lanes],
                 serving=self.serving is not None)  # fmt: skip
        try:
            run_steps(self.step, self.stop, idle_timeout_s)
        finally:
            self.close()
        return {lane.group_id: lane.stats.handled for lane in self.lanes}

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()
        if self.serving is not None:
            self.serving.close()
        self.producer.close()
