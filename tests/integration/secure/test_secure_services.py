"""`mint dev up --secure` on its own ports: every refusal the credentials and ACLs promise.

Kafka: no credentials and a wrong password are refused; ``upstream`` writes request topics but
not commands; ``downstream`` reads ``infer.results`` only; a worker writes its own topics and
not another's. Cassandra: no login, no session; the ``engine`` role reads the catalog and may
not write it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from schemas import make_event
from schemas.events import InferRequested, PromoteCommand
from schemas.settings import MintSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> MintSettings:
    from catalog.cluster import connect
    from catalog.migrate import migrate
    from mint.dev import launcher
    from mint.dev.secure import secure_settings, setup
    from streams.topics import ensure_topics

    state = tmp_path_factory.mktemp("secure")
    base = MintSettings().model_copy(update={
        "state_dir": Path(state) / "secure", "topic_prefix": f"sec-{uuid.uuid4().hex[:6]}",
        "keyspace": f"sec_{uuid.uuid4().hex[:6]}", "kafka_bootstrap": "127.0.0.1:39092",
        "kafka_controller_port": 39093, "cassandra_port": 39042, "cassandra_storage_port": 37000,
    })  # fmt: skip
    admin = secure_settings(base, "admin")
    launcher.up(admin)
    try:
        setup(base)
        ensure_topics(admin)
        cluster, session = connect(admin)
        migrate(session, admin.keyspace, admin.keyspace_replication)
        cluster.shutdown()
        yield base
    finally:
        launcher.down(admin)


def as_(base: MintSettings, principal: str) -> MintSettings:
    from mint.dev.secure import secure_settings

    return secure_settings(base, principal)


def infer_request():
    return make_event(InferRequested(request_id=uuid.uuid4().hex, prompt="hi"), tenant="acme",
                      policy="p", producer="test/upstream")  # fmt: skip


def promote():
    return make_event(PromoteCommand(alias="prod", revision=1), tenant="acme", policy="p",
                      producer="test/upstream")  # fmt: skip


def publish_error(settings: MintSettings, env=None, topic: str | None = None) -> Exception | None:
    """What publishing ``env`` (or raw bytes to ``topic``) as ``settings``' principal raised."""
    from streams import EventProducer

    try:
        with EventProducer(settings, max_block_ms=5000) as p:
            if topic is not None:
                p.send_raw(topic, b"{}", b"acme/p", timeout_s=10)
            else:
                p.publish(env, timeout_s=10)
    except Exception as e:  # the refusal under test, whatever form the client gives it
        return e
    return None


def test_kafka_refuses_no_credentials_and_a_wrong_password(secure) -> None:
    plain = secure.model_copy(update={"kafka_security_protocol": "PLAINTEXT"})
    assert publish_error(plain, infer_request()) is not None
    from pydantic import SecretStr

    wrong = as_(secure, "upstream").model_copy(update={"kafka_password_file": None,
                                                       "kafka_password": SecretStr("not-it")})  # fmt: skip
    assert publish_error(wrong, infer_request()) is not None
    assert publish_error(as_(secure, "upstream"), infer_request()) is None  # the right one


def test_upstream_writes_requests_only(secure) -> None:
    assert publish_error(as_(secure, "upstream"), infer_request()) is None
    refused = publish_error(as_(secure, "upstream"), promote())
    assert refused is not None and "uthoriz" in repr(refused.__cause__ or refused)


def test_downstream_reads_results_only(secure) -> None:
    import time

    from kafka import TopicPartition

    from streams import make_consumer

    down = as_(secure, "downstream")
    allowed = make_consumer(down, secure.topic("infer.results"),
                            group_id=f"{secure.topic_prefix}-downstream-a")  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not allowed.assignment() and time.monotonic() < deadline:
            allowed.poll(timeout_ms=500)
        assert allowed.assignment(), "downstream could not join its group on infer.results"
    finally:
        allowed.close()
    from streams import EventProducer

    with EventProducer(as_(secure, "upstream"), max_block_ms=10_000) as p:
        p.publish(infer_request(), timeout_s=10)  # there is something to read
    topic = secure.topic("infer.requests")
    refused = make_consumer(down)
    try:
        refused.assign([TopicPartition(topic, p) for p in range(secure.topic_partitions)])
        refused.seek_to_beginning()
        got = [r for _ in range(10) for rs in refused.poll(timeout_ms=500).values() for r in rs]
        # kafka-python logs the broker's TOPIC_AUTHORIZATION_FAILED rather than raising it
        assert got == [] and topic in refused._client.cluster.unauthorized_topics
    finally:
        refused.close()


def test_a_worker_writes_its_own_topics_not_anothers(secure) -> None:
    engine = as_(secure, "engine")
    assert publish_error(engine, topic=secure.topic("infer.results")) is None
    refused = publish_error(engine, topic=secure.topic("export.events"))  # the trainer's topic
    assert refused is not None and "uthoriz" in repr(refused.__cause__ or refused)


def test_cassandra_refuses_no_login_and_the_engine_may_only_read(secure) -> None:
    from cassandra import Unauthorized

    from catalog.cluster import CassandraUnavailable, connect

    anon = as_(secure, "engine").model_copy(update={"cassandra_username": ""})
    with pytest.raises(CassandraUnavailable):
        connect(anon)
    engine = as_(secure, "engine")
    cluster, session = connect(engine)
    try:
        session.execute(f"SELECT * FROM {secure.keyspace}.policies LIMIT 1")  # allowed
        with pytest.raises(Unauthorized):
            session.execute(f"INSERT INTO {secure.keyspace}.policies (tenant, policy) "
                            "VALUES ('acme', 'forged')")  # fmt: skip
    finally:
        cluster.shutdown()
