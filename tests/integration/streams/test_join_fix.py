"""kafka-python 3.0.12 loses a join round that finishes between two polls (streams/join_fix.py):
a member polled in short steps then never becomes stable. On real Kafka, a consumer made by
streams polled 1 ms at a time joins, is assigned every partition, and stays stable. Without
the fix the same loop ended each run still rebalancing, its generation climbing (2 to 5 in
15 s), with the assignment of its first round only."""

from __future__ import annotations

import time

import pytest
from kafka.coordinator import base
from kafka.coordinator.assignors.range import RangePartitionAssignor

from schemas.settings import MintSettings
from streams import ensure_topics, topic_for
from streams.clients import make_consumer
from streams.join_fix import join_group_async

pytestmark = pytest.mark.integration


def test_a_member_polled_in_1_ms_steps_joins_and_stays_stable(settings: MintSettings) -> None:
    assert base.BaseCoordinator.join_group_async is join_group_async  # streams applied it
    ensure_topics(settings, ["infer.requests", "load.requests"])
    topics = [topic_for(settings, "infer.requests"), topic_for(settings, "load.requests")]
    consumer = make_consumer(
        settings,
        *topics,
        group_id=f"{settings.topic_prefix}-join-fix",
        group_instance_id="join-fix-1",  # static, as the engines are
        session_timeout_ms=10_000,
        partition_assignment_strategy=(RangePartitionAssignor,),
    )
    try:
        coordinator = consumer._coordinator
        deadline, stable_since = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=1)  # a round always outlasts the poll that starts it
            if not coordinator.stable():
                stable_since = None
            elif stable_since is None:
                stable_since = time.monotonic()
            elif time.monotonic() - stable_since > 5:  # past the leader's metadata rejoin
                break
        assert coordinator.stable(), f"still {coordinator.state} after 60 s"
        want = 2 * settings.topic_partitions
        assert len(consumer.assignment()) == want and not coordinator.rejoining
    finally:
        consumer.close(autocommit=False)
