"""`mint demo`: the README's main job.

For now a smoke lifecycle over the real services: start Kafka and Cassandra, publish one lifecycle
event, consume it back through a consumer group, and record it as one catalog row. Later issues
grow this into the full rollout → update → export → evaluate → promote → rollback demo.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError
from rich.console import Console
from rich.table import Table

from catalog import connect, ensure_keyspace
from mint.dev import LauncherError, down, up
from schemas.settings import MintSettings
from streams import make_admin, make_consumer, make_producer


def run_demo(settings: MintSettings, console: Console, keep_services: bool = True) -> int:
    t0 = time.monotonic()
    try:
        with console.status("starting Kafka and Cassandra"):
            ready = up(settings)
    except LauncherError as e:
        console.print(f"[red]error:[/red] {e}")
        return 1
    for name, seconds in ready.items():
        console.print(f"{name} ready after {seconds:.1f} s")
    try:
        row = _smoke_lifecycle(settings, console)
    finally:
        if not keep_services:
            down(settings)
    table = Table("step", "result", title="MinT smoke lifecycle")
    for key, value in row.items():
        table.add_row(key, str(value))
    console.print(table)
    console.print(f"demo finished in {time.monotonic() - t0:.1f} s")
    return 0


def _smoke_lifecycle(settings: MintSettings, console: Console) -> dict[str, object]:
    topic = settings.topic("demo.smoke")
    admin = make_admin(settings)
    try:
        admin.create_topics(
            [NewTopic(topic, settings.topic_partitions, settings.topic_replication)]
        )
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()

    event = {
        "event_id": str(uuid.uuid4()),
        "type": "demo.smoke",
        "occurred_at": datetime.now(UTC).isoformat(),
        "tenant": "demo",
        "policy": "smoke",
    }
    producer = make_producer(settings)
    meta = producer.send(topic, key=b"demo/smoke", value=json.dumps(event).encode()).get(timeout=30)
    producer.close()
    console.print(f"produced event {event['event_id']} to {topic}[{meta.partition}]@{meta.offset}")

    consumer = make_consumer(
        settings, group_id=f"demo-{uuid.uuid4().hex[:8]}", consumer_timeout_ms=30_000
    )
    consumer.assign([_tp(topic, meta.partition)])
    consumer.seek(_tp(topic, meta.partition), meta.offset)
    received = next(m for m in consumer if json.loads(m.value)["event_id"] == event["event_id"])
    consumer.commit()
    consumer.close()
    console.print(f"consumed it back at offset {received.offset}")

    cluster, session = connect(settings)
    try:
        ensure_keyspace(session, settings.keyspace, settings.keyspace_replication)
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {settings.keyspace}.demo_events "
            "(event_id uuid PRIMARY KEY, type text, tenant text, policy text, kafka_offset bigint)"
        )
        insert = session.prepare(
            f"INSERT INTO {settings.keyspace}.demo_events (event_id, type, tenant, policy, kafka_offset) "
            "VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        eid = uuid.UUID(event["event_id"])
        applied = session.execute(
            insert, (eid, event["type"], "demo", "smoke", received.offset)
        ).one()[0]
        stored = session.execute(
            f"SELECT type, kafka_offset FROM {settings.keyspace}.demo_events WHERE event_id = %s",
            (eid,),
        ).one()
    finally:
        cluster.shutdown()
    console.print(f"catalog row written (LWT applied={applied})")
    return {
        "topic": topic,
        "event_id": event["event_id"],
        "partition/offset": f"{meta.partition}/{meta.offset}",
        "catalog row": f"{settings.keyspace}.demo_events type={stored.type} offset={stored.kafka_offset}",
    }


def _tp(topic: str, partition: int):
    from kafka import TopicPartition

    return TopicPartition(topic, partition)
