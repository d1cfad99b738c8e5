"""Operator replay: read a window of a topic (times or offsets) and either re-publish it into a
target topic or re-drive a named processor through a fresh consumer group.

Windows are half-open per partition: ``start <= offset < end``. Times map to offsets with the
broker's ``offsets_for_times`` (first record at or after the time); the end defaults to the
current end (the last stable offset, so open transactions are not included).

A processor is named ``module:factory``; ``factory(settings)`` returns the handler
``(envelope, record) -> None`` it runs under ``run_consumer`` (e.g. ``workers.projector:handler``).
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from kafka import TopicPartition

from schemas.settings import MintSettings
from streams.exceptions import StreamsError, TopicError
from streams.follower import Follower, run_range
from streams.producer import EventProducer
from streams.records import ConsumerStats, Handler, RetryPolicy

REPLAY_HEADER = "mint.replay.source"


@dataclass(frozen=True)
class Window:
    topic: str
    start: dict[TopicPartition, int]
    end: dict[TopicPartition, int]

    @property
    def total(self) -> int:
        """Offsets in the window (an upper bound: transaction markers take offsets too)."""
        return sum(max(0, self.end[tp] - self.start[tp]) for tp in self.start)

    def rows(self) -> list[tuple[int, int, int]]:
        return [(tp.partition, self.start[tp], self.end[tp]) for tp in sorted(self.start)]


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def resolve_window(
    settings: MintSettings,
    topic: str,
    *,
    from_time: datetime | None = None,
    to_time: datetime | None = None,
    from_offset: int | None = None,
    to_offset: int | None = None,
    partitions: list[int] | None = None,
) -> Window:
    """The offsets of ``topic`` (a broker name) between two times or two offsets."""
    if from_time is not None and from_offset is not None:
        raise StreamsError("give --from-time or --from-offset, not both")
    if to_time is not None and to_offset is not None:
        raise StreamsError("give --to-time or --to-offset, not both")
    if from_time and to_time and to_time < from_time:
        raise StreamsError(f"--to-time {to_time.isoformat()} is before --from-time")
    with Follower(settings, client_id="mint-replay") as follower:
        known = {tp.partition for tp in follower.partitions(topic)}
        if not known:
            raise TopicError(f"topic {topic!r} does not exist (see `mint topics`)")
        chosen = sorted(known) if partitions is None else partitions
        missing = sorted(set(chosen) - known)
        if missing:
            raise TopicError(f"topic {topic!r} has no partitions {missing} (has {sorted(known)})")
        tps = [TopicPartition(topic, p) for p in chosen]
        first, last = follower.beginning_offsets(tps), follower.end_offsets(tps)
        if from_time is not None:
            start = follower.offsets_at(tps, _ms(from_time))
        else:
            start = {tp: max(first[tp], from_offset or 0) for tp in tps}
        if to_time is not None:
            end = follower.offsets_at(tps, _ms(to_time))
        else:
            end = {tp: last[tp] if to_offset is None else min(last[tp], to_offset) for tp in tps}
        return Window(topic, start, end)


def republish(
    settings: MintSettings,
    window: Window,
    target_topic: str,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Copy the window's records (key, value, headers, plus a source header) to
    ``target_topic``; returns how many the broker confirmed."""
    pending = {tp: off for tp, off in window.start.items() if off < window.end[tp]}
    sent = 0
    with (
        EventProducer(settings, client_id="mint-replay") as producer,
        Follower(settings, client_id="mint-replay") as follower,
    ):
        follower.assign(pending, pending)
        for records in follower.read_to({tp: window.end[tp] for tp in pending}):
            futures = []
            for r in records:
                source = f"{r.topic}/{r.partition}/{r.offset}".encode()
                headers = [*(r.headers or []), (REPLAY_HEADER, source)]
                futures.append(producer.send_async(target_topic, r.value, r.key, headers))
            for future in futures:
                future.get(timeout=30)
            sent += len(futures)
            if progress and futures:
                progress(len(futures))
    return sent


def load_processor(spec: str, settings: MintSettings) -> Handler:
    """``module:factory`` → the handler ``factory(settings)`` returns."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise StreamsError(
            f"processor {spec!r} must be module:factory, e.g. workers.projector:handler"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise StreamsError(f"cannot load processor {spec!r}: {e}") from e
    return factory(settings)


def redrive(
    settings: MintSettings,
    window: Window,
    processor: str,
    group_id: str | None = None,
    progress: Callable[[int], None] | None = None,
    retry: RetryPolicy | None = None,
) -> tuple[str, ConsumerStats]:
    """Run ``processor`` over the window under a fresh consumer group (or ``group_id``)."""
    handler = load_processor(processor, settings)
    group = group_id or fresh_group(processor)
    stats = run_range(
        settings, window.start, window.end, group, handler, retry=retry, progress=progress
    )
    return group, stats


def fresh_group(processor: str) -> str:
    name = processor.replace(":", ".").replace("/", ".")
    return f"replay.{name}.{uuid.uuid4().hex[:8]}"
