from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.settings import MintSettings


def test_defaults_point_at_the_local_launcher() -> None:
    s = MintSettings()
    assert s.kafka_bootstrap == "127.0.0.1:19092" and s.cassandra_port == 19042
    assert not s.kafka_is_external and not s.cassandra_is_external
    assert s.topic("rollout.requests") == "mint.rollout.requests"


def test_naming_a_remote_cluster_marks_it_external(monkeypatch) -> None:
    monkeypatch.setenv("MINT_KAFKA_BOOTSTRAP", "broker-1:9092,broker-2:9092")
    monkeypatch.setenv("MINT_CASSANDRA_HOSTS", "c1, c2")
    s = MintSettings()
    assert s.kafka_is_external and s.cassandra_is_external
    assert s.cassandra_contact_points == ["c1", "c2"]


def test_a_loopback_cluster_is_managed_unless_marked_external() -> None:
    assert not MintSettings(kafka_bootstrap="localhost:29092").kafka_is_external
    assert MintSettings(kafka_bootstrap="localhost:9092", kafka_external=True).kafka_is_external


@pytest.mark.parametrize(
    ("env", "value", "match"),
    [
        ("MINT_KAFKA_BOOTSTRAP", "localhost", "not host:port"),
        ("MINT_KAFKA_BOOTSTRAP", "a:1,b", "not host:port"),
        ("MINT_TOPIC_PREFIX", "bad prefix!", "topic_prefix"),
        ("MINT_KEYSPACE", "Mint-KS", "keyspace"),
        ("MINT_TOPIC_PARTITIONS", "0", "topic_partitions"),
        ("MINT_CASSANDRA_HEAP_MB", "4096", "cassandra_heap_mb"),
        ("MINT_LOG_LEVEL", "loud", "log_level"),
    ],
)
def test_bad_settings_name_the_field(monkeypatch, env: str, value: str, match: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError, match=match):
        MintSettings()
