"""Each failure is handled as what it is, against real Kafka and Cassandra (issue 25): a record a
handler refuses by rule is dead-lettered on its first attempt with its reason, a statement
Cassandra refuses (a permanent catalog error) is dead-lettered instead of waited out for ever,
and the redelivery check reads a results tail longer than one bounded call across calls."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from schemas import encode_event
from schemas.envelope import make_event
from schemas.events import DeadLetter, InferFailed, InferRequested
from schemas.settings import MintSettings
from streams import EventProducer, RetryPolicy, ensure_topics, run_consumer
from streams.answered import AnswerLog, AnswersPending
from streams.deferred import DeferredWork
from streams.exceptions import Refused
from streams.group import ConsumerLoop
from tests.integration.streams._streams_helpers import promote, read_topic


def _letters(settings: MintSettings) -> list[tuple[DeadLetter, bytes]]:
    return [
        (DeadLetter.from_headers(r.headers), r.value)
        for r in read_topic(settings, settings.topic("dlq"))
    ]


def test_a_refused_record_is_dead_lettered_on_its_first_attempt(settings: MintSettings) -> None:
    ensure_topics(settings, ["serving.commands", "dlq"])
    events = [promote("acme", "math-rl", rev) for rev in (1, 66, 2)]  # one key: one partition
    with EventProducer(settings) as producer:
        producer.publish_many(events)
    calls: list[int] = []

    def handle(env, record) -> None:
        calls.append(env.payload.revision)
        if env.payload.revision == 66:
            raise Refused("revision 66 is retired: promote a live revision")

    # Five attempts 2 s apart would take 30 s; a refusal takes none of them.
    started = time.monotonic()
    stats = run_consumer(
        settings,
        ["serving.commands"],
        "refusals",
        handle,
        max_records=3,
        retry=RetryPolicy(max_attempts=5, backoff_s=2.0, max_backoff_s=8.0),
    )
    assert calls == [1, 66, 2] and (stats.handled, stats.dead_lettered, stats.retries) == (2, 1, 0)
    assert time.monotonic() - started < 20
    [(letter, value)] = _letters(settings)
    assert value == encode_event(events[1])  # the original bytes, for `mint replay` once fixed
    assert (letter.reason, letter.attempts) == ("refused", 1)
    assert letter.error == "Refused: revision 66 is retired: promote a live revision"
    assert letter.event_id == str(events[1].event_id)


@pytest.fixture
def state_keyspace(cassandra_cluster, settings: MintSettings):
    """A keyspace of this test's own holding the worker_state table (migration 0002)."""
    _, session = cassandra_cluster
    ks = settings.keyspace
    session.execute(f"CREATE KEYSPACE {ks} WITH replication = {settings.keyspace_replication}")
    session.execute(
        f"CREATE TABLE {ks}.worker_state (name text, key text, value text, "
        "updated_at timestamp, PRIMARY KEY ((name, key)))"
    )
    yield session, ks
    session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


def test_a_statement_cassandra_refuses_is_dead_lettered_not_waited_out(
    settings: MintSettings, state_keyspace
) -> None:
    """A real InvalidRequest (the table is gone: a schema behind the code) used to count as an
    outage: the loop waited it out for ever with /readyz at 503. It fails loudly now: the record
    is dead-lettered at once with the statement in its reason, and the next record flows."""
    from catalog.state import StateTable

    session, ks = state_keyspace
    state = StateTable(session, ks, "refusal-test")
    ensure_topics(settings, ["serving.commands", "dlq"])
    events = [promote("acme", "math-rl", rev) for rev in (1, 2, 3)]
    with EventProducer(settings) as producer:
        producer.publish_many(events)
    handled: list[int] = []

    def handle(env, record) -> None:
        if env.payload.revision == 2:
            session.execute(f"DROP TABLE {ks}.worker_state")
        if env.payload.revision <= 2:
            state[str(env.event_id)] = {"revision": env.payload.revision}
        handled.append(env.payload.revision)

    stop = threading.Event()
    timer = threading.Timer(45, stop.set)  # before the fix the loop never got past revision 2
    timer.start()
    try:
        stats = run_consumer(
            settings,
            ["serving.commands"],
            "catalog-refused",
            handle,
            stop=stop,
            max_records=3,
            retry=RetryPolicy(5, 0.2, 1.0),
        )
    finally:
        timer.cancel()
    assert handled == [1, 3] and stats.transient_retries == 0 and stats.retries == 0
    [(letter, _)] = _letters(settings)
    assert (letter.reason, letter.attempts) == ("refused", 1)
    assert letter.error.startswith("CatalogRefused: Cassandra refused a request for worker state")
    assert f"INSERT INTO {ks}.worker_state" in letter.error
    assert "worker_state does not exist" in letter.error and "mint catalog migrate" in letter.error


def _answers(settings: MintSettings, n: int) -> tuple[list, int, int]:
    """``n`` answers of one policy on infer.results (one partition); returns the requests they
    answer, that partition, and the partition count."""
    ensure_topics(settings, ["infer.requests", "infer.results"])
    requests = [
        make_event(
            InferRequested(request_id=f"r{i}", prompt="2+2=", max_tokens=4),
            tenant="acme",
            policy="p",
            producer="test/upstream",
        )
        for i in range(n)
    ]
    topic = settings.topic("infer.results")
    with EventProducer(settings) as producer:
        futures = [
            producer.send_async(
                topic,
                encode_event(
                    make_event(
                        InferFailed(
                            request_id=r.payload.request_id,
                            ref="x",
                            stage="load",
                            error="test answer",
                            engine_id="e0",
                        ),
                        tenant="acme",
                        policy="p",
                        producer="test/engine",
                        caused_by=r,
                    )
                ),
                r.policy_id.encode(),
            )
            for r in requests
        ]
        partition = futures[-1].get(timeout=30).partition
    return requests, partition, settings.topic_partitions


def test_a_results_tail_longer_than_one_call_is_read_to_its_end_across_calls(
    settings: MintSettings,
) -> None:
    """Each call reads for its budget and stops; the next goes on from the offsets reached, so
    the tail is read to its end and an answer near the end is found. With no budget a call is
    one poll (at most 500 records): a read that started again at every call, as it did after
    its 30 s, would never get past the first poll."""
    requests, partition, count = _answers(settings, 6000)
    answers = AnswerLog(settings, settings.topic("infer.results"), budget_s=0.0)
    now_ms = int(time.time() * 1000)
    calls, pending = 0, []
    try:
        while True:
            calls += 1
            assert calls <= 400, "the answer log made no progress from one call to the next"
            try:
                answered = answers.since(partition, count, now_ms)
                break
            except AnswersPending as e:  # what the consumer loop waits out and calls again
                pending.append(str(e))
    finally:
        answers.close()
    assert calls >= 6000 // 500  # each call went on from the last: none read a record twice
    assert answered == {r.event_id for r in requests}
    assert "left to read" in pending[0] and "the next call goes on from there" in pending[0]
    assert requests[-1].event_id in answered and uuid.uuid4() not in answered


def test_a_redelivered_request_behind_a_long_tail_is_skipped_by_the_loop(
    settings: MintSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer loop waits out the pending check, polling to stay in its group, and then
    skips the request answered at the end of the tail and handles the one never answered."""
    monkeypatch.setattr("streams.answered.BUDGET_S", 0.0)  # one poll per call
    requests, _, _ = _answers(settings, 3000)
    fresh = make_event(
        InferRequested(request_id="new", prompt="2+2=", max_tokens=4),
        tenant="acme",
        policy="p",
        producer="test/upstream",
    )
    with EventProducer(settings) as producer:
        producer.publish_many([requests[-1], fresh])  # the last one was answered already
    handled: list[str] = []
    loop = ConsumerLoop(
        settings,
        ["infer.requests"],
        "answers-tail",
        lambda env, rec: handled.append(env.payload.request_id),
        deferred=DeferredWork(settings, answers={"infer.requests": "infer.results"}),
        retry=RetryPolicy(backoff_s=0.01, max_backoff_s=0.05),
        auto_offset_reset="earliest",
    )
    stats = loop.run(max_records=2, idle_timeout_s=60)
    assert handled == ["new"] and stats.duplicates == 1
    assert stats.transient_retries > 1  # the check took several bounded calls
