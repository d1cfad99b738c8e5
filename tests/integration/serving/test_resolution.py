"""Resolution through the real catalog (Cassandra), invalidated by alias.moved events (Kafka)."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from catalog.exceptions import AliasNotFound, RevisionNotFound
from catalog.migrate import migrate
from catalog.projection import execute_serving_command
from catalog.repository import CatalogRepository
from schemas import decode_event, make_event
from schemas.events import PromoteCommand
from streams import EventProducer, ensure_topics, make_consumer
from workers.serving.resolution import ResolutionCache


@pytest.fixture(scope="module")
def repo(cassandra_cluster, base_settings):
    _, session = cassandra_cluster
    keyspace = f"res_{uuid.uuid4().hex[:12]}"
    migrate(session, keyspace, base_settings.keyspace_replication)
    yield CatalogRepository(session, keyspace)
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


def digest(n: int) -> str:
    return "sha256:" + hashlib.sha256(f"adapter {n}".encode()).hexdigest()


def test_alias_moved_event_takes_effect_on_the_next_resolve(settings, repo) -> None:
    ensure_topics(settings)
    t = f"t{uuid.uuid4().hex[:8]}"
    repo.create_policy(t, "chat", "tiny-llama")
    revs = [
        repo.register_revision(t, "chat", digest=digest(i), store_uri=f"file:///store/{t}/chat/{i}")
        for i in (1, 2)
    ]
    now = [0.0]
    cache = ResolutionCache(repo.resolve, ttl_s=600.0, clock=lambda: now[0])
    with pytest.raises(AliasNotFound, match="points nowhere"):
        cache.resolve(f"{t}/chat@prod")
    producer = EventProducer(settings)
    events = make_consumer(
        settings, settings.topic("serving.events"), group_id=f"engine-{uuid.uuid4().hex[:6]}"
    )

    def promote(rev: int) -> None:
        cmd = make_event(
            PromoteCommand(alias="prod", revision=rev),
            tenant=t,
            policy="chat",
            producer="test/operator",
        )
        producer.publish(execute_serving_command(repo, cmd, producer="test/controller"))

    def apply_next() -> None:
        for _ in range(100):
            for recs in events.poll(timeout_ms=200).values():
                for r in recs:
                    cache.apply(decode_event(r.value))
                    return
        raise AssertionError("no alias.moved event arrived")

    try:
        promote(revs[0].revision)
        apply_next()
        assert cache.resolve(f"{t}/chat@prod").digest == digest(1)
        promote(revs[1].revision)
        assert cache.resolve(f"{t}/chat@prod").digest == digest(1)  # cached: not seen yet
        apply_next()
        got = cache.resolve(f"{t}/chat@prod")
        assert (got.revision, got.digest) == (revs[1].revision, digest(2))
    finally:
        events.close()
        producer.close()
    # Immutable references resolve through the catalog too, and are cached without expiry.
    assert cache.resolve(f"{t}/chat@1").digest == digest(1)
    assert cache.resolve(f"{t}/chat@{digest(2)}").revision == revs[1].revision
    with pytest.raises(RevisionNotFound):
        cache.resolve(f"{t}/chat@{digest(9)}")
