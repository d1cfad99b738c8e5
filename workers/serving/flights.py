"""Requests running in the engine (vLLM's asynchronous engine): each is submitted alone, joins
the running batch at vLLM's next step, hands its text on as ``infer.delta`` events while it is
generated (when it named a reader: ``stream_to``) and is answered the moment vLLM finishes it.

Callbacks come from the engine's thread, everything else from the Kafka thread: one lock guards
the table of running requests. A request dropped meanwhile (its partition moved to another
engine) is aborted and not answered here; a cancelled one is aborted and answered cancelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from schemas.envelope import Envelope
from schemas.events import InferDelta
from workers.serving import metrics
from workers.serving.answers import Answers, Pending, reason, request_ref
from workers.serving.exceptions import RequestRefused
from workers.serving.generation import GenRequest


@dataclass
class Flight:
    """A request running in the engine: what its deltas and its answer need."""

    it: Pending
    engine_request_id: str
    n: int
    started: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    seq: list[int] = field(default_factory=list)  # per choice: deltas sent
    chars: list[int] = field(default_factory=list)  # per choice: characters streamed

    def __post_init__(self) -> None:
        self.seq, self.chars = [0] * self.n, [0] * self.n


class Flights:
    def __init__(
        self,
        engine: Any,  # VllmEngine (submit, abort)
        answers: Answers,
        *,
        on_answer: Callable[[Envelope[Any]], None],
        on_delta: Callable[[Envelope[Any], str], None],
    ) -> None:
        self.engine, self.answers = engine, answers
        self.on_answer, self.on_delta = on_answer, on_delta
        self._lock = threading.Lock()
        self._running: dict[UUID, Flight] = {}
        self._kept: list[Envelope[Any]] = []

    def __len__(self) -> int:
        return len(self._running)

    def start(self, it: Pending, gen: GenRequest) -> None:
        flight = Flight(it, str(it.env.event_id), it.env.payload.n)
        event_id = it.env.event_id
        with self._lock:
            self._running[event_id] = flight
            metrics.RUNNING.set(len(self._running))
        self.engine.submit(
            gen,
            flight.engine_request_id,
            on_done=lambda result, error: self._finished(event_id, result, error),
            on_delta=(
                (lambda i, text, n: self._delta(flight, i, text, n))
                if it.env.payload.stream_to
                else None
            ),
        )

    def cancel(self, event_id: UUID, own: Callable[[Pending], bool]) -> bool:
        """Abort the running request ``event_id`` if ``own`` says the cancel is its caller's;
        False when no such request runs here."""
        with self._lock:
            flight = self._running.get(event_id)
            if flight is None or not own(flight.it):
                return False
            flight.cancelled = True
        self.engine.abort(flight.engine_request_id)
        return True

    def drop(self, event_ids: set[Any]) -> list[Pending]:
        """Abort these requests, unanswered (their partitions moved away)."""
        with self._lock:
            gone = [self._running.pop(eid) for eid in event_ids if eid in self._running]
            metrics.RUNNING.set(len(self._running))
        for flight in gone:
            self.engine.abort(flight.engine_request_id)
        return [f.it for f in gone]

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing runs (True), or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while len(self._running):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def keep(self, answer: Envelope[Any]) -> None:
        with self._lock:
            self._kept.append(answer)

    def take_kept(self) -> list[Envelope[Any]]:
        """Answers kept for a caller without ``emit`` (``keep``)."""
        with self._lock:
            out, self._kept = self._kept, []
        return out

    # The engine's thread.

    def _delta(self, flight: Flight, index: int, text: str, tokens: int) -> None:
        """Text generated since the last delta of one choice: an infer.delta keyed by the
        reader the request named."""
        it = flight.it
        env = self.answers.event(
            it.env,
            InferDelta(
                request_id=it.env.payload.request_id,
                engine_id=self.answers.engine_id,
                index=index,
                seq=flight.seq[index],
                offset=flight.chars[index],
                text=text,
                tokens=tokens,
                revision=it.ref.revision,
            ),
        )
        flight.seq[index] += 1
        flight.chars[index] += len(text)
        self.on_delta(env, it.env.payload.stream_to or "")

    def _finished(self, event_id: UUID, result: Any, error: BaseException | None) -> None:
        with self._lock:
            flight = self._running.pop(event_id, None)
            metrics.RUNNING.set(len(self._running))
        if flight is None:  # dropped meanwhile
            return
        it = flight.it
        gen_ms = (time.perf_counter() - flight.started) * 1000
        metrics.GENERATE_SECONDS.observe(gen_ms / 1000)
        if flight.cancelled:
            answer = self.answers.cancelled(it.env, request_ref(it.env), it=it)
        elif isinstance(error, RequestRefused):  # vLLM's own checks when it took the request
            answer = self.answers.failed(
                it.env, request_ref(it.env), "validate", str(error), it=it, code=error.code
            )
        elif error is not None:
            answer = self.answers.failed(
                it.env, request_ref(it.env), "generate", reason(error, plain=True), it=it
            )
        else:
            answer = self.answers.completed(it, result, flight.started, gen_ms, len(self))
        self.on_answer(answer)
