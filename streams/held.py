"""Offsets held uncommitted until the work they started is done (the group consumer's ``hold``).

A serving engine reads a request, queues it behind a cold load, and answers it polls later. Its
offset must stay uncommitted until the answer is published, or a crash in between loses the
request. :class:`HeldOffsets` keeps, per partition, the offsets held and the key each was held
under (the request's event id); a partition is committed only up to its oldest held offset.
"""

from __future__ import annotations

from typing import Any

from kafka import TopicPartition


class HeldOffsets:
    def __init__(self) -> None:
        self._offsets: dict[TopicPartition, dict[int, Any]] = {}  # offset -> key
        self._places: dict[Any, list[tuple[TopicPartition, int]]] = {}  # key -> where held

    def hold(self, tp: TopicPartition, offset: int, key: Any) -> None:
        self._offsets.setdefault(tp, {})[offset] = key
        self._places.setdefault(key, []).append((tp, offset))

    def release(self, key: Any) -> bool:
        """The work held under ``key`` is done; False if nothing was held under it."""
        found = self._places.pop(key, None)
        for tp, offset in found or ():
            self._offsets.get(tp, {}).pop(offset, None)
        return found is not None

    def count(self) -> int:
        return sum(len(v) for v in self._offsets.values())

    def commit_target(self, tp: TopicPartition, finished: int) -> int:
        """How far ``tp`` may be committed when ``finished`` is the offset after the last record
        handled: up to its oldest held record, if it holds any."""
        held = self._offsets.get(tp)
        return min(min(held), finished) if held else finished

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` left this consumer: what it held is the new owner's to redo."""
        for offset, key in self._offsets.pop(tp, {}).items():
            places = self._places.get(key, [])
            if (tp, offset) in places:
                places.remove((tp, offset))
            if not places:
                self._places.pop(key, None)
