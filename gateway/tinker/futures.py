"""The Tinker API's futures: each call answers a request id at once, and the SDK polls
``/api/v1/retrieve_future`` with it until the result is there.

A :class:`FuturesTable` keeps, per request id, who asked (the tenant: another tenant's id is the
same 404 as a missing one), what kind of call it was, and its outcome once known. A poll waits up
to ``poll_s`` for a pending future (a long poll: the SDK asks again at once on ``try_again``).
Outcomes arrive on the event loop (sampling) or from the results follower's thread (training
answers on ``train.step.results``): :meth:`FuturesTable.settle_threadsafe`.

This table is one instance's and bounded: at most ``max_entries`` futures, a settled one is
kept ``keep_s``, and one nobody answers within ``answer_timeout_s`` fails with a message that
says so. What other instances must see (each future and its outcome) the API also keeps in the
shared rows (gateway.tinker.shared): ``record`` writes an outcome there, ``lookup`` finds a
future another instance took, so that its answer is recorded even when that instance is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Category = Literal["user", "server", "unknown"]  # tinker.types.RequestErrorCategory's values


@dataclass(frozen=True)
class Done:
    """A result: a JSON object, or protobuf bytes (ForwardBackwardOutput, SampleResponse)."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None


@dataclass(frozen=True)
class Failed:
    message: str
    category: Category = "user"
    queued: bool = True  # False: the command never reached the broker (a re-send may retry it)


Outcome = Done | Failed


@dataclass
class Entry:
    request_id: str
    tenant: str
    kind: str  # the call: create, forward, forward_backward, optim_step, ..., sample
    created: float
    context: dict[str, Any] = field(default_factory=dict)  # what the answer needs (model, name)
    outcome: Outcome | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    wall_created: float = field(default_factory=time.time)  # (``created`` is monotonic)


# Turns a training answer (an envelope's payload) into the future's outcome; set by the API.
Finisher = Callable[[Entry, Any], Outcome]
# Shared with the other instances (gateway.tinker.shared), set by the API; blocking calls made
# on the follower's thread: record an outcome, and find a future another instance made.
Recorder = Callable[[Entry, Outcome], None]
Lookup = Callable[[str, str], "Entry | None"]


class FuturesTable:
    def __init__(
        self,
        *,
        poll_s: float = 20.0,
        answer_timeout_s: float = 3600.0,
        keep_s: float = 3600.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.poll_s, self.answer_timeout_s, self.keep_s = poll_s, answer_timeout_s, keep_s
        self.max_entries, self.clock = max_entries, clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.finish: Finisher | None = None
        self.record: Recorder | None = None
        self.lookup: Lookup | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, request_id: str, tenant: str, kind: str, **context: Any) -> Entry:
        """A pending future (call on the event loop, before the command is published)."""
        self._loop = asyncio.get_running_loop()
        entry = Entry(request_id, tenant, kind, self.clock(), context)
        with self._lock:
            self._entries[request_id] = entry
            self._trim()
        return entry

    def _trim(self) -> None:
        now = self.clock()
        while self._entries:
            oldest = next(iter(self._entries.values()))
            stale = oldest.outcome is not None and now - oldest.created > self.keep_s
            if len(self._entries) <= self.max_entries and not stale:
                return
            self._entries.popitem(last=False)

    def get(self, request_id: str, tenant: str) -> Entry | None:
        """The caller's future, or None (missing, forgotten, or another tenant's)."""
        with self._lock:
            entry = self._entries.get(request_id)
        if entry is None or entry.tenant != tenant:
            return None
        return entry

    def settle(self, request_id: str, outcome: Outcome) -> bool:
        """Record an outcome (on the event loop); False when nobody here waits for it."""
        with self._lock:
            entry = self._entries.get(request_id)
        if entry is None or entry.outcome is not None:
            return False
        entry.outcome = outcome
        entry.settled.set()
        return True

    def answer_threadsafe(self, request_id: str, payload: Any, tenant: str | None = None) -> bool:
        """A training answer from the follower's thread: turned into an outcome by
        ``finish``, recorded for every instance (``record``) and settled here on the event
        loop. A future made on another instance (``lookup``, by the answer's ``tenant``) is
        recorded too: that instance may be gone. False when no pending future is the
        request's (unknown, or answered before)."""
        with self._lock:
            entry = self._entries.get(request_id)
        local = entry is not None and (tenant is None or entry.tenant == tenant)
        if not local:
            entry = self.lookup(tenant, request_id) if self.lookup and tenant else None
        if entry is None or entry.outcome is not None or self.finish is None:
            return False
        try:
            outcome = self.finish(entry, payload)
        except Exception as e:  # a malformed answer still ends the caller's wait
            outcome = Failed(f"the trainer's answer could not be read: {e}"[:500], "server")
        if self.record is not None:
            self.record(entry, outcome)  # (never raises: a failed write is logged)
        loop = self._loop
        if local and loop is not None:
            try:
                loop.call_soon_threadsafe(self.settle, request_id, outcome)
            except RuntimeError:  # the loop is closed: the gateway is stopping
                return False
        return True

    async def wait(self, entry: Entry) -> Outcome | None:
        """The outcome, waiting up to ``poll_s``; None: still pending (the SDK asks again).
        A future older than ``answer_timeout_s`` fails instead of waiting for ever."""
        if entry.outcome is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.settled.wait(), self.poll_s)
        if entry.outcome is None and self.clock() - entry.created > self.answer_timeout_s:
            self.settle(entry.request_id, self.timed_out(entry.kind))
        return entry.outcome

    def timed_out(self, kind: str) -> Failed:
        return Failed(
            f"no answer to this {kind} call within {self.answer_timeout_s:g} s: "
            "the trainer or engines may be down or overloaded; retry the call",
            "server",
        )
