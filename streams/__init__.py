"""Kafka plumbing: topic registry, producers, consumer loops, dead letters, replay."""

from streams.clients import KafkaUnavailable, make_admin, make_consumer, make_producer

__all__ = ["KafkaUnavailable", "make_admin", "make_consumer", "make_producer"]
