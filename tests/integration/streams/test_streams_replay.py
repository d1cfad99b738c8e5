"""Operator replay and tail against real Kafka: a time window yields exactly that window."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime

from schemas import decode_event
from schemas.settings import MintSettings
from streams import EventProducer, ensure_topics, make_admin
from streams.replay import REPLAY_HEADER, redrive, republish, resolve_window
from tests.integration.streams import replay_processor
from tests.integration.streams._streams_helpers import promote, read_topic, worker_env


def _three_batches(settings: MintSettings):
    """Events before t1, between t1 and t2, after t2 (several policies, so several partitions)."""
    ensure_topics(settings, ["serving.commands", "serving.events", "dlq"])
    with EventProducer(settings) as producer:
        before = [promote("acme", f"p{i}", 1) for i in range(4)]
        producer.publish_many(before)
        time.sleep(0.2)
        t1 = datetime.now(UTC)
        time.sleep(0.05)
        inside = [promote("acme", f"p{i}", 2) for i in range(6)]
        producer.publish_many(inside)
        time.sleep(0.05)
        t2 = datetime.now(UTC)
        time.sleep(0.2)
        after = [promote("acme", f"p{i}", 3) for i in range(4)]
        producer.publish_many(after)
    return t1, t2, before, inside, after


def test_replaying_a_time_window_yields_exactly_that_window(settings: MintSettings) -> None:
    t1, t2, _, inside, _ = _three_batches(settings)
    source = settings.topic("serving.commands")
    window = resolve_window(settings, source, from_time=t1, to_time=t2)
    assert window.total == len(inside)

    target = settings.topic("replayed")
    admin = make_admin(settings)
    admin.create_topics({target: {"num_partitions": 3, "replication_factor": 1}})
    admin.close()
    assert republish(settings, window, target) == len(inside)
    copied = read_topic(settings, target)
    assert sorted(str(decode_event(r.value).event_id) for r in copied) == sorted(
        str(e.event_id) for e in inside
    )
    assert all(dict(r.headers)[REPLAY_HEADER].startswith(source.encode()) for r in copied)

    replay_processor.SEEN.clear()
    group, stats = redrive(settings, window, "tests.integration.streams.replay_processor:factory")
    assert group.startswith("replay.") and stats.handled == len(inside)
    assert sorted(replay_processor.SEEN) == sorted(str(e.event_id) for e in inside)


def test_replay_by_offsets_and_dry_run_cli(settings: MintSettings) -> None:
    t1, t2, before, inside, after = _three_batches(settings)
    env = worker_env(settings)
    cli = [sys.executable, "-m", "mint.cli"]
    dry = subprocess.run(
        [
            *cli,
            "replay",
            "serving.commands",
            "--from-time",
            t1.isoformat(),
            "--to-time",
            t2.isoformat(),
            "--to-topic",
            "serving.events",
            "--dry-run",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert f"would re-publish {len(inside)} records" in dry.stdout
    assert read_topic(settings, settings.topic("serving.events")) == []  # dry run changed nothing

    real = subprocess.run(
        [
            *cli,
            "replay",
            "serving.commands",
            "--from-offset",
            "0",
            "--to-offset",
            "1",
            "--to-topic",
            "serving.events",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert real.returncode == 0, real.stderr
    partitions_used = len(
        {r.partition for r in read_topic(settings, settings.topic("serving.commands"))}
    )
    assert f"re-published {partitions_used} records" in real.stdout  # offset 0 of each partition

    tail = subprocess.run(
        [*cli, "tail", "serving.commands", "--from-beginning", "--limit", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.strip().splitlines()
    assert len(lines) == 3 and all(
        "serving.promote v1" in line and "acme/p" in line for line in lines
    )

    bad = subprocess.run(
        [*cli, "replay", "nope.topic", "--to-topic", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "does not exist" in bad.stderr
