"""The consumer loop's Prometheus metrics (served on ``MINT_METRICS_PORT`` by streams.health).

Labels stay bounded: ``group`` and ``topic`` are the process's own (a worker subscribes to a
fixed set of topics), ``outcome`` and ``reason`` are closed sets (``reason`` is
``schemas.events.dead_letter.Reason``), ``partition`` is the topic's partition count.

- ``mint_consumer_records_total{group,topic,outcome}``: records finished, ``outcome`` handled,
  dead_lettered or duplicate (a redelivered request whose answer was already published);
- ``mint_consumer_dead_letters_total{group,topic,reason}``: records sent to the dead-letter
  topic, by reason;
- ``mint_consumer_transient_failures_total{group}``: handler failures that were waited out;
- ``mint_consumer_lag_records{group,topic,partition}``: records on the partition not read yet
  (the broker's high watermark minus the consumer's position, refreshed at most once a second
  from what the last fetch said: no extra request to the broker);
- ``mint_consumer_held_records{group}``: records read but held uncommitted until their work is
  done (a serving request waiting for its cold load);
- ``mint_consumer_restarts_total{group,reason}``: consumers a loop replaced because a partition
  stalled (streams.stall; ``reason`` never_fetched, no_position, not_handed_out, no_heartbeat or
  no_coordinator).

(``mint_consumer_waiting_out_outage{group}`` is in streams.health.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from kafka import KafkaConsumer
from kafka.errors import KafkaError
from prometheus_client import Counter, Gauge

RECORDS = Counter(
    "mint_consumer_records", "records finished by a consumer loop", ["group", "topic", "outcome"]
)
DEAD_LETTERS = Counter(
    "mint_consumer_dead_letters",
    "records sent to the dead-letter topic",
    ["group", "topic", "reason"],
)
TRANSIENT = Counter(
    "mint_consumer_transient_failures",
    "handler failures that were waited out (never dead-lettered)",
    ["group"],
)
LAG = Gauge(
    "mint_consumer_lag_records",
    "records on the partition that the consumer has not read yet (high watermark - position)",
    ["group", "topic", "partition"],
)
RESTARTS = Counter(
    "mint_consumer_restarts",
    "consumers a loop closed and made again because an owned partition stalled",
    ["group", "reason"],
)
HELD = Gauge(
    "mint_consumer_held_records",
    "records read and held uncommitted until their work is done",
    ["group"],
)


class RecordCounters:
    """``mint_consumer_records_total`` of one group, each (topic, outcome) child bound once:
    the per-record cost is a dict lookup and an increment."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._children: dict[tuple[str, str], Counter] = {}

    def inc(self, topic: str, outcome: str) -> None:
        child = self._children.get((topic, outcome))
        if child is None:
            child = self._children[(topic, outcome)] = RECORDS.labels(self.group, topic, outcome)
        child.inc()

    def dead_lettered(self, topic: str, reason: str) -> None:
        self.inc(topic, "dead_lettered")
        DEAD_LETTERS.labels(self.group, topic, reason).inc()


class ConsumerGauges:
    """Lag per assigned partition and held records of one consumer, refreshed by
    :meth:`update` at most every ``every_s`` seconds (the consumer loop calls it after each poll).

    The lag comes from the high watermark the last fetch response carried and the consumer's
    position, both already known locally; a partition not fetched yet has no lag sample. A
    partition that left the assignment loses its sample. Until a first partition has a sample
    (no assignment yet, nothing fetched yet) every poll tries again."""

    def __init__(self, group: str, every_s: float = 1.0) -> None:
        self.group, self.every_s = group, every_s
        self._due = 0.0
        self._lag: dict[tuple[str, str], Gauge] = {}
        self._held = HELD.labels(group)

    def update(self, consumer: KafkaConsumer, held: Callable[[], int]) -> None:
        now = time.monotonic()
        if now < self._due:
            return
        self._held.set(held())
        seen: set[tuple[str, str]] = set()
        for tp in consumer.assignment():
            try:
                high = consumer.highwater(tp)
                if high is None:  # not fetched yet
                    continue
                position = consumer.position(tp, timeout_ms=0)
            except KafkaError:  # e.g. revoked meanwhile: no sample until it is fetched again
                continue
            if position is None:
                continue
            key = (tp.topic, str(tp.partition))
            child = self._lag.get(key)
            if child is None:
                child = self._lag[key] = LAG.labels(self.group, *key)
            child.set(max(0, high - position))
            seen.add(key)
        for key in set(self._lag) - seen:
            self._remove(key)
        if seen:  # until the first fetch of an assignment, try again at the next poll
            self._due = now + self.every_s

    def clear(self) -> None:
        """The consumer closed: it has no lag and holds nothing."""
        for key in list(self._lag):
            self._remove(key)
        self._held.set(0)

    def _remove(self, key: tuple[str, str]) -> None:
        del self._lag[key]
        with contextlib.suppress(KeyError):
            LAG.remove(self.group, *key)
