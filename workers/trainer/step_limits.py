"""Bounds on what step-level calls (workers/trainer/steps.py) keep in memory.

- :class:`WaitingGradients`: the policies whose ``forward_backward`` gradients wait for an
  ``optim_step``. Each is pinned (eviction saves weights and optimizer, not gradients) and holds
  its partition's commit, so a client that never sends ``optim_step`` would pin memory for ever:
  a tenant pins at most ``max_pinned_per_tenant`` policies, and gradients left without a call
  for ``pinned_idle_s`` are dropped (the next ``optim_step`` is told so).
- :class:`RememberedAnswers`: answers by command event id, re-sent on redelivery, bounded per
  policy, overall, and by the logprob floats they carry (oldest dropped first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError

from catalog.exceptions import CatalogError
from schemas.events.steps import TrainStepCompleted, TrainStepFailed
from workers.trainer.exceptions import BackendError, BadBatch

log = structlog.get_logger()

Answer = TrainStepCompleted | TrainStepFailed

ANSWERS_PER_POLICY = 64  # the latest answers of one policy
ANSWERS_KEPT = 4096  # across policies
ANSWER_FLOATS_KEPT = 4_000_000  # logprob floats across policies (~32 bytes each as Python floats)


class StepRefused(Exception):
    """A call that cannot run as sent: answered failed at ``stage`` with this message."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(reason)
        self.stage = stage


def classify(e: Exception) -> tuple[str, bool]:
    """(stage, retryable) of a failed call."""
    if isinstance(e, StepRefused):
        return e.stage, False
    if isinstance(e, BadBatch | ValidationError):  # a non-finite loss, gradient or answer
        return "compute", False
    if isinstance(e, ValueError | PermissionError | BackendError):  # what was sent
        return "validate", False
    if isinstance(e, CatalogError | OSError):
        return "store", False
    return "compute", isinstance(e, RuntimeError)  # e.g. out of memory: another try may pass


@dataclass
class _Waiting:
    tenant: str
    calls: set[str] = field(default_factory=set)  # forward_backward event ids added
    last: float = 0.0  # clock of the policy's last call
    deferred: Any = None  # the consumer's DeferredWork holding their records (None: none)


class WaitingGradients:
    """Policies with gradients waiting for an ``optim_step``; thread-safe (one consumer thread
    per partition set, each under its policy's lock)."""

    def __init__(
        self, per_tenant: int, idle_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_tenant, self.idle_s, self.clock = per_tenant, idle_s, clock
        self._guard = threading.Lock()
        self._waiting: dict[str, _Waiting] = {}
        self._expired: dict[str, tuple[float, int]] = {}  # policy -> (idle s, calls) dropped
        # Holds to release, by the consumer that made them (a DeferredWork is not thread-safe).
        self._to_release: list[tuple[str, Any]] = []

    def __contains__(self, pid: str) -> bool:
        return pid in self._waiting

    def calls(self, pid: str) -> set[str]:
        w = self._waiting.get(pid)
        return set(w.calls) if w else set()

    def check_room(self, tenant: str, pid: str) -> None:
        """Refuse a forward_backward that would pin one policy more than the tenant may."""
        with self._guard:
            mine = sorted(p for p, w in self._waiting.items() if w.tenant == tenant)
        if pid in mine or len(mine) < self.per_tenant:
            return
        raise StepRefused(
            "policy",
            f"tenant {tenant!r} already has gradients waiting for an optim_step on {len(mine)} "
            f"models ({', '.join(mine[:8])}), the most one trainer holds per tenant "
            f"(max_pinned_per_tenant={self.per_tenant}); send optim_step for one of your other "
            f"models first, or wait: waiting gradients left without a call for "
            f"{self.idle_s:.0f} s are dropped",
        )

    def add(self, pid: str, tenant: str, event_id: str) -> bool:
        """Record a forward_backward's gradients; True if the policy was not waiting before
        (the caller pins it)."""
        with self._guard:
            w = self._waiting.get(pid)
            new = w is None
            if new:
                w = self._waiting[pid] = _Waiting(tenant)
            w.calls.add(event_id)
            w.last = self.clock()
            return new

    def held_in(self, pid: str, deferred: Any) -> None:
        with self._guard:
            if pid in self._waiting:
                self._waiting[pid].deferred = deferred

    def touch(self, pid: str) -> None:
        """A call on the policy: its waiting gradients are not idle."""
        with self._guard:
            if pid in self._waiting:
                self._waiting[pid].last = self.clock()

    def pop(self, pid: str, release: bool = False) -> bool:
        """The policy's gradients were used (or dropped: ``release`` queues the release of
        their held records); True if it was waiting (the caller unpins it)."""
        with self._guard:
            self._expired.pop(pid, None)
            w = self._waiting.pop(pid, None)
            if release and w is not None and w.deferred is not None:
                self._to_release.append((pid, w.deferred))
            return w is not None

    def idle(self) -> list[str]:
        """Policies whose gradients saw no call for ``idle_s``."""
        limit = self.clock() - self.idle_s
        with self._guard:
            return [p for p, w in self._waiting.items() if w.last <= limit]

    def expire(self, pid: str) -> tuple[float, int] | None:
        """Forget an idle policy's gradients (the caller zeroes them and unpins it), remember
        that for its next call, and queue the release of its held records. None if it got a
        call meanwhile (no longer idle)."""
        with self._guard:
            w = self._waiting.get(pid)
            now = self.clock()
            if w is None or now - w.last < self.idle_s:
                return None
            del self._waiting[pid]
            self._expired[pid] = (now - w.last, len(w.calls))
            if w.deferred is not None:
                self._to_release.append((pid, w.deferred))
            return self._expired[pid]

    def check_expired(self, pid: str, op: str) -> None:
        """The policy's first call since its gradients expired: an optim_step is refused, so
        the client learns they were dropped (any other call just goes on)."""
        with self._guard:
            expired = self._expired.pop(pid, None)
        if expired is not None and op == "optim_step":
            raise StepRefused(
                "policy",
                f"the gradients of {expired[1]} forward_backward call(s) waiting for this "
                f"optim_step expired after {expired[0]:.0f} s without a call "
                f"(pinned_idle_s={self.idle_s:.0f}) and were dropped; nothing was applied: "
                "send those forward_backward calls again, then optim_step",
            )

    def expire_idle(
        self, lock_of: Callable[[str], threading.Lock], drop: Callable[[str], None]
    ) -> None:
        """Expire each idle policy under its lock (``lock_of``), calling ``drop`` (zero its
        gradients, unpin it); a policy whose lock is taken has a call running: not idle.
        Never blocks on a lock, so two consumer threads cannot deadlock here."""
        for pid in self.idle():
            lock = lock_of(pid)
            if not lock.acquire(blocking=False):
                continue
            try:
                gone = self.expire(pid)
                if gone is not None:
                    drop(pid)
                    log.warning("step_gradients_expired", policy=pid, idle_s=gone[0], calls=gone[1])
            finally:
                lock.release()

    def release_due(self, deferred: Any) -> list[str]:
        """Release the held records of dropped gradients that ``deferred`` holds (called by the
        consumer that owns it), so its partitions' commits move on."""
        if deferred is None:
            return []
        with self._guard:
            mine = [(p, d) for p, d in self._to_release if d is deferred]
            self._to_release = [(p, d) for p, d in self._to_release if d is not deferred]
        for pid, _ in mine:
            deferred.release(("grads", pid))
        return [pid for pid, _ in mine]

    def forget_releases(self, pid: str) -> None:
        """A revoke: the consumer forgets the partition's held records itself."""
        with self._guard:
            self._to_release = [(p, d) for p, d in self._to_release if p != pid]


class RememberedAnswers:
    """Answers by (policy, command event id), oldest dropped first past any of the bounds."""

    def __init__(
        self,
        per_policy: int = ANSWERS_PER_POLICY,
        total: int = ANSWERS_KEPT,
        floats: int = ANSWER_FLOATS_KEPT,
    ) -> None:
        self.per_policy, self.total, self.max_floats = per_policy, total, floats
        self._guard = threading.Lock()  # eviction drops answers from the compute thread
        self._all: OrderedDict[tuple[str, str], tuple[Answer, int]] = OrderedDict()
        self._by_policy: dict[str, OrderedDict[str, None]] = {}
        self.floats = 0

    def __len__(self) -> int:
        return len(self._all)

    def get(self, pid: str, event_id: str) -> Answer | None:
        got = self._all.get((pid, event_id))
        return got[0] if got else None

    def put(self, pid: str, event_id: str, answer: Answer) -> None:
        n = sum(len(row) for row in getattr(answer, "logprobs", ()))
        with self._guard:
            self._pop((pid, event_id))
            self._all[(pid, event_id)] = (answer, n)
            self._by_policy.setdefault(pid, OrderedDict())[event_id] = None
            self.floats += n
            mine = self._by_policy[pid]
            while len(mine) > self.per_policy:
                self._pop((pid, next(iter(mine))))
            while len(self._all) > 1 and (
                len(self._all) > self.total or self.floats > self.max_floats
            ):
                self._pop(next(iter(self._all)))  # (the newest stays, whatever its size)

    def drop(self, pid: str) -> None:
        with self._guard:
            for eid in list(self._by_policy.get(pid, ())):
                self._pop((pid, eid))

    def clear(self) -> None:
        with self._guard:
            self._all.clear()
            self._by_policy.clear()
            self.floats = 0

    def _pop(self, key: tuple[str, str]) -> None:
        got = self._all.pop(key, None)
        if got is None:
            return
        self.floats -= got[1]
        mine = self._by_policy.get(key[0])
        if mine is not None:
            mine.pop(key[1], None)
            if not mine:
                del self._by_policy[key[0]]
