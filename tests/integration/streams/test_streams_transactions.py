"""The transactional helper against real Kafka, with a processor really killed mid-transaction."""

from __future__ import annotations

import signal
from collections import Counter

from schemas import decode_event
from schemas.settings import MintSettings
from streams import EventProducer, ensure_topics
from tests.integration.streams._streams_helpers import promote, read_topic, start_worker, wait_until


def test_killed_transaction_is_invisible_and_restart_yields_exactly_one_output_per_input(
    settings: MintSettings, tmp_path
) -> None:
    ensure_topics(settings, ["serving.commands", "serving.events", "dlq"])
    inputs = [promote("acme", "math-rl", rev) for rev in range(1, 9)]
    with EventProducer(settings) as producer:
        producer.publish_many(inputs)
    out_topic = settings.topic("serving.events")

    first = start_worker("transactional_worker.py", settings, str(tmp_path), KILL_AT_REVISION="5")
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), 20, "the processor to reach revision 5")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)

    # Outputs of revisions 1-4 reached the broker inside the open transaction...
    uncommitted = read_topic(settings, out_topic, isolation="read_uncommitted")
    assert len(uncommitted) >= 1, "the killed transaction should have written some output"
    # ...but a read_committed reader sees none of them.
    assert read_topic(settings, out_topic) == []

    second = start_worker("transactional_worker.py", settings, str(tmp_path), IDLE_S="3")
    output, _ = second.communicate(timeout=40)
    assert second.returncode == 0, output

    outputs = [decode_event(r.value) for r in read_topic(settings, out_topic)]
    causes = Counter(o.causation_id for o in outputs)
    assert causes == Counter({i.event_id: 1 for i in inputs}), "exactly one output per input"
    assert [o.payload.to_revision for o in outputs] == list(range(1, 9))  # order kept
    assert all(o.correlation_id == i.event_id for o, i in zip(outputs, inputs, strict=True))


def test_poison_inside_transactions_is_dead_lettered_once(settings: MintSettings) -> None:
    from schemas.envelope import make_event
    from schemas.events import AliasMoved, DeadLetter
    from streams import RetryPolicy
    from streams.transactional import run_transactional

    ensure_topics(settings, ["serving.commands", "serving.events", "dlq"])
    topic = settings.topic("serving.commands")
    with EventProducer(settings) as producer:
        producer.publish(promote("acme", "p", 1))
        producer.send_raw(topic, b"\x00garbage", b"acme/p")
        producer.publish(promote("acme", "p", 2))
        producer.publish(promote("acme", "p", 13))

    def flaky(envelope, record):
        if envelope.payload.revision == 13:
            raise RuntimeError("cannot promote 13")
        moved = AliasMoved(
            alias="prod",
            to_revision=envelope.payload.revision,
            cause="promote",
            adapter_digest="sha256:" + "ab" * 32,
            store_uri=f"s3://store/acme/p/revisions/{envelope.payload.revision}",
        )
        return [make_event(moved, tenant="acme", policy="p", producer="t", caused_by=envelope)]

    stats = run_transactional(
        settings,
        ["serving.commands"],
        "tx-poison",
        "tx-poison-0",
        flaky,
        max_records=4,
        retry=RetryPolicy(2, 0.01),
    )
    assert (stats.handled, stats.dead_lettered) == (2, 2)
    outputs = [
        decode_event(r.value).payload.to_revision
        for r in read_topic(settings, settings.topic("serving.events"))
    ]
    assert outputs == [1, 2]
    reasons = [
        DeadLetter.from_headers(r.headers).reason
        for r in read_topic(settings, settings.topic("dlq"))
    ]
    assert reasons == ["undecodable", "handler_failed"]
