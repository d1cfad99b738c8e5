"""Cold loads of one engine: the requests that wait for an adapter, and the loads asked for them.

Requests for one cold adapter of one owner wait together behind one ``load.requested``
(addressed to this engine). A load runs once this engine's share of the load topic delivers it;
its success releases the waiters to the serving core's ready queue (workers.serving.core), its
failure answers them (``infer.failed``, stage load) with the load's ``load.failed``. The sweep
answers waiting requests whose deadline passed and asks again for loads that did not come.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from catalog.models import Resolved
from catalog.refs import Ref
from schemas.envelope import Envelope
from schemas.events import AdapterLoaded, LoadFailed, LoadRequested
from streams.records import is_transient
from workers.serving.answers import Answers, Pending, bound, past_deadline, reason, request_ref
from workers.serving.exceptions import LoadError
from workers.serving.scheduler import DemandScheduler
from workers.serving.working_set import WorkingSet

log = structlog.get_logger()

# The one load asked with nobody waiting: the adapter an alias was just moved to.
PREFETCH = "promotion prefetch"


@dataclass
class LoadWait:
    """Requests wait for one adapter of one owner: whom to ask again, and since when."""

    ref: Resolved
    cause: Envelope[Any]  # the request that asked first (the load request's cause)
    since: float  # perf_counter: the first waiter arrived
    asked: float  # the core's clock: the latest load.requested for it


def adapter_key(ref: Resolved) -> str:
    """What requests wait on and waves are made of: an adapter as its owner uses it (two
    policies may hold the same digest; a failed load of one never fails the other's)."""
    return f"{ref.tenant}/{ref.policy}@{ref.digest}"


def load_ref(env: Envelope[LoadRequested]) -> Resolved:
    """The revision a ``load.requested`` asks for."""
    p = env.payload
    return Resolved(env.tenant, env.policy, p.revision, p.adapter_digest, p.store_uri)


class ColdLoads:
    """The requests waiting for loads (``waiting``, by adapter key) and the loads asked for
    them. Counts ``load_requests``, ``loads_skipped`` and ``loads_reissued`` in ``stats``."""

    def __init__(
        self,
        working_set: WorkingSet,
        answers: Answers,
        stats: dict[str, int],
        *,
        engine_id: str,
        base_model: str,
        load_retry_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.ws, self.answers, self.stats = working_set, answers, stats
        self.engine_id, self.base_model = engine_id, base_model
        self.load_retry_s, self.clock = load_retry_s, clock
        self.waiting: DemandScheduler[Pending] = DemandScheduler()
        self._loads: dict[str, LoadWait] = {}  # adapter_key -> the load its requests wait for
        self._last_sweep = float("-inf")

    def demand(self, env: Envelope[LoadRequested]) -> int:
        """How many requests wait for the load ``env`` asks for."""
        return self.waiting.demand(adapter_key(load_ref(env)))

    def wait(self, key: str, it: Pending, ref: Ref) -> list[Envelope[Any]]:
        """Park ``it`` behind its adapter's load; the first waiter asks for the load."""
        it.cold = True
        if not self.waiting.add(key, it):
            return []  # it waits with the others for the same adapter
        try:
            load = self.ask(it.env, it.ref, reason="cold request")
        except Exception as e:  # a resolution no event may carry (e.g. a foreign store URI)
            self.waiting.take(key)
            return [self.answers.failed(it.env, ref, "resolve", reason(e), t0=it.received)]
        self._loads[key] = LoadWait(it.ref, it.env, since=it.received, asked=self.clock())
        self.stats["load_requests"] += 1
        return [load]

    def ask(self, cause, aref: Resolved, *, reason: str, priority: int = 0) -> Envelope[Any]:
        """A ``load.requested`` for ``aref``, its priority raised by the requests waiting."""
        return self.answers.load_request(
            cause,
            aref,
            reason=reason,
            priority=priority,
            demand=self.waiting.demand(adapter_key(aref)),
        )

    def load(self, env: Envelope[LoadRequested]) -> list[Envelope[Any]] | None:
        """One load: [load.loaded] or [load.failed, its waiters' answers]; None: nothing to do.
        Raises only what is transient."""
        p, aref = env.payload, load_ref(env)
        key = adapter_key(aref)
        waiting = self.waiting.demand(key)
        if waiting == 0 and (p.engine_id not in (None, self.engine_id) or p.reason != PREFETCH):
            # Nothing here waits for it: another engine's (that engine lost the partition, and
            # its requests, redelivered here, ask again), or this engine's whose requests left
            # (a rebalance moved them; the new owner asks) or were answered. Only a promotion
            # prefetch loads with nobody waiting yet.
            self.stats["loads_skipped"] += 1
            return None
        if waiting == 0 and self.ws.ready_for(aref):
            return None  # asked twice (a redelivery, a re-issued ask)
        t0 = time.perf_counter()
        try:
            if p.base_model != self.base_model:
                raise LoadError(
                    f"load of {aref.digest} asks for base model {p.base_model!r} but engine "
                    f"{self.engine_id} serves {self.base_model!r}; route it to that model"
                )
            self.ws.ensure(aref)
        except Exception as e:
            if is_transient(e):
                raise  # the store is away: waited out, the load runs again after it
            retryable = isinstance(e, LoadError) and e.retryable
            error = reason(e)
            failed = self.answers.event(
                env,
                LoadFailed(
                    engine_id=self.engine_id,
                    revision=p.revision,
                    adapter_digest=aref.digest,
                    error=error[:4096],
                    retryable=retryable,
                ),
            )
            return [failed, *self._fail_waiting(key, error, retryable)]
        ms = (time.perf_counter() - t0) * 1000
        log.info(
            "adapter loaded",
            revision=p.revision,
            digest=aref.digest,
            load_ms=round(ms, 1),
            waiting=self.waiting.demand(key),
        )
        return [
            self.answers.event(
                env,
                AdapterLoaded(
                    engine_id=self.engine_id,
                    revision=p.revision,
                    adapter_digest=aref.digest,
                    tier="cpu",
                    load_ms=ms,
                ),
            )
        ]

    def release(self, key: str) -> list[Pending]:
        """The requests that waited for ``key``'s load, which is done (their wait measured)."""
        wait = self._loads.pop(key, None)
        since = wait.since if wait else time.perf_counter()
        released = self.waiting.take(key)
        for it in released:
            it.load_wait_ms = (time.perf_counter() - max(since, it.received)) * 1000
        return released

    def _fail_waiting(self, key: str, error: str, retryable: bool) -> list[Envelope[Any]]:
        self._loads.pop(key, None)
        return [
            self.answers.failed(
                it.env, request_ref(it.env), "load", error, it=it, retryable=retryable
            )
            for it in self.waiting.take(key)
        ]

    def sweep(self) -> list[Envelope[Any]]:
        """At most once a second: answer waiting requests whose deadline passed (stage
        expired), and ask again for loads that have not come after ``load_retry_s`` (a lost or
        skipped load.requested must not strand its waiters)."""
        now = self.clock()
        if now - self._last_sweep < 1.0:
            return []
        self._last_sweep = now
        out = [
            self.answers.expired(it.env, request_ref(it.env), it=it)
            for it in self.waiting.remove(lambda it: past_deadline(it.env))
        ]
        for key, wait in list(self._loads.items()):
            if self.waiting.demand(key) == 0:
                del self._loads[key]
            elif now - wait.asked >= self.load_retry_s:
                waited = now - wait.asked
                wait.asked = now
                self.stats["loads_reissued"] += 1
                with bound(wait.cause):
                    log.warning(
                        "load not done in time; asked again",
                        digest=wait.ref.digest,
                        waited_s=round(waited, 1),
                        waiting=self.waiting.demand(key),
                    )
                out.append(
                    self.ask(wait.cause, wait.ref, reason=f"asked again after {waited:.0f} s")
                )
        return out

    def drop(self, gone: Callable[[Pending], bool]) -> list[Pending]:
        """Forget the waiting requests ``gone`` picks, and the loads nothing waits for now."""
        dropped = self.waiting.remove(gone)
        for key in [k for k in self._loads if self.waiting.demand(k) == 0]:
            del self._loads[key]
        return dropped
