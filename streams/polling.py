"""The consumer's calls to the broker that must outlive it going away (streams' third part,
beside ``records``' per-record rules): a poll that polls nothing while the broker is away, an
offset commit tried again at the next poll, and the watch that tells a member out of its group.
"""

from __future__ import annotations

import time
from typing import Literal

import structlog
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import CommitFailedError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from streams.exceptions import OutOfGroup
from streams.records import is_transient

log = structlog.get_logger()


CommitOutcome = Literal["committed", "refused", "deferred"]


def poll_records(
    consumer: KafkaConsumer, timeout_ms: int, max_records: int | None = None
) -> dict[TopicPartition, list[ConsumerRecord]]:
    """``consumer.poll`` that outlives the broker going away: kafka-python 3.0 raises a failed
    metadata refresh (e.g. ``KafkaConnectionError`` while the broker restarts) out of ``poll``
    (the projector died that way in CI's fault-injection run). A transient error polls nothing
    and waits ``timeout_ms``; the client reconnects by itself. Anything else propagates."""
    try:
        return consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
    except Exception as e:
        if not is_transient(e):
            raise
        log.warning("poll failed for now; polling again", error=f"{type(e).__name__}: {e}")
        time.sleep(timeout_ms / 1000)
        return {}


def commit_offsets(consumer: KafkaConsumer, offsets: dict[TopicPartition, int]) -> CommitOutcome:
    """Commit ``offsets`` (next offset to read per partition).

    "committed": the broker took them. "refused": the group did not, because this member is not
    (or no longer) in its current generation, e.g. a handler outlived max_poll_interval_ms; the
    partitions' owner gets the records again. "deferred": a rebalance is under way, or the
    broker is away (killed, restarting); the next poll's commit tries again. Neither is an error
    (handlers are idempotent on event_id, answers deduped); anything else propagates."""
    if not offsets:
        return "committed"
    try:
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
        return "committed"
    except RebalanceInProgressError as e:  # this member is rejoining: no verdict on membership
        log.info("offset commit waits for the rebalance under way", error=str(e))
        return "deferred"
    except CommitFailedError as e:
        log.warning("offset commit refused by the group; records will be redelivered", error=str(e))
        return "refused"
    except Exception as e:
        if not is_transient(e):
            raise
        # An engine must outlive a broker restart, not crash on it.
        log.warning("offset commit failed for now; retried on the next poll", error=str(e))
        return "deferred"


class MembershipWatch:
    """Turns a member that the group keeps refusing into an error. A refused commit is normal
    once (a rebalance; kafka-python rejoins on the next poll), but commits refused for
    ``limit_s`` with none taken mean this process fell out of its group without rejoining (seen
    under heavy CPU load: heartbeats stopped, fetching went on). Outages ("deferred") say
    nothing about membership."""

    def __init__(
        self, group_id: str, limit_s: float = 60.0, gap_s: float = 15.0, clock=time.monotonic
    ) -> None:
        self.group_id, self.limit_s, self.gap_s, self.clock = group_id, limit_s, gap_s, clock
        self._refused_since: float | None = None
        self._last_refused = 0.0

    def rejoined(self) -> None:
        """An assignment arrived: this member is in the group again."""
        self._refused_since = None

    def note(self, outcome: CommitOutcome) -> None:
        if outcome == "committed":
            self._refused_since = None
        elif outcome == "refused":
            now = self.clock()
            # A streak is refusals one after another (a zombie commits at every poll); one that
            # comes long after the last is a new rebalance, not the same absence.
            if self._refused_since is None or now - self._last_refused > self.gap_s:
                self._refused_since = now
            self._last_refused = now
            if now - self._refused_since > self.limit_s:
                raise OutOfGroup(
                    f"group {self.group_id} has refused every offset commit of this member for "
                    f"{now - self._refused_since:.0f} s: it is out of the group without having "
                    "rejoined. Exiting, so that a restart rejoins (its requests are redelivered "
                    "from the committed offsets)"
                )
