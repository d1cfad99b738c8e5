"""Resolve ``tenant/policy@alias|@N|@sha256:…`` through the catalog, with a short cache.

Alias answers are cached for ``ttl_s`` (a bound on staleness if an event is missed); an
``alias.moved`` event replaces the cached answer at once, so a promotion or a rollback takes
effect on the next request without a restart. Numbered and digest references are immutable and
cached without expiry (bounded LRU).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from catalog.models import Resolved
from catalog.refs import parse_ref
from schemas.envelope import Envelope
from schemas.events import AliasMoved


class ResolutionCache:
    def __init__(
        self,
        resolve: Callable[[str], Resolved],
        *,
        ttl_s: float = 2.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve, self.ttl_s, self.max_entries, self._clock = (
            resolve,
            ttl_s,
            max_entries,
            clock,
        )
        self._entries: OrderedDict[str, tuple[Resolved, float | None]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.invalidations = 0

    def resolve(self, ref: str) -> Resolved:
        now = self._clock()
        with self._lock:
            hit = self._entries.get(ref)
            if hit is not None and (hit[1] is None or hit[1] > now):
                self.hits += 1
                self._entries.move_to_end(ref)
                return hit[0]
            self.misses += 1
        res = self._resolve(ref)  # outside the lock: a catalog read
        expires = now + self.ttl_s if parse_ref(ref).alias is not None else None
        self._put(ref, res, expires)
        return res

    def _put(self, ref: str, res: Resolved, expires: float | None) -> None:
        with self._lock:
            self._entries[ref] = (res, expires)
            self._entries.move_to_end(ref)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self, tenant: str, policy: str, alias: str) -> None:
        with self._lock:
            if self._entries.pop(f"{tenant}/{policy}@{alias}", None) is not None:
                self.invalidations += 1

    def apply(self, env: Envelope[Any]) -> Resolved | None:
        """Take an ``alias.moved`` event: the new target replaces the cached answer."""
        p = env.payload
        if not isinstance(p, AliasMoved):
            return None
        self.invalidate(env.tenant, env.policy, p.alias)
        res = Resolved(
            env.tenant, env.policy, p.to_revision, p.adapter_digest, p.store_uri, p.alias
        )
        self._put(f"{env.tenant}/{env.policy}@{p.alias}", res, self._clock() + self.ttl_s)
        return res
