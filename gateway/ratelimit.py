"""Per-tenant request rates: one token bucket per tenant, per gateway instance (the same buckets
count failed API key checks per key id and per client address: gateway.auth).

A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second; each request
takes one. Instances do not share buckets (nothing is kept that another instance needs), so with
N instances behind a load balancer a tenant gets up to N × its rate: configure the rate per
instance, or divide by the instance count (gateway/README.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, max_tenants: int = 100_000
    ) -> None:
        self.clock, self.max_tenants = clock, max_tenants
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._lock = threading.Lock()

    def take(self, tenant: str, rate: float, burst: int) -> float | None:
        """Take one token: None if there was one, else the seconds until there will be."""
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(tenant, (float(burst), now))
            tokens = min(float(burst), tokens + (now - at) * rate)
            if tokens >= 1.0:
                self._buckets[tenant] = (tokens - 1.0, now)
                wait = None
            else:
                self._buckets[tenant] = (tokens, now)
                wait = (1.0 - tokens) / rate
            self._buckets.move_to_end(tenant)
            while len(self._buckets) > self.max_tenants:  # a forgotten bucket starts full
                self._buckets.popitem(last=False)
        return wait

    def give_back(self, name: str, burst: int) -> None:
        """Return a token taken for work that turned out not to count (a key check that
        succeeded): the bucket is as if it had not been taken, never above ``burst``."""
        with self._lock:
            hit = self._buckets.get(name)
            if hit is not None:
                self._buckets[name] = (min(float(burst), hit[0] + 1.0), hit[1])


def retry_after(wait_s: float) -> str:
    """A Retry-After header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))
