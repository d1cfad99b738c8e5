"""The reply router's choice, record by record (no Kafka): an instance completes only the
futures of its own requests; other instances' answers are skipped before decoding."""

from __future__ import annotations

import asyncio

from gateway.metrics import GatewayMetrics
from gateway.replies import ReplyRouter
from schemas import encode_event, make_event
from schemas.events import InferCompleted, InferRequested
from schemas.settings import MintSettings


def request(rid: str):
    return make_event(
        InferRequested(request_id=rid, prompt="hi"), tenant="acme", policy="m", producer="gateway/x"
    )


def answer(req) -> bytes:
    p = InferCompleted(
        request_id=req.payload.request_id,
        revision=1,
        adapter_digest="sha256:" + "a" * 64,
        engine_id="e0",
        text="yo",
        finish_reason="stop",
        prompt_tokens=1,
        completion_tokens=1,
        latency_ms=1,
    )
    return encode_event(
        make_event(p, tenant="acme", policy="m", producer="serving/e0", caused_by=req)
    )


def test_only_own_answers_complete_futures() -> None:
    router = ReplyRouter(MintSettings(topic_prefix="t1"), "gw-a", GatewayMetrics())
    assert router.topic == "t1.infer.results" and router.prefix == "gw-a."

    async def scenario() -> None:
        mine, late = request("gw-a.1.0"), request("gw-a.2.0")
        others = [request("gw-b.1.0"), request("gw-ab.1.0"), request("sdk-123")]
        future = router.expect(mine.event_id)
        for env in others:  # another instance's (even one whose id starts like ours) or the SDK's
            router._route(answer(env))
        router._route(answer(late))  # ours, but nobody waits for it (timed out)
        router._route(b"not json gw-a. at all")
        assert not future.done()
        router._route(answer(mine))
        got = await asyncio.wait_for(future, 1)
        assert got.causation_id == mine.event_id and got.payload.text == "yo"
        router._route(answer(mine))  # a second copy (redelivery): nobody waits any more

    asyncio.run(scenario())
    assert router.counts == {"own": 1, "late": 2, "foreign": 3, "undecodable": 1}
