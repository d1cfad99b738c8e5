"""The futures of the Tinker API's calls, kept in step between this instance's table
(gateway.tinker.futures: who waits, long polls) and the rows every instance shares
(gateway.tinker.shared: what another instance, or this one after a restart, must find).

A future is shared before its command is published, so any instance that hears the answer can
record it; an outcome is recorded by whichever instance hears it; a retrieve on an instance that
did not take the call reads the shared row. A call's copies (the SDK's re-sends) find the first
copy's future through its event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import structlog

from catalog.exceptions import CatalogUnavailable
from gateway.errors import ApiError, Unavailable
from gateway.tinker.futures import Entry, Failed, Finisher, FuturesTable, Outcome
from gateway.tinker.shared import FutureRecord, SharedCalls, entry_of, outcome_of, record_of

log = structlog.get_logger()
SHARED_POLL_S = 0.2  # how often a future another instance took is read while it is pending
LEASE_S = 10.0  # a sample's runner renews its lease every third of this; then others take over
T = TypeVar("T")
# Takes over a sample whose runner's lease ran out: its local entry, or None (another did).
Adopt = Callable[[str, FutureRecord], Awaitable["Entry | None"]]


def lease_end() -> datetime:
    """Now + LEASE_S, in Cassandra's millisecond precision (compare-and-set compares it)."""
    until = datetime.now(UTC) + timedelta(seconds=LEASE_S)
    return until.replace(microsecond=until.microsecond // 1000 * 1000)


class Answers:
    def __init__(
        self, futures: FuturesTable, shared: SharedCalls, finish: Finisher, retry_after_s: int
    ) -> None:
        self.futures, self.shared, self.retry_after_s = futures, shared, retry_after_s
        futures.finish, futures.record, futures.lookup = finish, self.record, self.lookup

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking read or write of the shared rows, off the event loop; an outage of the
        catalog is the caller's 503 (the SDK retries it)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except CatalogUnavailable as e:
            raise Unavailable(
                "the gateway's shared state (Cassandra) did not answer; retry shortly",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from e

    async def first_of(self, tenant: str, event_id: uuid.UUID) -> str | None:
        """The request id of an earlier copy of this call, if its future stands (pending or
        answered; not one that never reached the broker)."""
        first = await self.io(self.shared.call, tenant, event_id)
        if first is None:
            return None
        entry = self.futures.get(first, tenant)
        if entry is not None:
            return None if unqueued(entry.outcome) else first
        row = await self.io(self.shared.future, tenant, first)
        return None if row is None or unqueued(outcome_of(row)) else first

    async def open(
        self,
        request_id: str,
        tenant: str,
        kind: str,
        event_id: uuid.UUID | None = None,
        leased: bool = False,
        **context: Any,
    ) -> Entry:
        """A pending future, here and shared (before its command is published); ``leased``:
        run here under a lease (a sample), taken over by another instance if it runs out."""
        entry = self.futures.add(request_id, tenant, kind, **context)
        lease = lease_end() if leased else None
        await self.io(self.shared.add_future, tenant, record_of(entry, lease_until=lease))
        if event_id is not None:
            await self.io(self.shared.add_call, tenant, event_id, request_id)
        return entry

    async def settle(self, entry: Entry, outcome: Outcome) -> None:
        """An outcome reached on this instance's loop (a sample, a command never queued)."""
        self.futures.settle(entry.request_id, outcome)
        with contextlib.suppress(ApiError):  # the shared row stays pending: it times out
            await self.io(self.shared.settle, entry.tenant, record_of(entry, outcome))

    def record(self, entry: Entry, outcome: Outcome) -> None:
        """An outcome for every instance (on the follower's thread; the next instance to hear
        the answer records it again if this write fails)."""
        try:
            self.shared.settle(entry.tenant, record_of(entry, outcome))
        except Exception as e:
            log.warning("tinker outcome not shared", request_id=entry.request_id, error=str(e))

    def lookup(self, tenant: str, request_id: str) -> Entry | None:
        """A future of another instance (or of this one before a restart)."""
        try:
            row = self.shared.future(tenant, request_id)
        except Exception as e:
            log.warning("tinker future not read", request_id=request_id, error=str(e))
            return None
        return None if row is None else entry_of(tenant, row)

    async def renew_while_running(self, entry: Entry) -> None:
        """Renew ``entry``'s lease until cancelled (a task beside the sample it runs)."""
        while True:
            await asyncio.sleep(LEASE_S / 3)
            try:
                await self.io(self.shared.renew, entry.tenant, entry.request_id, lease_end())
            except ApiError as e:  # the next renewal may land; if none does, another takes over
                log.warning(
                    "tinker sample lease not renewed", request_id=entry.request_id, error=e.message
                )

    async def retrieve(
        self, tenant: str, request_id: str, adopt: Adopt | None = None
    ) -> Outcome | None:
        """The outcome (None: still pending): waited for here when this instance took the
        call, else read from the shared rows, which every instance that hears the answer
        writes (polled for up to the futures' ``poll_s``). A leased future whose lease ran
        out (its instance is gone) is taken over by ``adopt`` and waited for here."""
        entry = self.futures.get(request_id, tenant)
        if entry is not None:
            return await self.futures.wait(entry)
        row = await self.io(self.shared.future, tenant, request_id)
        if row is None:
            raise FutureNotFound(request_id)
        deadline = time.monotonic() + self.futures.poll_s
        while (outcome := outcome_of(row)) is None and time.monotonic() < deadline:
            lease = row.lease_until
            if adopt is not None and lease is not None and lease < datetime.now(UTC):
                adopted = await adopt(tenant, row)
                if adopted is not None:
                    return await self.futures.wait(adopted)
            await asyncio.sleep(SHARED_POLL_S)
            row = await self.io(self.shared.future, tenant, request_id) or row
        age = time.time() - row.created_at.timestamp()
        if outcome is None and age > self.futures.answer_timeout_s:
            outcome = self.futures.timed_out(row.kind)
            await self.io(self.shared.settle, tenant, record_of(entry_of(tenant, row), outcome))
        return outcome


def unqueued(outcome: Outcome | None) -> bool:
    return isinstance(outcome, Failed) and not outcome.queued


class FutureNotFound(ApiError):
    status, type, code = 404, "invalid_request_error", "future_not_found"

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"future {request_id[:200]!r} does not exist, expired, or is not yours (a future "
            "lives for two hours after its call's last news, on every gateway instance)",
            param="request_id",
        )
