"""Shared fixtures. Services are started once per run (`mint dev up`, or `.ci/run`); each test
gets its own topic prefix and keyspace instead of restarting anything.

Locally, tests that need Kafka or Cassandra skip with a reason when the service is down; under
CI=true a missing service is a failure.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.settings import MintSettings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tier markers follow the folder: tests/unit, tests/integration, tests/e2e. Every e2e test
    is also ``slow`` (each module starts worker processes, most a vLLM engine), so that
    ``pytest -m "not slow"`` is the quick tier: unit tests and the quick integration tests."""
    for item in items:
        tier = Path(item.fspath).relative_to(TESTS).parts[0]
        if tier in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "e2e":
            item.add_marker(pytest.mark.slow)


def _service_missing(what: str) -> None:
    message = f"{what} is not reachable: run `mint dev up` (or `make up`) first"
    if IN_CI:
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def base_settings() -> MintSettings:
    return MintSettings()


@pytest.fixture(scope="session")
def kafka_ready(base_settings: MintSettings) -> MintSettings:
    from kafka.errors import KafkaError

    from streams.clients import KafkaUnavailable, make_admin

    try:
        admin = make_admin(base_settings, request_timeout_ms=5000)
        admin.list_topics()
        admin.close()
    except (KafkaUnavailable, KafkaError, OSError) as e:
        _service_missing(f"Kafka at {base_settings.kafka_bootstrap} ({e})")
    return base_settings


@pytest.fixture(scope="session")
def cassandra_cluster(base_settings: MintSettings):
    from catalog.cluster import CassandraUnavailable, connect

    try:
        cluster, session = connect(base_settings)
    except CassandraUnavailable as e:
        _service_missing(f"Cassandra ({e})")
    yield cluster, session
    cluster.shutdown()


@pytest.fixture
def settings(kafka_ready: MintSettings, tmp_path: Path) -> Iterator[MintSettings]:
    """Settings with a topic prefix and keyspace of this test's own; its topics are deleted
    afterwards (a suite run would otherwise leave ~10,000 partitions on the broker, and a broker
    with a 512 MB heap ran out of memory on them)."""
    from streams.topics import delete_topics

    tag = uuid.uuid4().hex[:10]
    s = kafka_ready.model_copy(
        update={
            "topic_prefix": f"t{tag}",
            "keyspace": f"t{tag}",
            "store_uri": str(tmp_path / "store"),
        }
    )
    yield s
    try:
        delete_topics(s)
    except Exception as e:  # cleanup only: a test's verdict never depends on it
        logging.getLogger(__name__).warning("could not delete the test's topics: %s", e)


@pytest.fixture
def cassandra(cassandra_cluster, base_settings: MintSettings) -> Iterator[tuple[object, str]]:
    """A (session, keyspace) pair with a fresh keyspace, dropped afterwards."""
    from catalog.cluster import ensure_keyspace

    _, session = cassandra_cluster
    keyspace = f"t{uuid.uuid4().hex[:12]}"
    ensure_keyspace(session, keyspace, base_settings.keyspace_replication)
    yield session, keyspace
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


@pytest.fixture
def live(settings: MintSettings, cassandra_cluster):
    """Registry topics created and the catalog migrated under this test's prefix and keyspace;
    yields the Cassandra session and drops the keyspace afterwards."""
    from catalog.migrate import migrate
    from streams.topics import ensure_topics

    _, session = cassandra_cluster
    ensure_topics(settings)
    migrate(session, settings.keyspace, settings.keyspace_replication)
    yield session
    session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
