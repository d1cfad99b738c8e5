"""A consumer whose client stops fetching an owned partition (kafka-python 3.0.x:
dpkp/kafka-python#3106, #3131) is replaced by its loop, and every record is still handled.
Real Kafka and a real kafka-python consumer; the client's fault is injected into that one
consumer object (its fetcher skips partition 0), so the loop's new consumer is healthy."""

from __future__ import annotations

import threading
import time

import pytest

from schemas import decode_event
from schemas.envelope import make_event
from schemas.events import PromoteCommand
from schemas.settings import MintSettings
from streams import EventProducer, ensure_topics, health, topic_for
from streams.follower import Follower
from streams.group import ConsumerLoop
from streams.metrics import RESTARTS

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _promote(policy: str):
    return make_event(PromoteCommand(revision=1), tenant="acme", policy=policy, producer="test/cli")


def _wedge(consumer, partition: int) -> None:
    """Make this client never fetch ``partition`` again, as the upstream bug does."""
    fetcher = consumer._fetcher
    fetchable = fetcher._fetchable_partitions
    fetcher._fetchable_partitions = lambda: [tp for tp in fetchable() if tp.partition != partition]


def test_a_partition_the_client_stops_fetching_gets_the_loop_a_new_consumer(
    settings: MintSettings,
) -> None:
    ensure_topics(settings, ["serving.commands", "dlq"])
    commands = [_promote(f"p{i}") for i in range(24)]
    handled: dict[str, int] = {}

    def handle(env, record) -> None:
        handled[env.event_id] = record.partition

    group = f"{settings.topic_prefix}-stall"
    loop = ConsumerLoop(settings, ["serving.commands"], group, handle, stall_limit_s=6.0)
    loop._stalls.suspect_s = 2.0  # /readyz 503 well before the replacement (30 s and 90 s live)
    wedged = loop.consumer
    _wedge(wedged, 0)
    restarts = RESTARTS.labels(group, "never_fetched")
    before = restarts._value.get()
    suspected: set[tuple[str, str | None]] = set()
    try:
        with EventProducer(settings) as producer:
            producer.publish_many(commands)
        deadline = time.monotonic() + 90
        while len(handled) < len(commands):
            assert time.monotonic() < deadline, (
                f"{len(handled)} of {len(commands)} handled; partition 0 was never read again"
            )
            loop.step(200)
            if loop.consumer is wedged:
                stalled = health.report()["groups"].get(group, {}).get("stalled", [])
                suspected |= {(c["reason"], c["partition"]) for c in stalled}
    finally:
        loop.close()
        loop._stalls.reset()
    assert loop.consumer is not wedged, "the stalled consumer was replaced"
    topic = topic_for(settings, "serving.commands")
    assert ("never_fetched", f"{topic}[0]") in suspected, "/readyz named it before the replacement"
    assert restarts._value.get() == before + 1
    assert sorted(handled) == sorted(c.event_id for c in commands), "every record handled"
    assert 0 in handled.values(), "records of the wedged partition were among them"


def test_a_follower_whose_client_stops_fetching_goes_on_from_the_same_positions(
    settings: MintSettings,
) -> None:
    ensure_topics(settings, ["serving.commands"])
    topic = topic_for(settings, "serving.commands")
    first = [_promote(f"p{i}") for i in range(24)]
    later = [_promote(f"q{i}") for i in range(24)]
    seen: list[str] = []
    with EventProducer(settings) as producer, Follower(settings) as follower:
        producer.publish_many(first)
        follower.assign(follower.partitions(topic), "beginning")
        wedged = follower.consumer
        _wedge(wedged, 0)
        stop, deadline = threading.Event(), time.monotonic() + 60
        for records in follower.follow(stop, stall_limit_s=4.0):
            seen += [decode_event(r.value).event_id for r in records]
            if follower.consumer is not wedged and len(seen) == len(first):
                producer.publish_many(later)  # and the new client follows on
            if len(seen) >= len(first + later) or time.monotonic() > deadline:
                stop.set()
    assert follower.consumer is not wedged, "the stalled client was replaced"
    assert sorted(seen) == sorted(e.event_id for e in first + later), "each record once"
