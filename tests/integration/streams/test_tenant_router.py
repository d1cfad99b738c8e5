"""The tenant router on a real broker (issue 25, defect 12c): every answer on ``infer.results``
reaches its own tenant's topic, unchanged and in policy order, and no other tenant's."""

from __future__ import annotations

import pytest

from schemas import make_event
from schemas.events import InferCompleted
from schemas.registry import encode_event
from schemas.settings import MintSettings
from tests.integration.streams._streams_helpers import read_topic

pytestmark = pytest.mark.integration
D = "sha256:" + "1" * 64


def answer(tenant: str, policy: str, i: int):
    return make_event(
        InferCompleted(
            request_id=f"r-{tenant}-{policy}-{i}",
            revision=1,
            adapter_digest=D,
            engine_id="e0",
            text=f"{tenant}:{i}",
            finish_reason="stop",
            prompt_tokens=1,
            completion_tokens=1,
            latency_ms=1.0,
        ),
        tenant=tenant,
        policy=policy,
        producer="serving/e0",
    )


def test_each_tenant_gets_only_its_own_answers_in_order(settings: MintSettings) -> None:
    from streams import EventProducer
    from streams.topics import ensure_topics, tenant_topic
    from workers.router import run_router

    ensure_topics(settings, ["infer.results", "dlq"])
    sent = [
        answer(t, p, i)
        for i in range(5)
        for t in ("acme", "acme-x", "globex")
        for p in ("math", "code")
    ]
    with EventProducer(settings) as producer:
        for env in sent:
            producer.publish(env)
        producer.publish(sent[0])  # an at-least-once producer sent one answer twice
    stats = run_router(
        settings,
        group_id=f"{settings.topic_prefix}-tenant-router",
        max_records=len(sent) + 1,
        idle_timeout_s=60,
    )
    assert stats.handled == len(sent) + 1 and stats.dead_lettered == 0

    original = {env.event_id: encode_event(env) for env in sent}
    for tenant in ("acme", "acme-x", "globex"):
        copies = read_topic(settings, tenant_topic(settings, tenant))
        mine = [env for env in sent if env.tenant == tenant]
        got = [r.value for r in copies]
        # each of its answers once (the duplicate copied once), byte for byte, nobody else's
        assert sorted(got) == sorted(original[env.event_id] for env in mine), tenant
        for policy in ("math", "code"):  # one policy's answers keep their order
            key = f"{tenant}/{policy}".encode()
            in_order = [original[e.event_id] for e in mine if e.policy == policy]
            assert [r.value for r in copies if r.key == key] == in_order, (tenant, policy)
