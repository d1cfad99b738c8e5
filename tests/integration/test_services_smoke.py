"""Smoke tests against the real Kafka and Cassandra started by the launcher."""

from __future__ import annotations

import uuid

from kafka import TopicPartition
from kafka.admin import NewTopic

from schemas.settings import MintSettings
from streams import make_admin, make_consumer, make_producer


def test_kafka_round_trip_on_a_fresh_topic(settings: MintSettings) -> None:
    topic = settings.topic("smoke")
    admin = make_admin(settings)
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()

    producer = make_producer(settings)
    sent = [producer.send(topic, key=b"acme/p", value=f"v{i}".encode()).get(30) for i in range(5)]
    producer.close()
    assert len({m.partition for m in sent}) == 1, "one key must map to one partition"

    consumer = make_consumer(settings, group_id=f"g-{uuid.uuid4().hex}", consumer_timeout_ms=20_000)
    tp = TopicPartition(topic, sent[0].partition)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = [m.value for _, m in zip(range(5), consumer, strict=False)]
    consumer.close()
    assert values == [f"v{i}".encode() for i in range(5)]


def test_cassandra_write_read_and_lightweight_transaction(cassandra) -> None:
    session, ks = cassandra
    session.execute(f"CREATE TABLE {ks}.aliases (name text PRIMARY KEY, revision int)")
    first = session.execute(
        f"INSERT INTO {ks}.aliases (name, revision) VALUES ('prod', 1) IF NOT EXISTS"
    ).one()
    again = session.execute(
        f"INSERT INTO {ks}.aliases (name, revision) VALUES ('prod', 9) IF NOT EXISTS"
    ).one()
    assert first.applied is True
    assert again.applied is False and again.revision == 1

    moved = session.execute(
        f"UPDATE {ks}.aliases SET revision = 2 WHERE name = 'prod' IF revision = 1"
    ).one()
    stale = session.execute(
        f"UPDATE {ks}.aliases SET revision = 3 WHERE name = 'prod' IF revision = 1"
    ).one()
    assert moved.applied is True
    assert stale.applied is False and stale.revision == 2
    assert (
        session.execute(f"SELECT revision FROM {ks}.aliases WHERE name = 'prod'").one().revision
        == 2
    )


def test_dev_status_answers_on_stdout_and_exits_0(base_settings: MintSettings) -> None:
    """The table is the command's answer (stdout, for a pipe); logs and messages go to stderr."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "MINT_KAFKA_BOOTSTRAP": base_settings.kafka_bootstrap,
        "MINT_CASSANDRA_HOSTS": base_settings.cassandra_hosts,
        "MINT_CASSANDRA_PORT": str(base_settings.cassandra_port),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mint.cli", "dev", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "kafka" in line or "cassandra" in line]
    assert len(lines) == 2 and all(" up " in line for line in lines), done.stdout
