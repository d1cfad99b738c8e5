"""API keys → callers: ``Authorization: Bearer mint_<key id>_<secret>``.

The key's catalog row is looked up by key id and kept for ``ttl_s``; after that it is read again,
so a revoked key stops working within ``ttl_s`` on every instance (each keeps its own cache, none
needs another's). The scrypt check (tens of milliseconds by design) runs once per key and row;
its verdict is remembered under a SHA-256 of the presented secret, so a warm request costs a
dictionary lookup and a hash. Unknown key ids are remembered as unknown for ``ttl_s`` too.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from catalog.apikeys import InvalidKey, parse_key, verify_secret
from catalog.models import ApiKey
from gateway.cache import MISSING, TtlCache
from gateway.errors import Unauthorized

KeyLookup = Callable[[str], ApiKey | None]
VERDICT_TTL_S = 3600.0


@dataclass(frozen=True)
class Caller:
    tenant: str
    key_id: str


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer …`` header; Unauthorized when there is none."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("No API key provided. Send 'Authorization: Bearer mint_<key id>_"
                           "<secret>' with a key from `mint keys create`.")  # fmt: skip
    return token.strip()


class Authenticator:
    def __init__(self, lookup: KeyLookup, ttl_s: float, *, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.lookup = lookup
        self._rows: TtlCache[ApiKey | None] = TtlCache(ttl_s, max_entries, clock)
        self._verdicts: TtlCache[bool] = TtlCache(VERDICT_TTL_S, max_entries, clock)
        self._slow = threading.Semaphore(2)  # scrypt is CPU and memory: at most two at once
        self.lookups = self.verifications = 0

    def authenticate(self, header: str | None, *, blocking: bool = True) -> Caller | None:
        """The caller, or Unauthorized. With ``blocking=False`` it only answers from the cache
        and returns None where it would have to read the catalog or run scrypt."""
        try:
            key_id, secret = parse_key(bearer(header))
        except InvalidKey:
            raise Unauthorized() from None
        row = self._rows.get(key_id)
        if row is MISSING:
            if not blocking:
                return None
            self.lookups += 1
            row = self._rows.put(key_id, self.lookup(key_id))
        if row is None or row.revoked:
            raise Unauthorized()
        assert isinstance(row, ApiKey)
        probe = (key_id, hashlib.sha256(secret.encode()).digest(), row.salt, row.hash)
        verdict = self._verdicts.get(probe)
        if verdict is MISSING:
            if not blocking:
                return None
            with self._slow:
                self.verifications += 1
                verdict = self._verdicts.put(probe, verify_secret(secret, row.salt, row.hash,
                                                                  row.kdf))  # fmt: skip
        if not verdict:
            raise Unauthorized()
        return Caller(row.tenant, key_id)
