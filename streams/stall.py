"""Notice an assigned partition that the consumer stopped reading, so the loop can start over.

kafka-python 3.0.x sometimes keeps a partition assigned yet never hands out its records until
the next rebalance (dpkp/kafka-python#3106, #3131). In MinT's suite it hit one worker in 2 of 3
runs: a controller that never answered a promote, a trainer that never received its update, an
engine that answered nothing for 5 minutes. Nothing in the client reports it, so the loop
watches each partition it owns from what the client already knows locally (no broker call):

- **never fetched**: no fetch response has carried the partition's high watermark for 90 s
  since it was assigned (or resumed);
- **no position**: fetched once (its high watermark is known) but its position does not
  resolve for 90 s (kept over a rebalance, its committed offset never comes back: the engine
  of a sweep benchmark sat on 100 requests that way for 5 minutes);
- **not handed out**: the high watermark is ahead of the position and the position has not
  moved for ``limit_s`` while polls went on;
- **no heartbeat** (a group member): it believes it is in its group, yet no heartbeat has been
  answered for ``silent_s`` (60 s; the session is 10 s). kafka-python 3.0.x can lose its group
  coordinator and never find it again: every poll then waits for the coordinator and fetches
  nothing, so the high watermark it knows goes stale and the partitions look caught up. Seen
  in CI: an engine of the multi-engine smoke answered nothing (its stacks: in
  ``ensure_coordinator_ready``) while the other took its partitions;
- **no coordinator** (a group member): it has known no group coordinator for ``silent_s``,
  whatever it believes of its group (the same limbo met while joining or rebalancing, where
  heartbeats pause and the rule above cannot tell). A broker away that long is waited out all
  the same: a new client cannot be made then, and the old one is kept and watched again;
- **no join** (a group member): it has been joining (or rejoining) its group for ``join_s``
  (150 s) with a coordinator known. kafka-python pauses heartbeats during a join, so a join
  that never completes is silent: the broker drops the member after the 10 s session and the
  others take its partitions, while its polls return nothing and it never rejoins. Seen in CI:
  an engine of the multi-engine test began its rejoin 0.5 s after its first assignment, never
  logged the next one, and sat out of its group for 2 minutes until the test ended. A join waits
  for every member (a peer finishing its running requests takes up to 60 s), so the limit is
  well past that; a new client during a long legitimate wait only joins the same wait again.

A condition that has lasted ``suspect_s`` (30 s: a third of ``limit_s``, past the 10 s session and
a quick rebalance) is a suspicion: the watch tells streams.health after each look, so the
process's ``/readyz`` is 503 with the group, the condition and since when, until the condition
clears or the consumer is replaced (:meth:`StallWatch.reset`), instead of ready for the 90-150 s
before the replacement.

A paused partition (an outage waited out) is not watched. ``limit_s`` (90 s) is past
kafka-python's transaction timeout (60 s): a ``read_committed`` consumer stops at an open
transaction of a producer that died, until the broker aborts it. What the loop does about a
stall (a new client, as after a restart) is in streams.group (a group member rejoins and
reads on from the committed offsets) and streams.follower (a follower goes on from the same
positions).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from streams import health
from streams.metrics import RESTARTS

log = structlog.get_logger()


@dataclass
class _Seen:
    since: float  # when the partition last made progress (or was assigned, or resumed)
    position: int | None = None


@dataclass(frozen=True)
class Stall:
    partition: (
        TopicPartition | None
    )  # None: the member itself (no_heartbeat, no_coordinator, no_join)
    # never_fetched | no_position | not_handed_out | no_heartbeat | no_coordinator | no_join
    reason: str
    for_s: float
    position: int | None
    highwater: int | None
    detail: str = ""  # the client's own state where it says more (no_join)

    def describe(self) -> str:
        if self.reason == "no_coordinator":
            return f"group member: no group coordinator known for {self.for_s:.0f} s"
        if self.reason == "no_join":
            said = f" ({self.detail})" if self.detail else ""
            return f"group member: joining its group for {self.for_s:.0f} s without an assignment{said}"
        if self.partition is None:
            return f"group member: no heartbeat answered for {self.for_s:.0f} s"
        tp = f"{self.partition.topic}[{self.partition.partition}]"
        if self.reason == "never_fetched":
            return f"{tp}: assigned {self.for_s:.0f} s ago and never fetched"
        if self.reason == "no_position":
            return f"{tp}: its position has not resolved for {self.for_s:.0f} s"
        return (
            f"{tp}: position {self.position} behind high watermark {self.highwater}, "
            f"unmoved for {self.for_s:.0f} s"
        )

    def condition(self) -> dict:
        """What ``/readyz`` shows of it (streams.health.stalled)."""
        since = datetime.fromtimestamp(time.time() - self.for_s, UTC)
        return {
            "reason": self.reason,
            "partition": None
            if self.partition is None
            else f"{self.partition.topic}[{self.partition.partition}]",
            "for_s": round(self.for_s, 1),
            "since": since.isoformat(timespec="seconds"),
            "detail": self.describe(),
        }


class StallWatch:
    """Per owned partition, when it last made progress; :meth:`check` after each poll."""

    # A gap this long between two checks is the host busy in a handler (a training step),
    # not the client stalling: that time is not counted.
    BUSY_GAP_S = 5.0

    def __init__(
        self,
        limit_s: float = 90.0,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        unresolved_s: float | None = None,
        silent_s: float = 60.0,
        join_s: float = 150.0,
        suspect_s: float = 30.0,
        reader: str | None = None,
    ) -> None:
        self.limit_s, self.every_s, self.clock = limit_s, every_s, clock
        # A condition this old is suspected (``/readyz`` 503); a rule with a shorter limit
        # suspects at its limit. ``reader``: the name /readyz shows (default: the consumer's
        # group id, else its client id, which streams.group sets to the group's name).
        self.suspect_s, self.reader = suspect_s, reader
        self._told: str | None = None  # the reader streams.health last heard a suspicion of
        # Past the 10 s session (the broker dropped the member long since) and past the 20-42 s
        # a one-node broker is away in the fault-injection runs (the client comes back itself).
        self.silent_s, self.join_s = silent_s, join_s
        self._stable_since: float | None = None
        self._joining_since: float | None = None
        self._coordinator_lost: float | None = None  # when the member last knew none
        # Never fetched, or no position: the same 90 s by default. Shorter would recover sooner
        # but would also catch slow rebalances on a loaded machine (a new client is a rebalance
        # more, and a held request's redelivery).
        self.unresolved_s = limit_s if unresolved_s is None else unresolved_s
        self._seen: dict[TopicPartition, _Seen] = {}
        self._last: float | None = None
        self._due = 0.0
        self._returned: set[TopicPartition] = set()  # since the last look

    def reset(self) -> None:
        """A new consumer (or assignment): every partition starts its clock again."""
        self._seen.clear()
        self._returned.clear()
        self._stable_since = None
        self._joining_since = None
        self._coordinator_lost = None
        self._tell(None, [])  # replaced: ready again

    def check(
        self, consumer: KafkaConsumer, returned: Iterable[TopicPartition] = ()
    ) -> list[Stall]:
        """The owned partitions that stalled, given the ones this poll returned records of.
        Looks at the client at most every ``every_s`` (a poll may take a millisecond)."""
        now = self.clock()
        if self._last is not None and now - self._last > self.BUSY_GAP_S:
            for seen in self._seen.values():
                seen.since += now - self._last
            if self._joining_since is not None:
                self._joining_since += now - self._last
        self._last = now
        self._returned.update(returned)
        if now < self._due:
            return []
        self._due = now + self.every_s
        returned, self._returned = self._returned, set()
        owned = set(consumer.assignment())
        paused = set(consumer.paused())
        for tp in set(self._seen) - owned:
            del self._seen[tp]
        for tp in paused:  # an outage waited out: nothing is expected of it
            self._seen.pop(tp, None)
        conditions: list[tuple[Stall, float]] = []  # each with the limit of its rule
        for tp in owned - paused:
            seen = self._seen.get(tp)
            if seen is None:
                self._seen[tp] = _Seen(since=now)
                continue
            high = consumer.highwater(tp)
            try:
                position = consumer.position(tp, timeout_ms=0) if high is not None else None
            except KafkaError:
                # Not resolvable now (kafka-python raises when the committed offset is not in
                # yet): the stall of #3131, a partition kept over a rebalance whose position
                # never comes back. A partition revoked meanwhile is forgotten next time.
                position = None
            moved = position is not None and position != seen.position
            caught_up = high is not None and position is not None and position >= high
            if tp in returned or moved or caught_up:
                seen.since, seen.position = now, position
                continue
            waited = now - seen.since
            if high is None:
                reason, limit = "never_fetched", self.unresolved_s
            elif position is None:
                reason, limit = "no_position", self.unresolved_s
            else:
                reason, limit = "not_handed_out", self.limit_s
            conditions.append((Stall(tp, reason, waited, position, high), limit))
        conditions += self._silent_member(consumer, now)
        suspected = [s for s, limit in conditions if s.for_s >= min(self.suspect_s, limit)]
        self._tell(consumer, suspected)
        return [s for s, limit in conditions if s.for_s >= limit]

    def _tell(self, consumer: KafkaConsumer | None, suspected: list[Stall]) -> None:
        """Tell streams.health what this watch suspects now (nothing: once, after a suspicion)."""
        if not suspected:
            if self._told is not None:
                health.stalled(self._told, id(self), [])
                self._told = None
            return
        config = getattr(consumer, "config", None) or {}  # a test's fake may have none
        reader = self.reader or config.get("group_id") or config.get("client_id") or "consumer"
        if self._told not in (None, reader):
            health.stalled(self._told, id(self), [])
        health.stalled(reader, id(self), [s.condition() for s in suspected])
        self._told = reader

    def _silent_member(self, consumer: KafkaConsumer, now: float) -> list[tuple[Stall, float]]:
        """A member that has known no coordinator, that has been joining, or that believes its
        group is stable but whose heartbeats go unanswered, however long so far, each with the
        limit of its rule (``silent_s``, ``join_s``, ``silent_s``). Reads
        kafka-python's coordinator state (no public API); a client without it is not watched
        this way. Both clocks are ``time.monotonic`` unless a test fakes them."""
        coordinator = getattr(consumer, "_coordinator", None)
        heartbeat = getattr(coordinator, "heartbeat", None)
        grouped = (getattr(consumer, "config", None) or {}).get("group_id") is not None
        if heartbeat is None or not grouped:
            return []
        # coordinator_id, not coordinator_unknown(): that one marks a disconnected coordinator
        # dead as a side effect.
        if getattr(coordinator, "coordinator_id", None) is not None:
            self._coordinator_lost = None
        elif self._coordinator_lost is None:
            self._coordinator_lost = now
        found = []
        if self._coordinator_lost is not None:
            lost = now - self._coordinator_lost
            found.append((Stall(None, "no_coordinator", lost, None, None), self.silent_s))
            if lost >= self.silent_s:
                return found
        member = self._member(consumer, coordinator, heartbeat, now)
        return found if member is None else [*found, member]

    def _member(
        self, consumer: KafkaConsumer, coordinator: object, heartbeat: object, now: float
    ) -> tuple[Stall, float] | None:
        """A member that has been joining (``join_s``) or whose heartbeats go unanswered
        (``silent_s``), however long so far."""
        if not coordinator.stable():
            self._stable_since = None  # unjoined or rebalancing: heartbeats pause meanwhile
            # A reader assigned its partitions (a follower keeping a position under a group id)
            # never joins: only a subscribed member is expected to. The lost coordinator's rule
            # has its own clock.
            if not consumer.subscription() or self._coordinator_lost is not None:
                self._joining_since = None
                return None
            if self._joining_since is None:
                self._joining_since = now
            joining = now - self._joining_since
            # The client's state only for a stall: the limit is far past a slow join.
            state = _join_state(coordinator) if joining >= self.join_s else ""
            return Stall(None, "no_join", joining, None, None, state), self.join_s
        self._joining_since = None
        if self._stable_since is None:
            self._stable_since = now
        silent = now - max(heartbeat.last_receive, self._stable_since)
        return Stall(None, "no_heartbeat", silent, None, None), self.silent_s


def _join_state(coordinator: object) -> str:
    """What kafka-python says of a join that does not end (private fields, read defensively):
    for the next look at why one hangs."""
    task = getattr(coordinator, "_join_task", None)
    parts = {
        "state": getattr(coordinator, "state", None),
        "rejoining": getattr(coordinator, "rejoining", None),
        "generation": getattr(getattr(coordinator, "_generation", None), "generation_id", None),
        "join_task": None if task is None else ("done" if task.is_done else "pending"),
    }
    return ", ".join(f"{k}={v}" for k, v in parts.items())


def report(reader: str, stalls: list[Stall]) -> None:
    """Log the stalls and count the replacement they cause (``mint_consumer_restarts_total``)."""
    log.error(
        "consumer stopped reading an owned partition; replacing it",
        reader=reader,
        stalls=[s.describe() for s in stalls],
    )
    for reason in {s.reason for s in stalls}:
        RESTARTS.labels(reader, reason).inc()


def close_quietly(consumer: KafkaConsumer) -> None:
    """Close a replaced client within 5 s; a wedged one is left to the garbage collector."""
    try:
        consumer.close(autocommit=False, timeout_ms=5_000)
    except Exception as e:
        log.warning("a replaced consumer did not close cleanly", error=f"{type(e).__name__}: {e}")
