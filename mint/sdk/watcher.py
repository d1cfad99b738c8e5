"""Watch result topics from "now" on and wait for the event that answers a request.

The watcher assigns every partition of the topics and seeks to their end *before* the client
publishes anything, so an answer can never slip in between (no consumer group, nothing
committed: a client is a reader). Events are kept (bounded) so that several waits can look.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from mint.sdk.exceptions import RequestFailed, WaitTimeout
from schemas import Envelope, decode_event
from schemas.events import DeadLetter
from schemas.exceptions import SchemaError
from schemas.settings import MintSettings
from streams.follower import Follower
from streams.timeline import TOPICS
from streams.topics import DLQ, topic_for

# Where answers arrive: the topics of a policy's life, rollouts, and dead letters (a request a
# worker gave up on fails its wait at once).
RESULT_TOPICS = ("rollout.results", *TOPICS, "dlq")

Predicate = Callable[[Envelope[Any]], bool]


class Watcher:
    def __init__(
        self, settings: MintSettings, topics: Iterable[str] = RESULT_TOPICS, keep: int = 50_000
    ) -> None:
        self._follower = Follower(settings, client_id="mint-sdk")
        # At the end now, before anything is published: no answer can slip in between.
        self._follower.assign(self._follower.partitions(*(topic_for(settings, n) for n in topics)))
        self._events: deque[Envelope[Any]] = deque(maxlen=keep)
        self._dlq = topic_for(settings, DLQ)
        self.dead: dict[str, DeadLetter] = {}  # event id -> why a worker gave up on it
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mint-sdk-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for records in self._follower.follow(self._stop, timeout_ms=100):
            got = []
            for r in records:
                if r.topic == self._dlq:
                    letter = DeadLetter.from_headers(r.headers or [])
                    if letter.event_id:
                        with self._cond:
                            self.dead[letter.event_id] = letter
                            self._cond.notify_all()
                    continue
                try:
                    got.append(decode_event(r.value))
                except SchemaError:
                    continue  # not ours to judge: the workers dead-letter poison records
            if got:
                with self._cond:
                    self._events.extend(got)
                    self._cond.notify_all()

    def events(self) -> list[Envelope[Any]]:
        with self._cond:
            return list(self._events)

    def wait_for(
        self, predicate: Predicate, timeout_s: float, what: str, request_id: uuid.UUID | None = None
    ) -> Envelope[Any]:
        """The first kept event matching ``predicate``; raises RequestFailed at once when the
        request ``request_id`` was dead-lettered (the worker gave up on it)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for env in self._events:
                    if predicate(env):
                        return env
                letter = self.dead.get(str(request_id)) if request_id else None
                if letter is not None:
                    raise RequestFailed(
                        f"{letter.event_type} {request_id} was dead-lettered by {letter.group} "
                        f"after {letter.attempts} attempt(s) ({letter.reason}): {letter.error}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(
                        f"no {what} within {timeout_s:.0f} s: is the worker that answers it "
                        "running (`mint worker …`), and did it refuse the request? (see its log, "
                        "`mint tail`, and the dead letters on the dlq topic)"
                    )
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._follower.close()


def caused_by(event_id: uuid.UUID, *types: str) -> Predicate:
    """Matches the events whose direct cause is ``event_id`` (of one of ``types``, if given)."""
    return lambda e: e.causation_id == event_id and (not types or e.type in types)


def correlated(correlation_id: uuid.UUID, *types: str) -> Predicate:
    """Matches the events of one chain (same correlation id), optionally of some types."""
    return lambda e: e.correlation_id == correlation_id and (not types or e.type in types)


def answering(cmd: Envelope[Any], *types: str) -> Predicate:
    """Matches the events of ``types`` that answer ``cmd``: caused by it, or further down the
    chain it started (the ``alias.moved`` that follows a ``canary.ended`` a promote caused).
    The SDK's commands start their own chain (correlation id = event id), so nothing else
    is in it."""
    own_chain = cmd.correlation_id == cmd.event_id
    return lambda e: (
        e.type in types
        and (e.causation_id == cmd.event_id or (own_chain and e.correlation_id == cmd.event_id))
    )
