"""`mint dev up --secure` on its own ports: every refusal the credentials and ACLs promise.

Kafka: no credentials and a wrong password are refused; ``upstream`` writes request topics but
not commands; ``downstream`` reads ``infer.results`` only; a worker writes its own topics and
not another's; ``downstream-<tenant>`` reads its tenant's answers (copied by the router) and
not another tenant's. Cassandra: no login, no session; the ``engine`` role reads the catalog and
may not write it; no role but ``operator`` writes API keys, and each does its own work.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from schemas import make_event
from schemas.events import InferCompleted, InferRequested, PromoteCommand
from schemas.registry import encode_event
from schemas.settings import MintSettings

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> MintSettings:
    from catalog.cluster import connect
    from catalog.migrate import migrate
    from mint.dev import launcher
    from mint.dev.secure import secure_settings, setup
    from streams.topics import ensure_topics

    state = tmp_path_factory.mktemp("secure")
    base = MintSettings().model_copy(
        update={
            "state_dir": Path(state) / "secure",
            "topic_prefix": f"sec-{uuid.uuid4().hex[:6]}",
            "keyspace": f"sec_{uuid.uuid4().hex[:6]}",
            # below Linux's ephemeral range (32768-60999): a client socket of any process can
            # hold a port in it, and a Cassandra start failed on one (bind: address in use)
            "kafka_bootstrap": "127.0.0.1:18092",
            "kafka_controller_port": 18093,
            "cassandra_port": 18042,
            "cassandra_storage_port": 18000,
        }
    )
    admin = secure_settings(base, "admin")
    try:  # a failed start stops what it started too
        launcher.up(admin)
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
    return make_event(
        InferRequested(request_id=uuid.uuid4().hex, prompt="hi"),
        tenant="acme",
        policy="p",
        producer="test/upstream",
    )


def promote():
    return make_event(
        PromoteCommand(alias="prod", revision=1),
        tenant="acme",
        policy="p",
        producer="test/upstream",
    )


def publish_error(settings: MintSettings, env=None, topic: str | None = None) -> Exception | None:
    """What publishing ``env`` (or raw bytes to ``topic``) as ``settings``' principal raised."""
    from streams import EventProducer

    try:
        # 5 s to bootstrap, not 30: kafka-python retries a refused login until then
        with EventProducer(settings, max_block_ms=5000, bootstrap_timeout_ms=5000) as p:
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

    wrong = as_(secure, "upstream").model_copy(
        update={"kafka_password_file": None, "kafka_password": SecretStr("not-it")}
    )
    refused = publish_error(wrong, infer_request())
    # what the user is told: the broker is there, the login is what failed
    assert "did not let this client in as 'upstream'" in str(refused), refused
    assert "check the credentials" in str(refused)
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
    allowed = make_consumer(
        down, secure.topic("infer.results"), group_id=f"{secure.topic_prefix}-downstream-a"
    )
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
            session.execute(
                f"INSERT INTO {secure.keyspace}.policies (tenant, policy) VALUES ('acme', 'forged')"
            )
    finally:
        cluster.shutdown()


# ---------------------------------------------------------------------- each role its own tables


def _session_as(secure: MintSettings, role: str):
    from catalog.cluster import connect

    return connect(as_(secure, role))


def test_cassandra_roles_modify_only_their_own_tables(secure) -> None:
    """The trainer, controller, projector and gateway may not write API keys (they could mint
    themselves one); key management (operator) may. Each role's own work still goes through."""
    from cassandra import Unauthorized

    from catalog.access import AccessRepository
    from catalog.repository import CatalogRepository
    from catalog.state import StateTable
    from mint import security

    admin = as_(secure, "admin")
    cluster, session = _session_as(secure, "admin")  # what earlier versions granted
    try:
        session.execute("GRANT MODIFY ON ALL KEYSPACES TO trainer")
    finally:
        cluster.shutdown()
    security.apply(admin, admin.state_dir / "secrets")  # an upgrade re-applies: revoked
    forged = (
        f"INSERT INTO {secure.keyspace}.api_keys (key_id, tenant) VALUES ('0123456789ab', 'acme')"
    )
    for role in ("trainer", "controller", "projector", "engine", "gateway"):
        cluster, session = _session_as(secure, role)
        try:
            with pytest.raises(Unauthorized):
                session.execute(forged)
        finally:
            cluster.shutdown()

    cluster, session = _session_as(secure, "operator")  # `mint tenants` / `mint keys`
    try:
        access = AccessRepository(session, secure.keyspace)
        access.create_tenant("acme", by="test")
        key, _ = access.create_key("acme", name="ci", by="test")
    finally:
        cluster.shutdown()

    digest = "sha256:" + "a" * 64
    cluster, session = _session_as(secure, "trainer")  # a policy and its revision
    try:
        repo = CatalogRepository(session, secure.keyspace)
        repo.create_policy("acme", "math", "tiny", by="trainer")
        repo.register_revision(
            "acme",
            "math",
            digest=digest,
            store_uri="file:///a",
            source_event_id=uuid.uuid4(),
            by="trainer",
        )
        with pytest.raises(Unauthorized):  # aliases are the controller's
            session.execute(
                f"UPDATE {secure.keyspace}.aliases SET revision = 1 WHERE "
                "tenant = 'acme' AND policy = 'math' AND alias = 'prod'"
            )
    finally:
        cluster.shutdown()

    cluster, session = _session_as(secure, "controller")  # alias moves and its own state
    try:
        from workers.projector.main import check_schema

        check_schema(session, secure.keyspace)  # it refuses a schema behind its build
        CatalogRepository(session, secure.keyspace).move_alias(
            "acme", "math", "prod", 1, expected=None, by="controller", event_id=uuid.uuid4()
        )
        StateTable(session, secure.keyspace, "controller.lifecycle")["acme/math"] = {"at": 1}
        with pytest.raises(Unauthorized):  # revisions are the trainer's and the projector's
            session.execute(
                f"DELETE FROM {secure.keyspace}.revisions WHERE tenant = 'acme' AND policy = 'math'"
            )
    finally:
        cluster.shutdown()

    cluster, session = _session_as(secure, "engine")  # the evaluator reads configured suites
    try:
        state = StateTable(session, secure.keyspace, "controller.lifecycle")
        assert state.get("acme/math") == {"at": 1}
        with pytest.raises(Unauthorized):
            session.execute(f"SELECT * FROM {secure.keyspace}.api_keys LIMIT 1")
    finally:
        cluster.shutdown()

    cluster, session = _session_as(secure, "gateway")  # everything the gateway reads
    try:
        from catalog.apikeys import parse_key
        from gateway.directory import CatalogDirectory

        d = CatalogDirectory(
            CatalogRepository(session, secure.keyspace), AccessRepository(session, secure.keyspace)
        )
        assert d.key(parse_key(key.text)[0]).tenant == "acme" and d.tenant("acme") is not None
        assert d.policy_exists("acme", "math") and d.revision_of_digest("acme", "math", digest) == 1
        assert [m.id for m in d.models("acme")] == ["math@prod"]
        with pytest.raises(Unauthorized):  # nor does it read the controller's state
            session.execute(f"SELECT * FROM {secure.keyspace}.worker_state LIMIT 1")
        # the Tinker API's shared rows are the gateway's own: it writes them, and nothing else
        from catalog.tinker_calls import ModelRecord, TinkerCalls

        calls = TinkerCalls(session, secure.keyspace)
        model = ModelRecord("tk00000000:train:0", "tk00000000-0", "base", 8, True, True)
        calls.add_model("acme", model)
        assert calls.model("acme", model.policy) == model
        with pytest.raises(Unauthorized):
            session.execute(f"DELETE FROM {secure.keyspace}.api_keys WHERE key_id = 'x'")
    finally:
        cluster.shutdown()


# ---------------------------------------------------------------------- a tenant's own answers


def test_a_tenants_principal_reads_its_answers_and_is_refused_anothers(secure) -> None:
    import time

    from kafka import TopicPartition

    from mint.security import ensure_secret
    from streams import EventProducer, make_consumer
    from streams.acls import apply_tenant, tenant_principal
    from streams.topics import tenant_topic
    from workers.router import run_router

    folder = as_(secure, "admin").state_dir / "secrets"
    for tenant in ("acme", "globex"):
        name = f"kafka-{tenant_principal(tenant)}"
        ensure_secret(folder, name)
        apply_tenant(as_(secure, "admin"), tenant, (folder / name).read_text().strip())
    answers = [
        make_event(
            InferCompleted(
                request_id=f"r-{t}",
                revision=1,
                adapter_digest="sha256:" + "1" * 64,
                engine_id="e0",
                text=f"for {t}",
                finish_reason="stop",
                prompt_tokens=1,
                completion_tokens=1,
                latency_ms=1.0,
            ),
            tenant=t,
            policy="p",
            producer="serving/e0",
        )
        for t in ("acme", "globex")
    ]
    with EventProducer(as_(secure, "engine"), max_block_ms=10_000) as p:
        for env in answers:
            p.publish(env, timeout_s=10)
    # (an earlier test wrote a record of junk to infer.results: the router dead-letters it)
    stats = run_router(
        as_(secure, "router"), group_id=f"{secure.topic_prefix}-tenant-router", idle_timeout_s=5
    )
    assert stats.handled == 2, stats

    acme = as_(secure, tenant_principal("acme"))
    own = make_consumer(
        acme, group_id=f"{secure.topic_prefix}.tenant.acme.analytics", auto_offset_reset="earliest"
    )
    try:
        own.subscribe([tenant_topic(secure, "acme")])
        got, deadline = [], time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = [r for rs in own.poll(timeout_ms=500).values() for r in rs]
        assert [r.value for r in got] == [encode_event(answers[0])]
    finally:
        own.close()
    refused = make_consumer(acme)  # globex's topic, and the internal one with every answer
    try:
        topics = [tenant_topic(secure, "globex"), secure.topic("infer.results")]
        refused.assign(
            [TopicPartition(t, p) for t in topics for p in range(secure.topic_partitions)]
        )
        refused.seek_to_beginning()
        got = [r for _ in range(10) for rs in refused.poll(timeout_ms=500).values() for r in rs]
        assert got == [] and set(topics) <= refused._client.cluster.unauthorized_topics
    finally:
        refused.close()
