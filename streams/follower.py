"""Group-less reading: every reader that is not a member of a consumer group (streams' third part).

A :class:`Follower` assigns partitions itself (no group, so readers never split a topic between
them, and nothing is committed unless a ``group_id`` is given to keep a replay's position), puts
each at a start (the beginning, the end, a time, or offsets), and then either reads to an end
(:meth:`Follower.read_to`: the end offsets when the read began, or given ones) or follows for
ever (:meth:`Follower.follow`, until ``stop`` is set)::

    with Follower(settings, client_id="mint-sdk") as follower:
        follower.assign(follower.partitions(topic), "end")    # positions fixed now
        publish_request()                                      # its answer cannot slip past
        for records in follower.follow(stop):                  # one poll's records at a time
            ...

Positions are resolved when :meth:`Follower.assign` returns (never lazily at the first poll),
so a reader that starts at the end sees everything published after it started. Reads are
``read_committed``: an aborted transaction's records are never seen, and an end is the last
stable offset. :func:`run_range` feeds a range of offsets through the shared per-record rules
(``streams.records``): operator re-drives (streams.replay) and an engine's bootstrap.

Who follows: the gateway's answers (gateway.replies), the SDK's watcher, ``mint tail``, the
redelivery check (streams.answered), ``mint replay``, the catalog rebuild's log read
(workers.projector.replay), an engine's alias moves (``ConsumerLoop(follow_from_ms=...)``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError

from schemas.settings import MintSettings
from streams.clients import make_consumer
from streams.exceptions import KafkaUnavailable
from streams.polling import CommitOutcome, commit_offsets, poll_records
from streams.records import (
    ConsumerStats,
    Handler,
    RecordLoop,
    RetryPolicy,
    Stopped,
)
from streams.stall import StallWatch, close_quietly, report

log = structlog.get_logger()


@dataclass(frozen=True)
class Since:
    """Start at each partition's first record at or after ``ms`` (epoch milliseconds), or at
    its end where there is none."""

    ms: int


# Where each assigned partition starts: its oldest record, its end, a time, or given offsets.
Start = Literal["beginning", "end"] | Since | dict[TopicPartition, int]


class Follower:
    """One group-less consumer: assign, start, then read to an end or follow.

    ``group_id`` (optional) only keeps a position (:meth:`commit`); partitions are never shared
    through it. Extra keyword arguments go to ``KafkaConsumer``."""

    def __init__(
        self,
        settings: MintSettings,
        *,
        client_id: str = "mint-follower",
        group_id: str | None = None,
        **options: Any,
    ) -> None:
        options = {"isolation_level": "read_committed", "client_id": client_id, **options}
        self.consumer = make_consumer(settings, group_id=group_id, **options)
        self.group_id = group_id
        self._settings, self._options = settings, options

    def renew(self) -> KafkaConsumer:
        """Replace the client with a new one at the same partitions, positions and pauses, and
        return it (streams.stall: the old one stopped reading an assigned partition). If no new
        one can be made now (the broker is away), or a position is not known, the old one stays."""
        old = self.consumer
        try:
            positions = {tp: old.position(tp, timeout_ms=0) for tp in old.assignment()}
        except KafkaError as e:
            log.warning("positions unknown; keeping the old consumer", error=str(e))
            return old
        if None in positions.values():
            return old
        paused = old.paused()
        try:
            fresh = make_consumer(self._settings, group_id=self.group_id, **self._options)
        except KafkaUnavailable as e:
            log.warning("no new consumer for now; keeping the old one", error=str(e))
            return old
        self.consumer = fresh
        self.assign(positions, positions)
        if paused:
            fresh.pause(*paused)
        close_quietly(old)
        return fresh

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # Where to read.

    def partitions(self, *topics: str) -> list[TopicPartition]:
        """Every partition of ``topics`` (broker names), in order; a missing topic has none."""
        return [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(self.consumer.partitions_for_topic(topic) or ())
        ]

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        tps = list(tps)
        return self.consumer.beginning_offsets(tps) if tps else {}

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The last stable offsets (read_committed): where a read "to the end" stops."""
        tps = list(tps)
        return self.consumer.end_offsets(tps) if tps else {}

    def offsets_at(self, tps: Iterable[TopicPartition], ms: int) -> dict[TopicPartition, int]:
        """Each partition's first offset at or after time ``ms``, or its end where none is."""
        tps = list(tps)
        if not tps:
            return {}
        found = self.consumer.offsets_for_times({tp: ms for tp in tps})
        missing = [tp for tp in tps if found.get(tp) is None]
        ends = self.end_offsets(missing)
        return {tp: found[tp].offset if found.get(tp) is not None else ends[tp] for tp in tps}

    def assign(
        self, tps: Iterable[TopicPartition], start: Start = "end"
    ) -> dict[TopicPartition, int]:
        """Read ``tps`` (only these) from ``start``; returns the positions, fixed before this
        returns. With a dict, ``tps`` are its keys' partitions to read from those offsets."""
        tps = list(tps)
        if start == "beginning":
            offsets = self.beginning_offsets(tps)
        elif start == "end":
            offsets = self.end_offsets(tps)
        elif isinstance(start, Since):
            offsets = self.offsets_at(tps, start.ms)
        else:
            offsets = {tp: start[tp] for tp in tps}
        self.consumer.assign(tps)
        if tps:
            self.consumer.resume(*tps)  # a partition assigned again keeps its paused state
        for tp, offset in offsets.items():
            self.consumer.seek(tp, offset)
        return offsets

    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to read of each assigned partition (past transaction markers too)."""
        return {tp: self.consumer.position(tp) for tp in self.consumer.assignment()}

    # Reading.

    def read_to(
        self,
        ends: dict[TopicPartition, int] | None = None,
        *,
        stop: threading.Event | None = None,
        timeout_ms: int = 500,
    ) -> Iterator[list[ConsumerRecord]]:
        """Each poll's records (every partition's in offset order) below ``ends`` (default: the
        assigned partitions' ends now), until every partition reached its end or ``stop`` is set.
        An empty poll yields an empty list, so a caller can watch its clock between polls."""
        consumer = self.consumer
        assigned = consumer.assignment()
        if ends is None:
            ends = self.end_offsets(assigned)
        ends = {tp: end for tp, end in ends.items() if tp in assigned}
        pending = {tp for tp, end in ends.items() if consumer.position(tp) < end}
        if assigned - pending:  # at their end already: fetch nothing more from them
            consumer.pause(*(assigned - pending))
        while pending and not (stop is not None and stop.is_set()):
            got = []
            for tp, records in poll_records(consumer, timeout_ms).items():
                end = ends.get(tp, 0)
                got += [r for r in records if r.offset < end]
            for tp in list(pending):
                # position() passes transaction markers too, so this ends even on a marker.
                if consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
                    consumer.pause(tp)
            yield got

    def follow(
        self,
        stop: threading.Event | None = None,
        *,
        timeout_ms: int = 200,
        retry_errors: bool = False,
        stall_limit_s: float = 90.0,
    ) -> Iterator[list[ConsumerRecord]]:
        """Each poll's records for ever (until ``stop`` is set or the caller stops iterating);
        an empty poll yields an empty list. ``retry_errors``: a failed poll is logged and tried
        again half a second later (the client reconnects by itself) instead of raised. A client
        that stops reading an assigned partition for ``stall_limit_s`` is replaced (:meth:`renew`;
        streams.stall)."""
        stop = stop or threading.Event()
        stalls = StallWatch(stall_limit_s)
        while not stop.is_set():
            try:
                batches = self.consumer.poll(timeout_ms=timeout_ms)
            except Exception as e:
                if not retry_errors:
                    raise
                log.warning("reading failed; retrying", error=f"{type(e).__name__}: {e}")
                stop.wait(0.5)
                continue
            found = stalls.check(self.consumer, batches)
            yield [r for records in batches.values() for r in records]
            if found:  # after this poll's records: the new client goes on past them
                report(self.consumer.config["client_id"], found)
                self.renew()
                stalls.reset()

    def commit(self, offsets: dict[TopicPartition, int]) -> CommitOutcome:
        """Keep the position under ``group_id`` (next offset to read per partition)."""
        if self.group_id is None:
            raise ValueError("Follower.commit needs a group_id: pass one to the constructor")
        return commit_offsets(self.consumer, offsets)

    def close(self) -> None:
        self.consumer.close(autocommit=False)


def run_range(
    settings: MintSettings,
    start: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
    group_id: str,
    handler: Handler,
    *,
    stop: threading.Event | None = None,
    retry: RetryPolicy | None = None,
    progress: Callable[[int], None] | None = None,
    commit: bool = True,
) -> ConsumerStats:
    """Feed the records ``start[tp] <= offset < end[tp]`` to ``handler`` with the same retry and
    dead-letter rules, committing progress under ``group_id`` (replay re-drives use a fresh one;
    ``commit=False``: a read that keeps no position, e.g. an engine's bootstrap)."""
    stop = stop or threading.Event()
    loop = RecordLoop(settings, group_id, handler, retry or RetryPolicy(), None, stop)
    pending = {tp: off for tp, off in start.items() if off < end.get(tp, 0)}
    follower = Follower(settings, client_id=group_id, group_id=group_id if commit else None)
    try:
        follower.assign(pending, pending)
        for records in follower.read_to({tp: end[tp] for tp in pending}, stop=stop):
            before = loop.stats.records
            done: dict[TopicPartition, int] = {}  # next offset, per partition finished
            try:
                for record in records:
                    loop.process(record)
                    done[TopicPartition(record.topic, record.partition)] = record.offset + 1
            finally:
                if commit:
                    follower.commit(done)
            if progress and loop.stats.records > before:
                progress(loop.stats.records - before)
    except Stopped:
        pass
    finally:
        follower.close()
        loop.close()
    return loop.stats
