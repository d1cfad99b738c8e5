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
