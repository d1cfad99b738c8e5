"""Which requests already have a published answer: a read of the results topic's recent tail.

A worker commits a request's offset only after its answer was published, so a crash (or a
rebalance) between the two redelivers a request that was answered. Before the first record of a
newly assigned partition is handled, :class:`AnswerLog` reads the matching results partition from
shortly before that record was produced and collects the ``causation_id`` of every answer there
(answers are made with ``caused_by=request``): a redelivered request whose id is in that set is
skipped, so it is answered once. Requests and answers are both keyed by policy, so with equal
partition counts partition *p* of the results holds every answer to partition *p* of the requests
(otherwise every partition is read).

The read is bounded in time per call and resumable: a results tail too long to read within
``budget_s`` raises :class:`AnswersPending` (a ``TimeoutError``, so the consumer loop waits it
out, polling to keep its group membership, and calls again), and the next call for the same
partition and start continues from the offsets reached, so every call makes progress and a long
tail is read to its end across calls instead of being started again each time.

Why this and not a ledger table: the results topic is where an answer becomes visible, so it is
the one place that cannot disagree with what consumers saw (an answer whose send was in flight
when the engine died is found too, if it landed).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from schemas.settings import MintSettings
from streams.exceptions import StreamsError
from streams.follower import Follower
from streams.topics import topic_for

log = structlog.get_logger()

# Clocks of producers differ, and an answer is produced after its request: start the read this
# much earlier than the first redelivered request's timestamp.
SKEW_MS = 60_000
# How long one call reads before it hands control back to the consumer loop (which polls its
# group, honours stop, and calls again). Well under max_poll_interval_ms (300 s).
BUDGET_S = 10.0


class AnswersPending(StreamsError, TimeoutError):
    """The results tail was not read to its end within one call's budget; the next call for the
    same partition continues where this one stopped. Transient: the consumer loop retries."""


@dataclass
class _Read:
    """A read of the results tail in progress: where it started, where it is, what it found."""

    since_ms: int
    ends: dict[TopicPartition, int]  # read up to these (the ends when the read began)
    positions: dict[TopicPartition, int]  # next offset to read
    answered: set[uuid.UUID] = field(default_factory=set)
    calls: int = 0


def causation_of(value: bytes | None) -> uuid.UUID | None:
    """The ``causation_id`` of an encoded envelope, without validating the rest (our own output)."""
    try:
        cause = json.loads(value or b"null").get("causation_id")
        return uuid.UUID(cause) if cause else None
    except (ValueError, AttributeError, TypeError):
        return None


class AnswerLog:
    """The answers on one results topic (broker name ``topic``), read on demand."""

    def __init__(
        self,
        settings: MintSettings,
        topic: str,
        *,
        skew_ms: int = SKEW_MS,
        budget_s: float | None = None,
    ) -> None:
        self.settings, self.topic, self.skew_ms = settings, topic, skew_ms
        self.budget_s = BUDGET_S if budget_s is None else budget_s
        self._follower: Follower | None = None
        self._reads: dict[tuple[TopicPartition, ...], _Read] = {}  # unfinished, by partitions
        self._lock = threading.Lock()  # one consumer; a loop's key threads may ask at once
        self.reads = 0

    def _open(self) -> Follower:
        if self._follower is None:  # opened at the first check, kept for the next ones
            self._follower = Follower(self.settings, client_id=f"answers-{self.topic}")
        return self._follower

    def _partitions(self, partition: int, request_partitions: int) -> list[TopicPartition]:
        parts = self._open().partitions(self.topic)
        if len(parts) == request_partitions:
            return [TopicPartition(self.topic, partition)]
        return parts  # not co-partitioned: read them all

    def since(self, partition: int, request_partitions: int, timestamp_ms: int) -> set[uuid.UUID]:
        """Ids of the requests answered on the results partition(s) matching request partition
        ``partition`` (of ``request_partitions``) at or after ``timestamp_ms - skew``. Reads for
        at most ``budget_s``; raises AnswersPending if the tail is longer, and the next call
        with the same arguments continues from there."""
        with self._lock:
            tps = self._partitions(partition, request_partitions)
            since_ms = max(0, timestamp_ms - self.skew_ms)
            read = self._reads.get(tuple(tps))
            if read is None or read.since_ms != since_ms:  # a new read (or from another start)
                read = self._reads[tuple(tps)] = self._begin(self._open(), tps, since_ms)
            self._continue(self._open(), read)
            del self._reads[tuple(tps)]
        self.reads += 1
        log.info(
            "answers read for redelivery check",
            topic=self.topic,
            partition=partition,
            answered=len(read.answered),
            calls=read.calls,
        )
        return read.answered

    def _begin(self, follower: Follower, tps: list[TopicPartition], since_ms: int) -> _Read:
        return _Read(since_ms, follower.end_offsets(tps), follower.offsets_at(tps, since_ms))

    def _continue(self, follower: Follower, read: _Read) -> None:
        """Read from ``read.positions`` towards ``read.ends`` for at most the budget (at least
        one poll, so each call makes progress); AnswersPending if it did not get there."""
        read.calls += 1
        todo = {tp: end for tp, end in read.ends.items() if read.positions[tp] < end}
        if not todo:
            return
        follower.assign(todo, {tp: read.positions[tp] for tp in todo})
        deadline = time.monotonic() + self.budget_s
        for records in follower.read_to(todo):
            for r in records:
                if (cause := causation_of(r.value)) is not None:
                    read.answered.add(cause)
            read.positions.update(follower.positions())  # past transaction markers too
            left = sum(max(0, end - read.positions[tp]) for tp, end in todo.items())
            if left and time.monotonic() > deadline:
                raise AnswersPending(
                    f"the redelivery check has {left} records of {self.topic} left to read "
                    f"after {read.calls} call(s) of {self.budget_s:g} s; the next call goes on "
                    "from there (the consumer loop retries)"
                )

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
            self._follower = None


class AnsweredCheck:
    """A group consumer's ``answers`` (request topic -> results topic, registry names): is a
    record a redelivered request that was answered already? The results are read once per
    partition and assignment, at its first record (:meth:`forget` when the partition leaves)."""

    def __init__(self, settings: MintSettings, answers: dict[str, str]) -> None:
        self._logs = {
            topic_for(settings, req): AnswerLog(settings, topic_for(settings, res))
            for req, res in answers.items()
        }
        self._seen: dict[TopicPartition, set[uuid.UUID]] = {}

    def __bool__(self) -> bool:
        return bool(self._logs)

    def answered(
        self, env: Any, record: ConsumerRecord, partitions_for: Callable[[str], set[int] | None]
    ) -> bool:
        """``partitions_for(topic)``: the request topic's partitions (the consumer's metadata)."""
        answer_log = self._logs.get(record.topic)
        if answer_log is None:
            return False
        tp = TopicPartition(record.topic, record.partition)
        seen = self._seen.get(tp)
        if seen is None:  # the first record of this assignment: what was answered already?
            count = len(partitions_for(record.topic) or ())
            seen = self._seen[tp] = answer_log.since(record.partition, count, record.timestamp)
        return env.event_id in seen

    def forget(self, tp: TopicPartition) -> None:
        self._seen.pop(tp, None)

    def close(self) -> None:
        for answer_log in self._logs.values():
            answer_log.close()
