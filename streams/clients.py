"""kafka-python clients built from the settings, with the options every MinT client shares."""

from __future__ import annotations

import socket
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaTimeoutError

from schemas.settings import MintSettings
from streams import join_fix
from streams.exceptions import KafkaUnavailable

join_fix.apply()  # before any consumer joins a group (streams/join_fix.py: why)

# kafka-python backs off reconnects exponentially up to 30 s: after a broker restart its clients
# would idle for up to that long. 2 s: the fault-injection run recovers from a Kafka kill -9
# in less time (benchmarks/fault_injection.py).
_RECONNECT = {"reconnect_backoff_ms": 100, "reconnect_backoff_max_ms": 2000}


def _security(settings: MintSettings) -> dict[str, Any]:
    """SASL/SCRAM options when the settings name a principal (PLAINTEXT: none)."""
    if not settings.kafka_secure:
        return {}
    if not settings.kafka_username:
        raise KafkaUnavailable(
            f"MINT_KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol} needs a principal: "
            "set MINT_KAFKA_USERNAME and MINT_KAFKA_PASSWORD(_FILE)"
        )
    return {
        "security_protocol": settings.kafka_security_protocol,
        "sasl_mechanism": settings.kafka_sasl_mechanism,
        "sasl_plain_username": settings.kafka_username,
        "sasl_plain_password": settings.kafka_secret(),
    }


def _servers(settings: MintSettings) -> list[str]:
    return [s.strip() for s in settings.kafka_bootstrap.split(",")]


def _listening(address: str) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (within a second)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _unavailable(settings: MintSettings, e: Exception) -> KafkaUnavailable:
    """Why no client could be made: no broker there, or (kafka-python retries a refused login
    until its bootstrap timeout, then says only that) one that would not let this client in."""
    if any(_listening(a) for a in _servers(settings)):
        who = f"as {settings.kafka_username!r} " if settings.kafka_username else ""
        return KafkaUnavailable(
            f"Kafka at {settings.kafka_bootstrap} accepts connections but did not let this "
            f"client in {who}over {settings.kafka_security_protocol}: check the credentials "
            "and the protocol (MINT_KAFKA_SECURITY_PROTOCOL, MINT_KAFKA_USERNAME, "
            f"MINT_KAFKA_PASSWORD(_FILE)), or the broker is still starting ({e})"
        )
    return _no_broker(settings, e)


def _no_broker(settings: MintSettings, e: Exception) -> KafkaUnavailable:
    return KafkaUnavailable(
        f"no Kafka broker at {settings.kafka_bootstrap}: start one with `mint dev up` "
        f"or point MINT_KAFKA_BOOTSTRAP at your cluster ({e})"
    )


def require_broker(settings: MintSettings) -> None:
    """Raise KafkaUnavailable at once when no bootstrap address accepts a TCP connection: for a
    one-shot command, which has nothing to wait for (a new client would retry for kafka-python's
    30 s bootstrap timeout, the grace a worker needs while a broker restarts)."""
    if not any(_listening(a) for a in _servers(settings)):
        raise _no_broker(settings, ConnectionRefusedError("no address accepts a connection"))


def make_producer(settings: MintSettings, **overrides: Any) -> KafkaProducer:
    """A durable producer: acks from all in-sync replicas, idempotent, ordered per partition."""
    options: dict[str, Any] = {
        "bootstrap_servers": _servers(settings),
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "client_id": "mint-producer",
        **_RECONNECT,
        **_security(settings),
    }
    options.update(overrides)
    try:
        return KafkaProducer(**options)
    except KafkaTimeoutError as e:  # kafka-python 3 raises this when bootstrap fails
        raise _unavailable(settings, e) from e


def make_consumer(settings: MintSettings, *topics: str, **overrides: Any) -> KafkaConsumer:
    """A consumer that commits only when told to (after its handler succeeded)."""
    options: dict[str, Any] = {
        "bootstrap_servers": _servers(settings),
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "client_id": "mint-consumer",
        **_RECONNECT,
        **_security(settings),
    }
    options.update(overrides)
    try:
        consumer = KafkaConsumer(**options)
        if topics:
            # Metadata first: a group leader that lacks a topic's metadata when it assigns gives
            # that topic's partitions to nobody until its next metadata refresh (minutes).
            for topic in topics:
                consumer.partitions_for_topic(topic)
            consumer.subscribe(list(topics))
        return consumer
    except KafkaTimeoutError as e:  # kafka-python 3 raises this when bootstrap fails
        raise _unavailable(settings, e) from e


def make_admin(settings: MintSettings, **overrides: Any) -> KafkaAdminClient:
    try:
        return KafkaAdminClient(
            **{
                "bootstrap_servers": _servers(settings),
                "client_id": "mint-admin",
                **_RECONNECT,
                **_security(settings),
                **overrides,
            }
        )
    except KafkaTimeoutError as e:  # kafka-python 3 raises this when bootstrap fails
        raise _unavailable(settings, e) from e
