"""Work that outlives its poll, against real Kafka: held offsets stay uncommitted until released,
a redelivered request whose answer is already on the results topic is skipped, a rebalance hands
held work to the new owner, and an engine fills its alias cache from policy.state."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest

from schemas import encode_event
from schemas.envelope import make_event
from schemas.events import AliasMoved, InferFailed, InferRequested
from schemas.examples import example_fields
from schemas.settings import MintSettings
from streams import EventProducer, ensure_topics
from streams.deferred import DeferredWork
from streams.group import ConsumerLoop

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


ANSWERS = {"infer.requests": "infer.results"}


def _requests(tenant: str, policy: str, n: int):
    return [
        make_event(
            InferRequested(request_id=f"{policy}-r{i}", prompt="2+2=", max_tokens=4),
            tenant=tenant,
            policy=policy,
            producer="test/upstream",
        )
        for i in range(n)
    ]


def _answer(request) -> object:
    return make_event(
        InferFailed(
            request_id=request.payload.request_id,
            ref="x",
            stage="load",
            error="test answer",
            engine_id="e0",
        ),
        tenant=request.tenant,
        policy=request.policy,
        producer="test/engine",
        caused_by=request,
    )


class Held:
    """A loop whose handler holds every request until the test answers it."""

    def __init__(self, settings: MintSettings, group: str, **options) -> None:
        self.seen: dict[str, object] = {}
        self.revoked: list[set] = []
        self.deferred = DeferredWork(settings, answers=ANSWERS, on_revoked=self.revoked.append)
        self.loop = ConsumerLoop(
            settings, ["infer.requests"], group, self._handle, deferred=self.deferred, **options
        )

    def _handle(self, env, record) -> None:
        self.deferred.hold(record, env.event_id)
        self.seen[env.payload.request_id] = env

    def step_until(self, done, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, "the loop did not get there in time"
            self.loop.step(100)

    def close(self) -> None:
        self.loop.close()


def test_held_requests_are_redelivered_and_answered_ones_skipped(settings: MintSettings) -> None:
    ensure_topics(settings, ["infer.requests", "infer.results", "dlq"])
    reqs = _requests("acme", "chat", 6)
    group = f"{settings.topic_prefix}-serving"
    with EventProducer(settings) as producer:
        producer.publish_many(reqs)
        first = Held(settings, group)
        try:
            first.step_until(lambda: len(first.seen) == 6)
            # Answered out of order, as an engine does when r0 and r2 wait for cold loads.
            answered = [reqs[i] for i in (1, 3, 4, 5)]
            producer.publish_many([_answer(r) for r in answered])
            for r in answered:
                assert first.deferred.release(r.event_id)
            # (a rebalance right after the topics were created may redeliver all six; the
            # answered four are then skipped and r0, r2 held again)
            first.step_until(lambda: first.deferred.held() == 2)
        finally:
            first.close()  # dies with r0 and r2 unanswered: nothing after r0 was committed

        second = Held(settings, group)
        try:
            second.step_until(lambda: second.loop.stats.records >= 6)
            assert sorted(second.seen) == ["chat-r0", "chat-r2"], (
                "only the unanswered are served again"
            )
            assert second.loop.stats.duplicates == 4
            producer.publish_many([_answer(reqs[0]), _answer(reqs[2])])
            second.deferred.release(reqs[0].event_id)
            second.deferred.release(reqs[2].event_id)
            second.loop.step(100)  # commits to the end now
        finally:
            second.close()

    third = Held(settings, group)
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            third.loop.step(200)
        assert third.seen == {} and third.loop.stats.records == 0, "all answered: none redelivered"
    finally:
        third.close()


def test_a_rebalance_moves_held_requests_to_the_new_owner(settings: MintSettings) -> None:
    if settings.topic_partitions < 2:
        pytest.skip("needs two partitions")
    ensure_topics(settings, ["infer.requests", "infer.results", "dlq"])
    reqs = [r for i in range(8) for r in _requests("acme", f"p{i}", 2)]
    group = f"{settings.topic_prefix}-serving"
    a = Held(settings, group)
    b = None
    try:
        with EventProducer(settings) as producer:
            producer.publish_many(reqs)
        a.step_until(lambda: len(a.seen) == len(reqs))
        assert a.deferred.held() == len(reqs)
        b = Held(settings, group)
        # Both members poll until the group has split the partitions between them.
        deadline = time.monotonic() + 40
        while not (
            b.loop.assigned and len(a.loop.consumer.assignment()) < settings.topic_partitions
        ):
            assert time.monotonic() < deadline, "no rebalance"
            a.loop.step(100)
            b.loop.step(100)
        assert a.revoked, "the old owner was told which partitions it lost"
        moved = b.loop.consumer.assignment()
        kept = [r for r in reqs if _partition_of(a, r) not in moved]
        # Held work of the moved partitions goes with them (redelivered from the committed
        # offset); the old owner holds exactly what it kept.
        deadline = time.monotonic() + 30
        while not (a.deferred.held() == len(kept) and b.deferred.held() == len(reqs) - len(kept)):
            assert time.monotonic() < deadline, (a.deferred.held(), b.deferred.held(), len(kept))
            a.loop.step(100)
            b.loop.step(100)
        assert 0 < len(kept) < len(reqs)
    finally:
        a.close()
        if b is not None:
            b.close()


def _partition_of(held: Held, request):
    from kafka import TopicPartition

    from streams.topics import partition_for_key

    topic = held.loop.names[0]
    n = len(held.loop.consumer.partitions_for_topic(topic))
    return TopicPartition(topic, partition_for_key(request.key, n))


def _moved(tenant: str, policy: str, revision: int):
    fields = example_fields("alias.moved", tenant, policy)
    root = fields["store_uri"].rsplit("/", 1)[0]
    fields.update(to_revision=revision, store_uri=f"{root}/{revision}")
    return make_event(AliasMoved(**fields), tenant=tenant, policy=policy, producer="test/ctl")


def test_an_engine_fills_its_alias_cache_from_policy_state_then_follows_moves(
    settings: MintSettings,
) -> None:
    from workers.serving.resolution import ResolutionCache
    from workers.serving.worker import ServingWorker

    ensure_topics(settings)
    state = settings.topic("policy.state")
    before = [_moved("acme", f"p{i}", 2) for i in range(3)]
    with EventProducer(settings) as producer:
        for env in before:  # what the projector writes: the raw alias.moved, keyed policy@alias
            producer.send_raw(state, encode_event(env), f"{env.policy_id}@prod".encode())
        # A move on serving.events that the projector has not put on policy.state yet.
        producer.publish(_moved("acme", "late", 5))

    def catalog_down(ref):
        raise LookupError(f"{ref} is not cached and the catalog is not asked in this test")

    def cached(ref: str) -> int | None:
        try:
            return resolver.resolve(ref).revision
        except LookupError:
            return None

    def step_until(ref: str, revision: int) -> None:
        deadline = time.monotonic() + 20
        while cached(ref) != revision:
            assert time.monotonic() < deadline, f"{ref} never reached revision {revision}"
            worker.step(100)

    resolver = ResolutionCache(catalog_down, ttl_s=60)
    core = SimpleNamespace(
        engine_id=f"e-{uuid.uuid4().hex[:6]}",
        resolver=resolver,
        serves=None,
        drain_events=list,
        serve=list,
        sweep=list,
        stats={},
        in_flight=0,
        flights=SimpleNamespace(wait_idle=lambda timeout_s: True),
        on_alias_moved=lambda env: resolver.apply(env) and [],
    )
    worker = ServingWorker(settings, core)  # reads policy.state before it returns
    try:
        assert [cached(f"acme/{env.policy}@prod") for env in before] == [2, 2, 2]
        step_until("acme/late@prod", 5)  # followed from a minute before start
        with EventProducer(settings) as producer:
            producer.publish(_moved("acme", "p0", 3))
        step_until("acme/p0@prod", 3)  # and every move after it
    finally:
        worker.close()
