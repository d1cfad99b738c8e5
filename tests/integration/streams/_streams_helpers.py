"""Helpers for the streams integration tests: read a topic to its end, run worker scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kafka import TopicPartition

from schemas.settings import MintSettings
from streams.clients import make_consumer

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def read_topic(settings: MintSettings, topic: str, isolation: str = "read_committed") -> list:
    """Every record of a broker topic, from the beginning up to its current end, in order per
    partition (partition 0 first)."""
    consumer = make_consumer(settings, group_id=None, isolation_level=isolation)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: dict[TopicPartition, list] = {tp: [] for tp in tps}
        deadline = time.monotonic() + 15
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} to its end in 15 s"
            for tp, records in consumer.poll(timeout_ms=300).items():
                out[tp].extend(records)
        return [r for tp in tps for r in out[tp]]
    finally:
        consumer.close()


def wait_until(predicate, timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)


def worker_env(settings: MintSettings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MINT_TOPIC_PREFIX": settings.topic_prefix,
            "MINT_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "MINT_TOPIC_PARTITIONS": str(settings.topic_partitions),
            "MINT_STATE_DIR": str(settings.state_dir),
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


def start_worker(script: str, settings: MintSettings, *args: str, **env: str) -> subprocess.Popen:
    """Start one of this folder's worker scripts as a real process (so it can really be killed)."""
    return subprocess.Popen(
        [sys.executable, str(HERE / script), *args],
        env=worker_env(settings, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def promote(tenant: str, policy: str, revision: int):
    from schemas.envelope import make_event
    from schemas.events import PromoteCommand

    return make_event(PromoteCommand(revision=revision), tenant=tenant, policy=policy,
                      producer="test/cli")  # fmt: skip
