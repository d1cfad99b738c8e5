"""A small thread-safe cache with a time to live and a size bound (LRU)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")
_MISSING = object()


class TtlCache(Generic[V]):
    def __init__(
        self, ttl_s: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._entries: OrderedDict[Hashable, tuple[V, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: object = _MISSING) -> V | object:
        """The fresh value, else ``default`` (a missing or expired entry)."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[1] <= self.clock():
                return default
            self._entries.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V, ttl_s: float | None = None) -> V:
        with self._lock:
            self._entries[key] = (value, self.clock() + (self.ttl_s if ttl_s is None else ttl_s))
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def pop(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


MISSING = _MISSING


class Cached(Generic[V]):
    """``load(key)`` behind a TtlCache: ``peek`` answers from memory only (MISSING when it would
    have to load), ``load`` reads through and remembers (``ttl_of(value)`` may shorten the time,
    e.g. for negative answers)."""

    def __init__(
        self,
        load: Callable[[Hashable], V],
        ttl_s: float,
        *,
        max_entries: int = 10_000,
        ttl_of: Callable[[V], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load, self._ttl_of = load, ttl_of
        self._cache: TtlCache[V] = TtlCache(ttl_s, max_entries, clock)
        self.loads = 0

    def peek(self, key: Hashable) -> V | object:
        return self._cache.get(key)

    def load(self, key: Hashable) -> V:
        self.loads += 1
        value = self._load(key)
        return self._cache.put(key, value, self._ttl_of(value) if self._ttl_of else None)
