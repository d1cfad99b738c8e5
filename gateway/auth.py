"""API keys → callers: ``Authorization: Bearer mint_<key id>_<secret>``.

The key's catalog row is looked up by key id and kept for ``ttl_s``; after that it is read again,
so a revoked key stops working within ``ttl_s`` on every instance (each keeps its own cache, none
needs another's). The scrypt check (tens of milliseconds by design) runs once per key and row;
its verdict is remembered under a SHA-256 of the presented secret, so a warm request costs a
dictionary lookup and a hash. Unknown key ids are remembered as unknown for ``ttl_s`` too.

Guessing costs the guesser, not the gateway (nor the other tenants):

- A check that has to read the catalog or run scrypt first takes a token of its client address's
  bucket, and one of its key id's bucket before scrypt; with none left the answer is 429 with
  Retry-After, before any work. A check that succeeds gives its tokens back, so only failures
  spend the budget: a guesser gets ``burst`` scrypt runs per key id and per address, then
  ``per_s`` a second. Answers from the caches (a remembered verdict) take no token, so the
  owner of a key id under attack keeps working.
- scrypt runs on a small pool of its own (``threads``), never on the threads that catalog reads
  share; more than ``max_waiting`` checks queued for it is a 503 (shed load, do not queue).
- An unknown or revoked key id runs the same scrypt against a fixed hash, and that verdict is
  remembered like any other: known and unknown ids answer in the same time.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from catalog.apikeys import (
    DEFAULT_KDF,
    HASH_BYTES,
    SALT_BYTES,
    InvalidKey,
    parse_key,
    verify_secret,
)
from catalog.models import ApiKey
from gateway.cache import MISSING, TtlCache
from gateway.errors import RateLimited, Unauthorized, Unavailable
from gateway.ratelimit import RateLimiter, retry_after

KeyLookup = Callable[[str], ApiKey | None]
VERDICT_TTL_S = 3600.0
# What an unknown or revoked key id is checked against: the default scrypt's cost, a hash that
# no secret is known to produce.
DUMMY_SALT = bytes(SALT_BYTES)
DUMMY_HASH = bytes(HASH_BYTES)


@dataclass(frozen=True)
class Caller:
    tenant: str
    key_id: str


@dataclass(frozen=True)
class Budget:
    """Failed key checks allowed: ``burst`` at once, then ``per_s`` per second."""

    burst: int
    per_s: float


@dataclass(frozen=True)
class _Read:  # the flow needs the key's catalog row
    key_id: str


@dataclass(frozen=True)
class _Verify:  # the flow needs scrypt's verdict
    secret: str
    salt: bytes
    digest: bytes
    kdf: str


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer …`` header; Unauthorized when there is none."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "No API key provided. Send 'Authorization: Bearer mint_<key id>_"
            "<secret>' with a key from `mint keys create`."
        )
    return token.strip()


class Authenticator:
    def __init__(
        self,
        lookup: KeyLookup,
        ttl_s: float,
        *,
        per_key: Budget = Budget(10, 0.2),
        per_client: Budget = Budget(20, 1.0),
        threads: int = 2,
        max_waiting: int = 256,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lookup = lookup
        self.per_key, self.per_client = per_key, per_client
        self._rows: TtlCache[ApiKey | None] = TtlCache(ttl_s, max_entries, clock)
        self._verdicts: TtlCache[bool] = TtlCache(VERDICT_TTL_S, max_entries, clock)
        self._key_buckets = RateLimiter(clock=clock, max_tenants=max_entries)
        self._client_buckets = RateLimiter(clock=clock, max_tenants=max_entries)
        # scrypt is CPU and memory: its own few threads, so guessing never starves catalog reads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="key-check")
        self._waiting = threading.BoundedSemaphore(max_waiting)
        self.lookups = self.verifications = 0

    # ------------------------------------------------------------------ drivers of the flow

    def authenticate(
        self, header: str | None, *, blocking: bool = True, client: str | None = None
    ) -> Caller | None:
        """The caller, or Unauthorized / RateLimited. With ``blocking=False`` it only answers
        from the caches and returns None where it would have to read the catalog or run
        scrypt (no token is spent then)."""
        flow = self._flow(header, client)
        try:
            need = next(flow)
            while True:
                if not blocking:
                    return None
                if isinstance(need, _Read):
                    need = flow.send(self.lookup(need.key_id))
                else:
                    need = flow.send(self._pool.submit(self._verify, need).result())
        except StopIteration as done:
            return done.value
        finally:
            flow.close()  # an unfinished check gives its tokens back

    async def authenticate_async(self, header: str | None, client: str | None = None) -> Caller:
        """:meth:`authenticate` for the event loop: the catalog read on the default threads,
        scrypt on this authenticator's own."""
        flow = self._flow(header, client)
        loop = asyncio.get_running_loop()
        try:
            need = next(flow)
            while True:
                if isinstance(need, _Read):
                    need = flow.send(await asyncio.to_thread(self.lookup, need.key_id))
                else:
                    need = flow.send(await loop.run_in_executor(self._pool, self._verify, need))
        except StopIteration as done:
            return done.value
        finally:
            flow.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the check itself

    def _verify(self, need: _Verify) -> bool:
        return verify_secret(need.secret, need.salt, need.digest, need.kdf)

    def _flow(
        self, header: str | None, client: str | None
    ) -> Generator[_Read | _Verify, object, Caller]:
        """One check, written once for both drivers: yields what it needs (a row, a verdict)
        and is sent the answer. Tokens taken are given back unless the check failed."""
        try:
            key_id, secret = parse_key(bearer(header))
        except InvalidKey:
            raise Unauthorized() from None
        taken: list[tuple[RateLimiter, str, Budget]] = []
        failed = False
        try:
            row = self._rows.get(key_id)
            if row is MISSING:
                self._take_client(taken, client)
                self.lookups += 1
                row = self._rows.put(key_id, (yield _Read(key_id)))  # type: ignore[arg-type]
            live = row if isinstance(row, ApiKey) and not row.revoked else None
            salt, digest, kdf = (
                (live.salt, live.hash, live.kdf) if live else (DUMMY_SALT, DUMMY_HASH, DEFAULT_KDF)
            )
            probe = (key_id, hashlib.sha256(secret.encode()).digest(), salt, digest)
            verdict = self._verdicts.get(probe)
            if verdict is MISSING:
                self._take(taken, self._key_buckets, key_id, self.per_key, f"key id {key_id}")
                self._take_client(taken, client)
                if not self._waiting.acquire(blocking=False):
                    raise Unavailable(
                        "the gateway is checking too many API keys at once; retry shortly",
                        code="overloaded",
                        headers={"Retry-After": "1"},
                    )
                try:
                    self.verifications += 1
                    verdict = bool((yield _Verify(secret, salt, digest, kdf)))
                finally:
                    self._waiting.release()
                self._verdicts.put(probe, verdict)
            if live is None or not verdict:
                failed = True
                raise Unauthorized()
            return Caller(live.tenant, key_id)
        finally:
            if not failed:  # only failures spend the budget
                for limiter, name, budget in taken:
                    limiter.give_back(name, budget.burst)

    def _take_client(
        self, taken: list[tuple[RateLimiter, str, Budget]], client: str | None
    ) -> None:
        if client is not None and not any(t[0] is self._client_buckets for t in taken):
            self._take(
                taken, self._client_buckets, client, self.per_client, f"client address {client}"
            )

    def _take(
        self,
        taken: list[tuple[RateLimiter, str, Budget]],
        limiter: RateLimiter,
        name: str,
        budget: Budget,
        what: str,
    ) -> None:
        wait = limiter.take(name, budget.per_s, budget.burst)
        if wait is not None:
            raise RateLimited(
                f"too many failed API key checks for {what}: retry after {wait:.0f} s with a "
                "key from `mint keys create`",
                headers={"Retry-After": retry_after(wait)},
            )
        taken.append((limiter, name, budget))
