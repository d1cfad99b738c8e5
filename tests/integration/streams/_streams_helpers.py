"""Helpers for the streams integration tests: read a topic to its end, run worker scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kafka import TopicPartition

from schemas.settings import MintSettings
from streams.follower import Follower

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def read_topic(settings: MintSettings, topic: str, isolation: str = "read_committed") -> list:
    """Every record of a broker topic, from the beginning up to its current end, in order per
    partition (partition 0 first)."""
    with Follower(settings, isolation_level=isolation) as follower:
        tps = follower.partitions(topic)
        follower.assign(tps, "beginning")
        out: dict[TopicPartition, list] = {tp: [] for tp in tps}
        deadline = time.monotonic() + 15
        for records in follower.read_to(timeout_ms=300):
            assert time.monotonic() < deadline, f"could not read {topic} to its end in 15 s"
            for r in records:
                out[TopicPartition(r.topic, r.partition)].append(r)
        return [r for tp in tps for r in out[tp]]


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

    return make_event(
        PromoteCommand(revision=revision), tenant=tenant, policy=policy, producer="test/cli"
    )
