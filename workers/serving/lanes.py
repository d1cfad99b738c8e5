"""Request lanes: a topic of requests, each answered on a results topic by one ``run`` of a core
(rollout: workers.serving.rollout; evaluation: workers.evaluator.core).

A lane is a worker of its own (:func:`run_lane`) or one of the consumer loops that an engine host
steps in turn on one engine (:func:`lane_loop`, workers.evaluator.worker.EngineHost). Either way
a request naming an unknown or broken reward or suite is dead-lettered at once (a refusal), one
that fails twice (unresolvable revision, failed load) goes to the dead-letter topic too, an offset is committed only after its result was published, and a
redelivered request whose result is already published is skipped (streams.answered).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.envelope import Envelope
from schemas.settings import MintSettings
from streams.deferred import DeferredWork
from streams.group import ConsumerLoop
from streams.producer import EventProducer
from streams.records import ConsumerStats, RetryPolicy


@dataclass(frozen=True)
class Lane:
    requests: str  # the topic read
    results: str  # the topic its answers go to (what a redelivery is checked against)
    event_type: str  # the requests it runs (anything else on the topic is passed over)
    group: str  # its consumer group, after the topic prefix

    def group_id(self, settings: MintSettings) -> str:
        return f"{settings.topic_prefix}-{self.group}"


ROLLOUT = Lane("rollout.requests", "rollout.results", "rollout.requested", "rollout")
EVALUATION = Lane("eval.requests", "eval.results", "eval.requested", "evaluator")


class LaneCore(Protocol):
    """What answers a lane's requests: RolloutCore, EvaluatorCore."""

    producer_name: str

    def run(self, env: Envelope[Any]) -> Envelope[Any]: ...


def lane_loop(
    settings: MintSettings,
    lane: Lane,
    core: LaneCore,
    producer: EventProducer,
    *,
    stop: threading.Event | None = None,
    **options: Any,
) -> ConsumerLoop:
    """The consumer loop of ``lane``: each request's ``core.run`` published by ``producer``."""

    def handle(env: Envelope[Any], _record: Any) -> None:
        if env.type == lane.event_type:
            producer.publish(core.run(env))

    return ConsumerLoop(
        settings,
        [lane.requests],
        lane.group_id(settings),
        handle,
        stop=stop,
        producer=producer,
        retry=RetryPolicy(max_attempts=2, backoff_s=0.1),
        deferred=DeferredWork(settings, answers={lane.requests: lane.results}),
        **options,
    )


def run_lane(
    settings: MintSettings,
    lane: Lane,
    core: LaneCore,
    *,
    stop: threading.Event | None = None,
    idle_timeout_s: float | None = None,
    max_records: int | None = None,
) -> ConsumerStats:
    """Consume ``lane`` until ``stop`` is set (or ``max_records`` were finished, or nothing
    arrived for ``idle_timeout_s``). Returns the counts."""
    producer = EventProducer(settings, client_id=core.producer_name)
    try:
        return lane_loop(settings, lane, core, producer, stop=stop).run(max_records, idle_timeout_s)
    finally:
        producer.close()
