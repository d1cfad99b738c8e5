"""faust-streaming against real Kafka, with the click this environment really has.

The lock overrides faust's ``click<8.4`` pin (huggingface-hub needs click>=8.4.2; see
requirements/check.py). This test runs a real faust worker through faust's own click CLI
(``app.main()`` → ``worker``), with an agent and a table, consuming a registry topic.
"""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from importlib import metadata

from packaging.version import Version

from schemas.events import DeadLetter
from schemas.settings import MintSettings
from streams import EventProducer, ensure_topics, make_admin
from tests.integration.streams._streams_helpers import (
    promote,
    read_topic,
    start_worker,
    wait_until,
)


def test_faust_agent_and_table_consume_real_kafka_with_new_click(
    settings: MintSettings, tmp_path
) -> None:
    assert Version(metadata.version("click")) >= Version("8.4.2")  # the overridden pin
    settings = settings.model_copy(update={"state_dir": tmp_path})
    ensure_topics(settings, ["serving.commands", "dlq"])  # before the worker starts
    counts_topic = settings.topic("test.counts")
    admin = make_admin(settings)
    admin.create_topics({counts_topic: {"num_partitions": 1, "replication_factor": 1}})
    admin.close()

    policies = ["math-rl", "code-rl", "chat"]
    with EventProducer(settings) as producer:
        producer.publish_many([promote("acme", p, rev) for rev in range(1, 5) for p in policies])
        producer.send_raw(settings.topic("serving.commands"), b"{not json", b"acme/chat")

    worker = start_worker(
        "faust_counter.py", settings, "worker", "-l", "warn", MINT_STATE_DIR=str(tmp_path)
    )
    try:
        wait_until(lambda: len(read_topic(settings, counts_topic)) >= 12, 60, "12 counts")
        letters = read_topic(settings, settings.topic("dlq"))
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            output, _ = worker.communicate(timeout=20)
        except Exception:
            worker.kill()
            output, _ = worker.communicate()
    reports = [json.loads(r.value) for r in read_topic(settings, counts_topic)]
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for report in reports:
        seen[report["policy"]].append((report["count"], report["revision"]))
    assert dict(seen) == {f"acme/{p}": [(i, i) for i in range(1, 5)] for p in policies}, output
    assert [DeadLetter.from_headers(r.headers).reason for r in letters] == ["undecodable"]

    # The table's changelog topic has the registry's partition count (faust requires it).
    admin = make_admin(settings)
    changelog = f"{settings.topic_prefix}.counter-counts-changelog"
    (meta,) = admin.describe_topics([changelog])
    admin.close()
    assert len(meta["partitions"]) == settings.topic_partitions
    assert len(read_topic(settings, changelog)) >= 3
    admin = make_admin(settings)
    admin.delete_topics(
        [t for t in admin.list_topics() if t.startswith(f"{settings.topic_prefix}.")]
    )
    admin.close()
