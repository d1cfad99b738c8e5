"""The consumer loop against real Kafka: per-policy order, redelivery after a real kill,
dead letters for every kind of poison while good records keep flowing."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import defaultdict

import pytest

from schemas import encode_event
from schemas.envelope import make_event
from schemas.events import DeadLetter
from schemas.examples import example_payload
from schemas.settings import MintSettings
from streams import EventProducer, RetryPolicy, ensure_topics, run_consumer
from tests.integration.streams._streams_helpers import promote, read_topic, start_worker, wait_until

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


def test_topics_are_created_idempotently_with_registry_settings(settings: MintSettings) -> None:
    created = ensure_topics(settings, ["serving.commands", "policy.state"])
    assert sorted(created) == sorted(
        settings.topic(n) for n in ["serving.commands", "policy.state"]
    )
    assert ensure_topics(settings, ["serving.commands", "policy.state"]) == []
    from kafka.admin import ConfigResource, ConfigResourceType

    from streams import make_admin

    admin = make_admin(settings)
    meta = admin.describe_topics([settings.topic("serving.commands")])[0]
    resources = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, settings.topic("policy.state"))]
    )
    admin.close()
    assert len(meta["partitions"]) == settings.topic_partitions
    assert "compact" in str(resources)


def test_per_policy_order_holds_across_partitions_with_two_members(settings: MintSettings) -> None:
    ensure_topics(settings, ["serving.commands", "dlq"])
    policies = [f"p{i}" for i in range(8)]
    events = [promote("acme", p, rev) for rev in range(1, 26) for p in policies]  # interleaved

    seen: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def handle(env, record) -> None:
        with lock:
            seen[env.policy].append(env.payload.revision)

    members = [
        threading.Thread(
            target=run_consumer,
            args=(settings, ["serving.commands"], "order", handle),
            kwargs={"idle_timeout_s": 4.0},
            name=f"member-{i}",
        )
        for i in range(2)
    ]
    for m in members:
        m.start()
    time.sleep(1.5)  # let both members join, so the partitions are shared while events flow
    with EventProducer(settings) as producer:
        sent = producer.publish_many(events)
    assert len({m.partition for m in sent}) > 1, "policies should spread over partitions"
    for m in members:
        m.join(40)

    for p in policies:
        # At-least-once: a rebalance may redeliver a tail; the first delivery of each revision
        # must still come in order, and nothing may be missing.
        first_seen = list(dict.fromkeys(seen[p]))
        assert first_seen == list(range(1, 26)), (p, seen[p])
        for i in range(1, len(seen[p])):
            if seen[p][i] < seen[p][i - 1]:  # only a redelivery may step back
                assert seen[p][i] in seen[p][:i], (p, seen[p])


def test_killed_consumer_gets_the_event_again_and_handles_it_idempotently(
    settings: MintSettings, tmp_path
) -> None:
    ensure_topics(settings, ["serving.commands", "dlq"])
    events = [promote("acme", "math-rl", rev) for rev in range(1, 6)]
    with EventProducer(settings) as producer:
        producer.publish_many(events)

    first = start_worker("consumer_worker.py", settings, str(tmp_path), KILL_AT_REVISION="3")
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), 20, "the worker to handle revision 3")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert first.returncode == -signal.SIGKILL
    handled_before = (tmp_path / "handled.log").read_text().split()
    assert str(events[2].event_id) in handled_before  # handled, but never committed

    second = start_worker("consumer_worker.py", settings, str(tmp_path), IDLE_S="3")
    output, _ = second.communicate(timeout=30)
    assert second.returncode == 0, output
    handled = (tmp_path / "handled.log").read_text().split()
    assert handled.count(str(events[2].event_id)) == 2, "revision 3 must be delivered again"
    sink = {p.name: p.read_text() for p in (tmp_path / "sink").iterdir()}
    assert sink == {str(e.event_id): str(e.payload.revision) for e in events}  # once each

    # And its offsets are committed now: a third run finds nothing new.
    third = start_worker("consumer_worker.py", settings, str(tmp_path), IDLE_S="2")
    output, _ = third.communicate(timeout=30)
    assert "handled=0" in output


def test_poison_messages_are_dead_lettered_with_reasons_and_good_ones_flow(
    settings: MintSettings,
) -> None:
    ensure_topics(settings, ["serving.commands", "dlq"])
    topic = settings.topic("serving.commands")
    good = [promote("acme", "math-rl", rev) for rev in range(1, 5)]
    failing = promote("acme", "math-rl", 99)  # the handler always fails on this one
    valid = json.loads(encode_event(good[0]))
    invalid = dict(valid, tenant="Not A Tenant")
    unknown_type = dict(valid, type="serving.teleport")
    unknown_version = dict(valid, schema_version=7)
    key = b"acme/math-rl"  # all on one partition: the poison sits in front of good records
    poison = [
        (b"\x00\x01 not json", "undecodable"),
        (json.dumps(invalid).encode(), "invalid"),
        (json.dumps(unknown_type).encode(), "unknown_type"),
        (json.dumps(unknown_version).encode(), "unknown_version"),
        (encode_event(failing), "handler_failed"),
    ]
    with EventProducer(settings) as producer:
        producer.publish(good[0])
        originals = [producer.send_raw(topic, value, key) for value, _ in poison]
        producer.publish_many(good[1:])

    handled: list[int] = []

    def handle(env, record) -> None:
        if env.payload.revision == 99:
            raise RuntimeError("downstream rejects revision 99")
        handled.append(env.payload.revision)

    stats = run_consumer(
        settings,
        ["serving.commands"],
        "dlq-test",
        handle,
        max_records=9,
        retry=RetryPolicy(max_attempts=3, backoff_s=0.05),
    )
    assert handled == [1, 2, 3, 4]
    assert stats.retries == 2 and stats.dead_lettered == 5

    letters = read_topic(settings, settings.topic("dlq"))
    assert [DeadLetter.from_headers(r.headers).reason for r in letters] == [r for _, r in poison]
    for record, (value, _), meta in zip(letters, poison, originals, strict=True):
        letter = DeadLetter.from_headers(record.headers)
        assert record.value == value and record.key == key  # original bytes kept
        assert (letter.topic, letter.partition, letter.offset) == (
            topic,
            meta.partition,
            meta.offset,
        )
        assert letter.group == "dlq-test" and letter.error
    assert DeadLetter.from_headers(letters[-1].headers).attempts == 3
    assert "schema_version 7" in DeadLetter.from_headers(letters[3].headers).error

    # Nothing left uncommitted: the group resumes after the last record.
    again = run_consumer(settings, ["serving.commands"], "dlq-test", handle, idle_timeout_s=2)
    assert again.records == 0


def test_an_envelope_for_an_other_tenants_store_is_dead_lettered(settings: MintSettings) -> None:
    ensure_topics(settings, ["export.events", "dlq"])
    env = make_event(
        example_payload("export.completed", "acme", "p"), tenant="acme", policy="p", producer="t"
    )
    forged = encode_event(env).replace(b"/acme/p/", b"/evil/p/")
    with EventProducer(settings) as producer:
        producer.send_raw(settings.topic("export.events"), forged, b"acme/p")
    stats = run_consumer(settings, ["export.events"], "ns", lambda e, r: None, max_records=1)
    assert stats.reasons == {"invalid": 1}
    (letter,) = read_topic(settings, settings.topic("dlq"))
    assert "outside the namespace" in DeadLetter.from_headers(letter.headers).error


def test_sigterm_finishes_commits_and_leaves(settings: MintSettings, tmp_path) -> None:
    ensure_topics(settings, ["serving.commands", "dlq"])
    with EventProducer(settings) as producer:
        producer.publish_many([promote("acme", "math-rl", rev) for rev in range(1, 4)])
    worker = start_worker("consumer_worker.py", settings, str(tmp_path), IDLE_S="120")
    log = tmp_path / "handled.log"
    wait_until(lambda: log.exists() and len(log.read_text().split()) == 3, 20, "3 handled")
    worker.send_signal(signal.SIGTERM)
    output, _ = worker.communicate(timeout=15)
    assert worker.returncode == 0 and "handled=3" in output, output
    again = start_worker("consumer_worker.py", settings, str(tmp_path), IDLE_S="2")
    output, _ = again.communicate(timeout=30)
    assert "handled=0" in output, output


def test_an_outage_longer_than_max_poll_interval_keeps_the_member_and_loses_nothing(
    settings: MintSettings,
) -> None:
    # Cassandra (say) is away for 8 s; the group would evict a member that does not poll for
    # 3 s. The loop pauses its partitions and keeps polling: no rebalance, no dead letter, the
    # record handled once when the outage passes, and its offset committed.
    from prometheus_client import REGISTRY

    ensure_topics(settings, ["serving.commands", "dlq"])
    with EventProducer(settings) as producer:
        producer.publish_many([promote("acme", "p", 1), promote("acme", "p", 2)])
    until = time.monotonic() + 8
    calls: list[int] = []
    group = f"{settings.topic_prefix}-outage"

    def handle(env, record) -> None:
        calls.append(env.payload.revision)
        if time.monotonic() < until:
            raise ConnectionError("Cassandra did not answer")

    stats = run_consumer(
        settings,
        ["serving.commands"],
        group,
        handle,
        max_records=2,
        retry=RetryPolicy(max_attempts=2, backoff_s=0.5, max_backoff_s=1.0),
        max_poll_interval_ms=3000,
        heartbeat_interval_ms=1000,
    )
    assert stats.handled == 2 and stats.dead_lettered == 0 and stats.transient_retries >= 6
    assert [c for c in calls if c == 2] == [2]  # the second record waited, handled once
    assert REGISTRY.get_sample_value("mint_consumer_waiting_out_outage", {"group": group}) == 0
    assert read_topic(settings, settings.topic("dlq")) == []
    # Committed: the group resumes after both records.
    again = run_consumer(settings, ["serving.commands"], group, handle, idle_timeout_s=3)
    assert again.records == 0
