"""The group-less Follower against real Kafka: it starts where it is told (the end, a time,
offsets), reads to the end that was there when the read began (even when that end is a
transaction marker), and follows for ever until stopped."""

from __future__ import annotations

import threading
import time
import uuid

from kafka import TopicPartition

from schemas import decode_event, encode_event
from schemas.settings import MintSettings
from streams import EventProducer, Follower, Since, ensure_topics, make_producer
from tests.integration.streams._streams_helpers import promote

POLICIES = [f"p{i}" for i in range(6)]  # several keys, so several partitions


def _publish(settings: MintSettings, revision: int) -> set[uuid.UUID]:
    events = [promote("acme", p, revision) for p in POLICIES]
    with EventProducer(settings) as producer:
        producer.publish_many(events)
    return {e.event_id for e in events}


def _ids(records) -> set[uuid.UUID]:
    return {decode_event(r.value).event_id for r in records}


def _read_all(follower: Follower, **kwargs) -> list:
    deadline = time.monotonic() + 20
    got = []
    for records in follower.read_to(**kwargs):
        got += records
        assert time.monotonic() < deadline, "the read never reached its end"
    return got


def test_a_read_from_a_time_yields_what_came_after_it_up_to_the_end_seen_at_the_start(
    settings: MintSettings,
) -> None:
    ensure_topics(settings, ["serving.commands"])
    topic = settings.topic("serving.commands")
    before = _publish(settings, 1)
    time.sleep(0.2)
    since = int(time.time() * 1000)
    time.sleep(0.05)
    after = _publish(settings, 2)
    with Follower(settings) as follower:
        tps = follower.partitions(topic)
        assert len(tps) == settings.topic_partitions
        starts = follower.assign(tps, Since(since))
        ends = follower.end_offsets(tps)
        assert sum(ends[tp] - starts[tp] for tp in tps) == len(after)
        reading = follower.read_to()  # the ends are fixed when the read begins ...
        first = next(reading)
        later = _publish(settings, 3)  # ... so what is published meanwhile is not part of it
        got = first + [r for records in reading for r in records]
    assert _ids(got) == after
    assert not _ids(got) & (before | later)

    with Follower(settings) as follower:  # a time after every record: nothing until new ones
        tps = follower.partitions(topic)
        follower.assign(tps, Since(int(time.time() * 1000) + 60_000))
        assert _read_all(follower) == []


def test_a_read_to_an_end_that_is_a_transaction_marker_ends(settings: MintSettings) -> None:
    """The last offset of a transactional topic is a commit marker, never a record: the read
    must end on the position, not wait for a record at end - 1."""
    ensure_topics(settings, ["serving.commands"])
    topic = settings.topic("serving.commands")
    events = [promote("acme", p, 1) for p in POLICIES]
    producer = make_producer(settings, transactional_id=f"follower-{uuid.uuid4().hex[:6]}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for env in events:
            producer.send(topic, encode_event(env), env.key)
        producer.commit_transaction()
    finally:
        producer.close()
    with Follower(settings) as follower:
        follower.assign(follower.partitions(topic), "beginning")
        got = _read_all(follower)
        ends = follower.end_offsets(follower.partitions(topic))
        assert follower.positions() == ends  # past the markers
    assert _ids(got) == {e.event_id for e in events}
    assert sum(ends.values()) == len(events) + len({r.partition for r in got})  # + markers


def test_offsets_start_and_ends_bound_the_read_per_partition(settings: MintSettings) -> None:
    ensure_topics(settings, ["serving.commands"])
    topic = settings.topic("serving.commands")
    for revision in (1, 2, 3):
        _publish(settings, revision)
    with Follower(settings) as follower:
        tps = follower.partitions(topic)
        ends = follower.end_offsets(tps)
        busy = max(tps, key=lambda tp: ends[tp])
        assert ends[busy] >= 3
        follower.assign([busy], {busy: 1})
        got = _read_all(follower, ends={busy: ends[busy] - 1})
    assert [r.offset for r in got] == list(range(1, ends[busy] - 1))
    assert {TopicPartition(r.topic, r.partition) for r in got} == {busy}


def test_following_from_the_end_sees_only_what_came_after_until_stopped(
    settings: MintSettings,
) -> None:
    ensure_topics(settings, ["serving.commands"])
    topic = settings.topic("serving.commands")
    old = _publish(settings, 1)
    stop = threading.Event()
    seen: set[uuid.UUID] = set()
    polls = 0
    with Follower(settings) as follower:
        follower.assign(follower.partitions(topic), "end")  # fixed before anything new
        new = _publish(settings, 2)

        def watch() -> None:
            nonlocal polls
            for records in follower.follow(stop, timeout_ms=100):
                polls += 1
                seen.update(_ids(records))

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while seen != new:
            assert time.monotonic() < deadline, f"followed {len(seen)} of {len(new)}"
            time.sleep(0.05)
        quiet = polls
        time.sleep(0.5)
        assert polls > quiet  # nothing new, yet it keeps following (an empty poll each time)
        stop.set()
        thread.join(timeout=5)
        assert not thread.is_alive()  # stopped when asked
    assert not seen & old
