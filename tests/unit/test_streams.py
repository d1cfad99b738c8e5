"""streams/ without a broker: the topic registry, retry policy, dead-letter records and the
per-record logic of the consumer loop (with a recording stand-in for the producer)."""

from __future__ import annotations

import threading

import pytest
from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import (
    CommitFailedError,
    KafkaConnectionError,
    KafkaTimeoutError,
    RebalanceInProgressError,
    TopicAuthorizationFailedError,
)

from schemas import EVENT_TYPES, encode_event, make_event
from schemas.events import DeadLetter
from schemas.examples import example_payload
from schemas.settings import MintSettings
from streams import TOPICS, RetryPolicy, StreamsError, TopicError, topic_for, topic_for_type
from streams.exceptions import OutOfGroup
from streams.polling import MembershipWatch, commit_offsets, poll_records
from streams.records import RecordLoop, dead_letter
from streams.replay import Window, fresh_group, load_processor

SETTINGS = MintSettings(topic_prefix="unit")


def _record(value: bytes | None, headers=None, offset: int = 7) -> ConsumerRecord:
    return ConsumerRecord(
        "unit.serving.commands",
        2,
        -1,
        offset,
        0,
        0,
        b"acme/p",
        value,
        headers or [],
        None,
        6,
        len(value or b""),
        0,
    )


def _promote_bytes(revision: int = 1) -> bytes:
    env = make_event(example_payload("serving.promote"), tenant="acme", policy="p", producer="t")
    return encode_event(env).replace(b'"revision":1', f'"revision":{revision}'.encode())


def test_every_event_type_has_a_registry_topic() -> None:
    for event_type, payload in EVENT_TYPES.items():
        assert payload.topic in TOPICS, event_type
        assert topic_for_type(SETTINGS, event_type) == f"unit.{payload.topic}"


def test_policy_state_is_compacted_and_the_rest_retain_by_time() -> None:
    assert TOPICS["policy.state"].configs()["cleanup.policy"] == "compact"
    assert TOPICS["export.events"].configs() == {"cleanup.policy": "delete", "retention.ms": "-1"}
    assert TOPICS["dlq"].configs()["cleanup.policy"] == "delete"


def test_unknown_topics_are_named_in_the_error() -> None:
    with pytest.raises(TopicError, match="'export.event' is not in the registry"):
        topic_for(SETTINGS, "export.event")
    with pytest.raises(TopicError, match="no topic"):
        topic_for_type(SETTINGS, "nope")
    assert isinstance(TopicError("x"), ValueError) and isinstance(TopicError("x"), StreamsError)


def test_retry_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=6, backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(a) for a in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_dead_letter_keeps_bytes_and_replaces_old_reason_headers() -> None:
    record = _record(b"raw", headers=[("trace", b"1"), ("mint.dlq.reason", b"invalid")])
    key, value, headers = dead_letter(record, "undecodable", ValueError("x" * 9000), "g")
    assert (key, value) == (b"acme/p", b"raw")
    assert ("trace", b"1") in headers
    assert [v for k, v in headers if k == "mint.dlq.reason"] == [b"undecodable"]
    letter = DeadLetter.from_headers(headers)
    assert (letter.topic, letter.partition, letter.offset, letter.group) == (
        "unit.serving.commands",
        2,
        7,
        "g",
    )
    assert letter.error.startswith("ValueError: x") and len(letter.error) <= 4000


class _RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, list]] = []

    def send_raw(self, topic, value, key=None, headers=None, timeout_s=30.0):
        self.sent.append((topic, value, key, headers))

    def close(self) -> None:
        pass


def _loop(handler, attempts: int = 3) -> tuple[RecordLoop, _RecordingProducer]:
    producer = _RecordingProducer()
    loop = RecordLoop(
        SETTINGS, "g", handler, RetryPolicy(attempts, 0.001, 0.001), producer, threading.Event()
    )  # type: ignore[arg-type]
    return loop, producer


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff", "undecodable"),
        (b'{"type": "serving.promote", "schema_version": 1}', "invalid"),
        (b'{"type": "serving.nope", "schema_version": 1}', "unknown_type"),
        (b'{"type": "serving.promote", "schema_version": 2}', "unknown_version"),
    ],
)
def test_poison_goes_to_the_dlq_without_calling_the_handler(value: bytes, reason: str) -> None:
    calls = []
    loop, producer = _loop(lambda env, rec: calls.append(env))
    loop.process(_record(value))
    assert calls == []
    (topic, sent_value, key, headers) = producer.sent[0]
    assert topic == "unit.dlq" and sent_value == value and key == b"acme/p"
    assert DeadLetter.from_headers(headers).reason == reason
    assert loop.stats.reasons == {reason: 1}


def test_a_transient_failure_is_retried_then_handled() -> None:
    failures = [RuntimeError("blip")]

    def handler(env, rec) -> None:
        if failures:
            raise failures.pop()

    loop, producer = _loop(handler)
    loop.process(_record(_promote_bytes()))
    assert producer.sent == [] and loop.stats.handled == 1 and loop.stats.retries == 1


@pytest.mark.parametrize(
    "error",
    [ConnectionError("Cassandra down"), TimeoutError("slow"), KafkaTimeoutError("broker away")],
)
def test_an_outage_longer_than_the_attempts_is_waited_out_never_dead_lettered(error) -> None:
    failures = [error] * 12  # three times max_attempts

    def handler(env, rec) -> None:
        if failures:
            raise failures.pop()

    loop, producer = _loop(handler, attempts=4)
    loop.process(_record(_promote_bytes()))
    assert producer.sent == [] and loop.stats.handled == 1
    assert (loop.stats.transient_retries, loop.stats.retries) == (12, 0)


class _CommitOnce:
    """A consumer whose commits fail with ``errors`` (one per call), then succeed."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.committed = list(errors), []

    def commit(self, offsets) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.committed.append({tp: meta.offset for tp, meta in offsets.items()})


@pytest.mark.parametrize(
    "error",
    [
        KafkaConnectionError("111 ECONNREFUSED"),
        KafkaTimeoutError("broker away"),
        CommitFailedError("moved"),
        RebalanceInProgressError("rejoining"),
    ],
)
def test_a_commit_lost_to_an_outage_or_rebalance_is_retried_not_raised(error) -> None:
    # A broker killed while an engine commits must not kill the engine (it did, in the fault
    # injection run): the commit reports failure and the next poll's commit tries again.
    tp = TopicPartition("unit.infer.requests", 0)
    consumer = _CommitOnce(error)
    refused = "refused" if isinstance(error, CommitFailedError) else "deferred"
    assert commit_offsets(consumer, {tp: 5}) == refused
    assert commit_offsets(consumer, {tp: 5}) == "committed"
    assert consumer.committed == [{tp: 5}]


class _PollFails:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def poll(self, timeout_ms: int, max_records: int | None = None):
        raise self.error


def test_a_poll_that_meets_the_broker_away_polls_nothing() -> None:
    # kafka-python raises a failed metadata refresh out of poll() while the broker restarts; the
    # projector died of it in CI's fault-injection run.
    assert poll_records(_PollFails(KafkaConnectionError("111 ECONNREFUSED")), 10) == {}


def test_a_poll_failing_for_another_reason_propagates() -> None:
    with pytest.raises(TopicAuthorizationFailedError):
        poll_records(_PollFails(TopicAuthorizationFailedError("not yours")), 10)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_member_refused_at_every_poll_for_a_minute_is_out_of_its_group() -> None:
    clock = _Clock()
    watch = MembershipWatch("unit-serving", limit_s=60, gap_s=15, clock=clock)
    for _ in range(31):  # a zombie commits at every poll and is refused every time
        watch.note("refused")
        clock.now += 2
    with pytest.raises(OutOfGroup, match="unit-serving.*refused every offset commit"):
        watch.note("refused")


def test_rebalances_outages_and_rejoins_do_not_count_as_absence() -> None:
    clock = _Clock()
    watch = MembershipWatch("unit-serving", limit_s=60, gap_s=15, clock=clock)
    for _ in range(100):  # a refusal now and then (rebalances), commits taken between them
        watch.note("refused")
        clock.now += 5
        watch.note("committed")
    for _ in range(100):  # a long broker outage: commits deferred, membership unknown
        watch.note("deferred")
        clock.now += 5
    for _ in range(5):  # refusals far apart: each a new rebalance
        watch.note("refused")
        clock.now += 30
    for _ in range(20):  # refused for 40 s, then the rejoin's assignment arrives
        watch.note("refused")
        clock.now += 2
    watch.rejoined()
    for _ in range(20):
        watch.note("refused")
        clock.now += 2


def test_a_commit_failing_for_another_reason_propagates() -> None:
    consumer = _CommitOnce(ValueError("bad offsets"))
    with pytest.raises(ValueError):
        commit_offsets(consumer, {TopicPartition("unit.infer.requests", 0): 5})


def test_a_handler_failing_every_attempt_is_dead_lettered_with_the_count() -> None:
    def handler(env, rec) -> None:
        raise KeyError("missing revision")

    loop, producer = _loop(handler, attempts=4)
    loop.process(_record(_promote_bytes()))
    letter = DeadLetter.from_headers(producer.sent[0][3])
    assert letter.reason == "handler_failed" and letter.attempts == 4
    assert letter.event_type == "serving.promote" and "KeyError" in letter.error


def test_window_counts_and_rows() -> None:
    from kafka import TopicPartition

    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    window = Window("t", {a: 3, b: 5}, {a: 10, b: 5})
    assert window.total == 7 and window.rows() == [(0, 3, 10), (1, 5, 5)]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nocolon", "module:factory"),
        ("no.such.module:f", "cannot load"),
        ("streams.replay:nope", "cannot load"),
    ],
)
def test_load_processor_errors(spec: str, match: str) -> None:
    with pytest.raises(StreamsError, match=match):
        load_processor(spec, SETTINGS)


def test_fresh_groups_differ() -> None:
    assert fresh_group("workers.projector:handler") != fresh_group("workers.projector:handler")
    assert fresh_group("a.b:c").startswith("replay.a.b.c.")


def test_kafka_python_checks_crcs_with_the_c_crc32c() -> None:
    # Its pure-Python fallback cost a consumer 40% of its time (README, Benchmarks).
    from kafka.record import util

    assert util.crc32c_c is not None and util._crc32c is util.crc32c_c


def _validation_error() -> Exception:
    from pydantic import BaseModel, ValidationError

    class Temperature(BaseModel):
        value: float

    try:
        Temperature(value="hot")  # type: ignore[arg-type]
    except ValidationError as e:
        return e
    raise AssertionError("pydantic accepted 'hot' as a float")


def _refusals() -> list[Exception]:
    from catalog.exceptions import (
        CatalogRefused,
        CatalogUnauthorized,
        CrossTenantReference,
        InvalidReference,
    )
    from streams.exceptions import Refused

    return [
        Refused("prompt is 20000 tokens, max_model_len is 256"),
        ValueError("temperature 5 is above 2"),
        _validation_error(),
        PermissionError("acme may not read beta's adapter"),
        CrossTenantReference("store URI lies outside acme/p's folder"),
        InvalidReference("digest is not sha256:<64 hex>"),
        CatalogRefused("Cassandra refused: unconfigured table worker_state"),
        CatalogUnauthorized("User trainer has no MODIFY permission"),
    ]


@pytest.mark.parametrize("error", _refusals(), ids=lambda e: type(e).__name__)
def test_a_refused_record_is_dead_lettered_at_once_with_its_reason(error) -> None:
    """A rule the record breaks fails the same way on every attempt: it goes to the dead-letter
    topic on the first one, reason "refused", its error in the headers (issue 25, defect 11),
    and the records behind it are not held up by retries."""
    calls = []

    def handler(env, rec) -> None:
        calls.append(rec.offset)
        raise error

    loop, producer = _loop(handler, attempts=5)
    loop.process(_record(_promote_bytes()))
    letter = DeadLetter.from_headers(producer.sent[0][3])
    assert calls == [7] and loop.stats.retries == 0 and loop.stats.transient_retries == 0
    assert letter.reason == "refused" and letter.attempts == 1
    assert letter.error.startswith(f"{type(error).__name__}: ") and str(error)[:40] in letter.error
    assert loop.stats.reasons == {"refused": 1}


def _unknown_and_transient() -> list[tuple[Exception, str]]:
    from catalog.exceptions import (
        CatalogUnavailable,
        PolicyNotFound,
        RegistrationInProgress,
        StoreUnavailable,
    )

    return [
        (RuntimeError("CUDA error: an illegal memory access"), "unknown"),
        (PolicyNotFound("acme/p is not projected yet"), "unknown"),  # may come in a moment
        (RegistrationInProgress("claimed by another registrant: retry"), "unknown"),
        (CatalogUnavailable("Cassandra did not answer"), "transient"),
        (StoreUnavailable("the adapter store is not reachable (EIO)"), "transient"),
    ]


@pytest.mark.parametrize(
    ("error", "kind"),
    _unknown_and_transient(),
    ids=lambda x: type(x).__name__ if isinstance(x, Exception) else x,
)
def test_unknown_errors_get_the_bounded_retries_and_outages_are_waited_out(error, kind) -> None:
    failures = [error] * 6  # more than max_attempts

    def handler(env, rec) -> None:
        if failures:
            raise failures.pop()

    loop, producer = _loop(handler, attempts=3)
    loop.process(_record(_promote_bytes()))
    if kind == "unknown":
        letter = DeadLetter.from_headers(producer.sent[0][3])
        assert letter.reason == "handler_failed" and letter.attempts == 3
    else:  # never dead-lettered: handled once the outage passed
        assert producer.sent == [] and loop.stats.handled == 1
        assert loop.stats.transient_retries == 6
