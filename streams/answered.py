"""Which requests already have a published answer: a read of the results topic's recent tail.

A worker commits a request's offset only after its answer was published, so a crash (or a
rebalance) between the two redelivers a request that was answered. Before the first record of a
newly assigned partition is handled, :class:`AnswerLog` reads the matching results partition from
shortly before that record was produced and collects the ``causation_id`` of every answer there
(answers are made with ``caused_by=request``): a redelivered request whose id is in that set is
skipped, so it is answered once. Requests and answers are both keyed by policy, so with equal
partition counts partition *p* of the results holds every answer to partition *p* of the requests
(otherwise every partition is read).

Why this and not a ledger table: the results topic is where an answer becomes visible, so it is
the one place that cannot disagree with what consumers saw (an answer whose send was in flight
when the engine died is found too, if it landed).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import structlog
from kafka import TopicPartition

from schemas.settings import MintSettings
from streams.clients import make_consumer

log = structlog.get_logger()

# Clocks of producers differ, and an answer is produced after its request: start the read this
# much earlier than the first redelivered request's timestamp.
SKEW_MS = 60_000


def causation_of(value: bytes | None) -> uuid.UUID | None:
    """The ``causation_id`` of an encoded envelope, without validating the rest (our own output)."""
    try:
        cause = json.loads(value or b"null").get("causation_id")
        return uuid.UUID(cause) if cause else None
    except (ValueError, AttributeError, TypeError):
        return None


class AnswerLog:
    """The answers on one results topic (broker name ``topic``), read on demand."""

    def __init__(self, settings: MintSettings, topic: str, *, skew_ms: int = SKEW_MS) -> None:
        self.settings, self.topic, self.skew_ms = settings, topic, skew_ms
        self._consumer: Any = None
        self.reads = 0

    def _partitions(self, partition: int, request_partitions: int) -> list[TopicPartition]:
        if self._consumer is None:
            self._consumer = make_consumer(self.settings, group_id=None,
                                           client_id=f"answers-{self.topic}")  # fmt: skip
        parts = sorted(self._consumer.partitions_for_topic(self.topic) or ())
        if len(parts) == request_partitions:
            return [TopicPartition(self.topic, partition)]
        return [TopicPartition(self.topic, p) for p in parts]  # not co-partitioned: read them all

    def since(self, partition: int, request_partitions: int, timestamp_ms: int) -> set[uuid.UUID]:
        """Ids of the requests answered on the results partition(s) matching request partition
        ``partition`` (of ``request_partitions``) at or after ``timestamp_ms - skew``."""
        tps = self._partitions(partition, request_partitions)
        consumer = self._consumer
        ends = consumer.end_offsets(tps)
        starts = consumer.offsets_for_times({tp: max(0, timestamp_ms - self.skew_ms) for tp in tps})
        consumer.assign(tps)
        todo = {}
        for tp in tps:
            found = starts.get(tp)
            start = found.offset if found is not None else ends[tp]
            consumer.seek(tp, start)
            if start < ends[tp]:
                todo[tp] = ends[tp]
        answered: set[uuid.UUID] = set()
        deadline = time.monotonic() + 30
        while todo:
            if time.monotonic() > deadline:  # transient: the consumer loop waits it out
                raise TimeoutError(f"could not read {self.topic} to its end to check for answers")
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    if (cause := causation_of(r.value)) is not None:
                        answered.add(cause)
            for tp in list(todo):
                if consumer.position(tp) >= todo[tp]:
                    del todo[tp]
        self.reads += 1
        log.info("answers read for redelivery check", topic=self.topic, partition=partition,
                 answered=len(answered))  # fmt: skip
        return answered

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None
