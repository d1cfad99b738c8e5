"""The evaluator as a Kafka worker, alone or sharing one engine with serving and rollout.

``run_evaluator_worker``: the streams consumer loop over ``eval.requests`` (group
``<prefix>-evaluator``); a request naming an unknown or broken suite is dead-lettered at once (a
refusal); one that fails twice (unresolvable revision, failed load) goes there too. A request for a suite not configured for its policy is
answered at once: ``eval.completed`` with ``refused`` (EvaluatorCore.run).

``EngineHost``: ONE vLLM engine (vLLM's generate is not re-entrant, and a small machine holds one
engine) driven by one thread that interleaves the serving worker's step, rollout requests and
evaluation requests. Each lane is a streams ConsumerLoop (the rules every worker shares): it
commits an offset only after the record's results were published (at-least-once; result ids
derive from request ids, so consumers dedupe), waits out an outage with every loop of the host
paused, dead-letters an unknown suite at once and a request that fails twice (unresolvable revision), and skips
a redelivered request whose result is already published (streams.answered).
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from schemas.settings import MintSettings
from streams.group import ConsumerLoop, hold_all
from streams.producer import EventProducer
from streams.records import ConsumerStats
from workers.evaluator.core import EvaluatorCore
from workers.serving.lanes import EVALUATION, ROLLOUT, lane_loop, run_lane
from workers.serving.worker import run_steps

log = structlog.get_logger()


def run_evaluator_worker(
    settings: MintSettings, core: EvaluatorCore, **options: Any
) -> ConsumerStats:
    """Consume evaluation requests (group ``<prefix>-evaluator``) until stopped
    (workers.serving.lanes: ``stop``, ``idle_timeout_s``, ``max_records``)."""
    return run_lane(settings, EVALUATION, core, **options)


class EngineHost:
    """Serving, rollout and evaluation on one engine, in one thread."""

    def __init__(
        self,
        settings: MintSettings,
        *,
        serving: Any = None,
        rollout: Any = None,
        evaluator: EvaluatorCore | None = None,
        engine_id: str = "engine-0",
        stop: threading.Event | None = None,
    ) -> None:
        self.settings, self.serving = settings, serving
        self.stop = stop or (serving.stop if serving is not None else threading.Event())
        self.producer = EventProducer(settings, client_id=f"host-{engine_id}")
        self.lanes: list[ConsumerLoop] = []

        def loops() -> list[ConsumerLoop]:
            return self.lanes + (serving.loops if serving is not None else [])

        if serving is not None:
            serving.peers = self.lanes  # an outage in any loop pauses every loop of the thread
        try:
            for lane, core in ((ROLLOUT, rollout), (EVALUATION, evaluator)):
                if core is not None:
                    self.lanes.append(
                        lane_loop(
                            settings,
                            lane,
                            core,
                            self.producer,
                            stop=self.stop,
                            keepalive=hold_all(loops),
                            # Generating can outlast kafka-python's default poll interval on a
                            # busy CPU.
                            max_poll_interval_ms=30 * 60 * 1000,
                        )
                    )
        except BaseException:
            self.close()
            raise

    def step(self) -> int:
        n = self.serving.step(timeout_ms=50) if self.serving is not None else 0
        for lane in self.lanes:
            n += lane.step(10 if n else 50, max_records=4)
        return n

    def run(self, idle_timeout_s: float | None = None):
        """Step until ``stop`` is set, or nothing arrived for ``idle_timeout_s``."""
        log.info(
            "engine host started",
            lanes=[lane.group_id for lane in self.lanes],
            serving=self.serving is not None,
        )
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
