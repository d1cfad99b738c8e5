"""Publishing events: ``acks=all``, idempotent, and each call returns only after the broker
confirmed (so a caller that goes on to commit or answer knows the event is durable)."""

from __future__ import annotations

import time
from typing import Any

import structlog
from kafka.errors import KafkaError
from kafka.producer.future import RecordMetadata

from schemas.envelope import Envelope
from schemas.registry import encode_event
from schemas.settings import MintSettings
from streams.clients import make_producer
from streams.exceptions import PublishError
from streams.topics import topic_for_type

log = structlog.get_logger()
# A confirmation slower than this is logged: on a healthy cluster it takes milliseconds, so a
# slow one names the broker trouble (a leader moving, a follower holding acks=all) it met.
SLOW_CONFIRM_S = 5.0


class EventProducer:
    """One producer per process; thread-safe (kafka-python's producer is)."""

    def __init__(self, settings: MintSettings, **overrides: Any) -> None:
        self.settings = settings
        self._producer = make_producer(settings, **overrides)

    def publish(
        self,
        envelope: Envelope[Any],
        topic: str | None = None,
        timeout_s: float = 30.0,
        key: bytes | None = None,
    ) -> RecordMetadata:
        """Send one event (to its registry topic unless ``topic`` names a broker topic) and wait
        for the broker's acknowledgement. ``key`` overrides ``tenant/policy`` (e.g. one key per
        alias on the compacted policy.state topic)."""
        if key is None:
            return self.publish_many([envelope], topic, timeout_s)[0]
        target = topic or topic_for_type(self.settings, envelope.type)
        return self.send_raw(target, encode_event(envelope), key, timeout_s=timeout_s)

    def publish_many(
        self, envelopes: list[Envelope[Any]], topic: str | None = None, timeout_s: float = 30.0
    ) -> list[RecordMetadata]:
        """Send a batch (pipelined), then wait until the broker confirmed every one, in order."""
        t0 = time.monotonic()
        futures = []
        for env in envelopes:
            target = topic or topic_for_type(self.settings, env.type)
            futures.append((target, env, self._producer.send(target, encode_event(env), env.key)))
        sent = []
        for target, env, future in futures:
            try:
                sent.append(future.get(timeout=timeout_s))
            except KafkaError as e:
                raise PublishError(
                    f"broker did not confirm {env.type} {env.event_id} on {target} within "
                    f"{timeout_s} s ({e}); the event may be lost: retry the publish "
                    "(consumers dedupe on event_id)"
                ) from e
        if (waited := time.monotonic() - t0) > SLOW_CONFIRM_S:
            log.warning(
                "slow publish",
                seconds=round(waited, 1),
                events=len(sent),
                partitions=sorted({f"{m.topic}/{m.partition}" for m in sent}),
            )
        return sent

    def send_raw(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        timeout_s: float = 30.0,
    ) -> RecordMetadata:
        """Send bytes as they are (dead letters, replays) and wait for the acknowledgement."""
        try:
            return self._producer.send(topic, value, key, headers=headers).get(timeout=timeout_s)
        except KafkaError as e:
            raise PublishError(f"broker did not confirm a record on {topic} ({e})") from e

    def send_async(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Any:
        """Send bytes without waiting; call ``.get(timeout)`` on the result to confirm."""
        return self._producer.send(topic, value, key, headers=headers)

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.close(timeout=timeout_s)

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
