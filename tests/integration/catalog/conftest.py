"""One migrated keyspace per test module (migrating takes a few seconds); each test gets its own
tenant, so tests never see each other's rows."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator

import pytest

from catalog.migrate import migrate
from catalog.repository import CatalogRepository


def digest_of(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def uri_of(tenant: str, policy: str, n: int) -> str:
    return f"file:///store/{tenant}/{policy}/{n}"


@pytest.fixture(scope="module")
def catalog_keyspace(cassandra_cluster, base_settings) -> Iterator[tuple[object, str]]:
    _, session = cassandra_cluster
    keyspace = f"cat_{uuid.uuid4().hex[:12]}"
    migrate(session, keyspace, base_settings.keyspace_replication)
    yield session, keyspace
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


@pytest.fixture(scope="module")
def repo(catalog_keyspace) -> CatalogRepository:
    return CatalogRepository(*catalog_keyspace)


@pytest.fixture
def tenant() -> str:
    return f"t{uuid.uuid4().hex[:12]}"
