"""Resolve ``tenant/policy@alias|@N|@sha256:…`` through the catalog, with a short cache.

Alias answers are cached for ``ttl_s`` (a bound on staleness if an event is missed); an
``alias.moved`` event replaces the cached answer at once, so a promotion or a rollback takes
effect on the next request without a restart. An alias with a running canary is read from the
catalog on every request, so the canary's end takes effect on the next request everywhere. Numbered and digest references are immutable and
cached without expiry (bounded LRU).

Moves are applied in their own order, not in the order they are read: a replayed older move
(``mint replay serving.events --to-topic serving.events``, or the minute of overlap an engine
follows at start) never takes an alias back. Of two moves of one alias the higher ``seq`` (the
catalog's move counter) is the newer; moves published before ``seq`` existed compare by time.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from catalog.models import Resolved
from catalog.refs import Ref, parse_ref
from schemas.envelope import Envelope
from schemas.events import AliasMoved, CanaryEnded, CanaryStarted


class ResolutionCache:
    def __init__(
        self,
        resolve: Callable[[Ref], Resolved],
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
        self._entries: OrderedDict[Ref, tuple[Resolved, float | None]] = OrderedDict()
        # alias ref -> (seq, occurred_at) of the newest move applied (bounded like the entries)
        self._newest: OrderedDict[Ref, tuple[int | None, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.invalidations = self.stale_moves = 0

    def resolve(self, ref: Ref | str) -> Resolved:
        """The revision ``ref`` names. Workers pass the Ref built from a decoded event; text
        (an operator's or a benchmark's ``tenant/policy@target``) is parsed here, once."""
        if isinstance(ref, str):
            ref = parse_ref(ref)
        now = self._clock()
        with self._lock:
            hit = self._entries.get(ref)
            if hit is not None and (hit[1] is None or hit[1] > now):
                self.hits += 1
                self._entries.move_to_end(ref)
                return hit[0]
            self.misses += 1
        res = self._resolve(ref)  # outside the lock: a catalog read
        if res.canary is not None:
            # Not cached while a canary runs: its end is written to the catalog before it is
            # announced, so a request sent after anyone saw the decision reads it here, even
            # before this engine reads the announcement (one catalog read per such request).
            return res
        expires = now + self.ttl_s if ref.alias is not None else None
        self._put(ref, res, expires)
        return res

    def _put(self, ref: Ref, res: Resolved, expires: float | None) -> None:
        with self._lock:
            self._entries[ref] = (res, expires)
            self._entries.move_to_end(ref)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self, tenant: str, policy: str, alias: str) -> None:
        with self._lock:
            if self._entries.pop(Ref(tenant, policy, alias=alias), None) is not None:
                self.invalidations += 1

    def apply(self, env: Envelope[Any]) -> Resolved | None:
        """Take an ``alias.moved`` event: the new target replaces the cached answer, unless a
        newer move of that alias was applied already (then None, as for any other event). A
        canary's start or end drops the cached answer: the next request reads the catalog row,
        which the controller changed before it published the fact."""
        p = env.payload
        if isinstance(p, (CanaryStarted, CanaryEnded)):
            self.invalidate(env.tenant, env.policy, p.alias)
            return None
        if not isinstance(p, AliasMoved):
            return None
        key = Ref(env.tenant, env.policy, alias=p.alias)
        if not self._newer(key, p.seq, env.occurred_at):
            return None
        self.invalidate(env.tenant, env.policy, p.alias)
        res = Resolved(
            env.tenant, env.policy, p.to_revision, p.adapter_digest, p.store_uri, p.alias
        )
        self._put(key, res, self._clock() + self.ttl_s)
        return res

    def _newer(self, key: Ref, seq: int | None, at: Any) -> bool:
        """Is this move newer than the newest applied to ``key``? Records it if so."""
        with self._lock:
            last = self._newest.get(key)
            if last is not None:
                last_seq, last_at = last
                stale = (
                    seq <= last_seq if seq is not None and last_seq is not None else at <= last_at
                )
                if stale:
                    self.stale_moves += 1
                    return False
            self._newest[key] = (seq, at)
            self._newest.move_to_end(key)
            while len(self._newest) > self.max_entries:
                self._newest.popitem(last=False)
            return True


def canary_bucket(canary_id: Any, caller: str) -> float:
    """Where ``caller`` falls in [0, 1) for this canary: the same caller always falls in the
    same place (sticky), and each canary (its id is the salt) draws its callers afresh."""
    digest = hashlib.sha256(f"{canary_id}:{caller}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def route(res: Resolved, caller: str) -> Resolved:
    """The revision that answers ``caller``: the canary's for its share of callers, else the
    alias's own. The answer carries no canary (it is one revision)."""
    c = res.canary
    if c is None:
        return res
    if canary_bucket(c.canary_id, caller) < c.share:
        return Resolved(res.tenant, res.policy, c.revision, c.digest, c.store_uri, res.alias)
    return Resolved(res.tenant, res.policy, res.revision, res.digest, res.store_uri, res.alias)
