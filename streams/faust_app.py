"""The faust-streaming app for MinT stream processors. None runs on it today: the lifecycle
controller left it because faust-streaming 0.15.3 stalled after a kill -9 and restart (events
read while the recovery seeks back, then nothing more; 3 of 5 runs here). It stays, with
``tests/integration/test_faust.py``, for stateless processors that want faust's agents.

Configured from the same settings as everything else: broker, partitions and replication come
from ``MintSettings``, so a table's changelog topic gets the registry's partition count (faust
needs it equal to the source topic's). Create the registry topics with
``streams.topics.ensure_topics`` *before* the worker starts: a faust worker started before its
source topic exists stays unsubscribed from it.

    app = make_app(settings, "controller")
    commands = event_topic(app, settings, "serving.commands")

    @app.agent(commands)
    async def controller(stream):
        async for envelope in decoded(app, settings, stream, "controller"):
            ...

Values travel as raw bytes and are decoded with ``schemas.decode_event``; poison records go to
the dead-letter topic with the same ``mint.dlq.*`` headers as the kafka-python consumer loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import faust
import structlog

from schemas.envelope import Envelope
from schemas.events.dead_letter import DeadLetter
from schemas.exceptions import SchemaError
from schemas.registry import decode_event
from schemas.settings import MintSettings
from streams.topics import DLQ, topic_for

log = structlog.get_logger()


def make_app(settings: MintSettings, app_id: str, **overrides: Any) -> faust.App:
    """A faust app whose id (and so consumer group and changelog names) carries the prefix."""
    datadir = settings.state_dir / "faust" / f"{settings.topic_prefix}.{app_id}"
    datadir.parent.mkdir(parents=True, exist_ok=True)  # faust makes only the last level
    options: dict[str, Any] = {
        "broker": [f"kafka://{s.strip()}" for s in settings.kafka_bootstrap.split(",")],
        "store": "memory://",
        "topic_partitions": settings.topic_partitions,
        "topic_replication_factor": settings.topic_replication,
        "producer_acks": -1,
        "consumer_auto_offset_reset": "earliest",
        "web_enabled": False,
        # Like the kafka-python loop: a killed worker's partitions move on after 10 s, not
        # faust's default 60 s (which a restarted controller would otherwise wait out).
        "broker_session_timeout": 10.0,
        "broker_heartbeat_interval": 2.0,
        "datadir": str(datadir),
    }
    options.update(overrides)
    return faust.App(f"{settings.topic_prefix}.{app_id}", **options)


def event_topic(app: faust.App, settings: MintSettings, name: str) -> faust.TopicT:
    """A registry topic as raw bytes (decode with :func:`decoded`)."""
    return app.topic(topic_for(settings, name), key_serializer="raw", value_serializer="raw")


async def decoded(
    app: faust.App, settings: MintSettings, stream: faust.StreamT, group: str
) -> AsyncIterator[Envelope[Any]]:
    """Envelopes from a raw stream; undecodable or invalid records are dead-lettered."""
    dlq = topic_for(settings, DLQ)
    async for event in stream.events():
        message = event.message
        try:
            yield decode_event(event.value)
        except SchemaError as e:
            letter = DeadLetter(
                reason=e.reason,  # type: ignore[arg-type]
                error=f"{type(e).__name__}: {e}"[:4000],
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                group=group,
            )
            await app.producer.send_and_wait(
                dlq, message.key, message.value, None, None, letter.to_headers()
            )
            log.warning(
                "dead-lettered", reason=e.reason, topic=message.topic, offset=message.offset
            )
