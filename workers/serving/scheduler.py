"""Cold loads as scheduled work: requests waiting for one adapter wait together, and loads run in
waves ordered by waiting demand (most waiting requests first, then the oldest).

Pure bookkeeping (no engine, no Kafka), so the policy is unit-tested on its own; the serving
worker and the sweep benchmark drive it. ``fifo=True`` is the baseline the benchmark compares
against: one request at a time in arrival order.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Group(Generic[T]):
    key: str
    first_seq: int
    items: list[T] = field(default_factory=list)


class DemandScheduler(Generic[T]):
    def __init__(self, *, fifo: bool = False) -> None:
        self.fifo = fifo
        self._groups: OrderedDict[str, Group[T]] = OrderedDict()
        self._fifo: list[tuple[str, T]] = []
        self._seq = itertools.count()

    def add(self, key: str, item: T) -> bool:
        """Queue ``item`` behind adapter ``key``; True if it is the first waiting for it."""
        if self.fifo:
            self._fifo.append((key, item))
            return sum(1 for k, _ in self._fifo if k == key) == 1
        g = self._groups.get(key)
        if g is None:
            self._groups[key] = Group(key, next(self._seq), [item])
            return True
        g.items.append(item)
        return False

    def demand(self, key: str) -> int:
        if self.fifo:
            return sum(1 for k, _ in self._fifo if k == key)
        g = self._groups.get(key)
        return len(g.items) if g else 0

    def __len__(self) -> int:
        return len(self._fifo) if self.fifo else sum(len(g.items) for g in self._groups.values())

    def keys(self) -> list[str]:
        """Adapters with waiting requests, most demanded first (FIFO: arrival order)."""
        if self.fifo:
            return list(dict.fromkeys(k for k, _ in self._fifo))
        return [
            g.key for g in sorted(self._groups.values(), key=lambda g: (-len(g.items), g.first_seq))
        ]

    def next_wave(self, max_adapters: int, max_items: int | None = None) -> list[tuple[str, T]]:
        """Take the next batch: at most ``max_adapters`` distinct adapters (the GPU slots).

        Demand mode takes every waiting request of the most demanded adapters; FIFO takes
        requests in arrival order and stops at the first one that would need one adapter more.
        """
        out: list[tuple[str, T]] = []
        if self.fifo:
            keys: set[str] = set()
            while self._fifo and (max_items is None or len(out) < max_items):
                k = self._fifo[0][0]
                if k not in keys and len(keys) == max_adapters:
                    break
                keys.add(k)
                out.append(self._fifo.pop(0))
            return out
        for key in self.keys()[:max_adapters]:
            g = self._groups[key]
            room = None if max_items is None else max_items - len(out)
            if room is not None and room <= 0:
                break
            take, g.items = (g.items, []) if room is None else (g.items[:room], g.items[room:])
            out.extend((key, it) for it in take)
            if not g.items:
                del self._groups[key]
        return out

    def restore(self, wave: list[tuple[str, T]]) -> None:
        """Put back items taken by ``next_wave`` that were not done (an outage interrupted
        their wave), ahead of what came after them: work leaves the queue only once done."""
        if self.fifo:
            self._fifo[:0] = wave
            return
        for key, item in reversed(wave):
            g = self._groups.get(key)
            if g is None:
                # Ahead of every group that waits: it was taken first.
                g = self._groups[key] = Group(key, -next(self._seq) - 1)
                self._groups.move_to_end(key, last=False)
            g.items.insert(0, item)

    def remove(self, gone: Callable[[T], bool]) -> list[T]:
        """Remove and return every waiting item for which ``gone(item)`` is true."""
        if self.fifo:
            out = [it for _, it in self._fifo if gone(it)]
            self._fifo = [(k, it) for k, it in self._fifo if not gone(it)]
            return out
        out = []
        for key, g in list(self._groups.items()):
            out += [it for it in g.items if gone(it)]
            g.items = [it for it in g.items if not gone(it)]
            if not g.items:
                del self._groups[key]
        return out

    def take(self, key: str) -> list[T]:
        """Remove and return everything waiting for ``key`` (e.g. to fail them together)."""
        if self.fifo:
            got = [it for k, it in self._fifo if k == key]
            self._fifo = [(k, it) for k, it in self._fifo if k != key]
            return got
        g = self._groups.pop(key, None)
        return g.items if g else []
