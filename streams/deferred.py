"""Work answered after its poll: the delivery policy a host passes to the group consumer.

A plain worker finishes each record inside its handler and the loop commits the poll. A host
that batches or waits (the serving engine queues a request behind a cold load and generates for
the whole poll at once; the evaluator's lanes answer a request with a whole suite) needs more,
and it all travels in one :class:`DeferredWork` given as ``ConsumerLoop(deferred=...)``, so the
loop has no engine modes of its own:

- ``before_commit`` runs after each poll's records were handled and before their offsets are
  committed, even for an empty poll: the host publishes there what the poll led to, so an offset
  is committed only after its results were published. Its transient failures are waited out like
  a handler's; any other failure propagates (the poll stays uncommitted).
- ``hold(record, key)`` keeps a record's offset uncommitted until ``release(key)`` (its answer
  was published), polls later: a partition is committed only up to its oldest held record
  (streams.held), so a crash redelivers every request not answered.
- ``answers={"infer.requests": "infer.results"}`` skips a redelivered request whose answer is
  already on the results topic (streams.answered).
- ``on_revoked(partitions)`` tells the host that a rebalance took partitions away for good: it
  drops their waiting work (the new owner reads it again from the committed offset).
- ``before_rebalance()`` runs when a rebalance starts, before this member rejoins: the host
  finishes and publishes the work it has running (the serving engine's requests inside vLLM),
  so that no new owner starts a request whose answer is still to come (the group waits for it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from schemas.settings import MintSettings
from streams.answered import AnsweredCheck
from streams.held import HeldOffsets


class DeferredWork:
    def __init__(
        self,
        settings: MintSettings | None = None,
        *,
        before_commit: Callable[[], None] | None = None,
        answers: dict[str, str] | None = None,
        on_revoked: Callable[[set[TopicPartition]], None] | None = None,
        before_rebalance: Callable[[], None] | None = None,
    ) -> None:
        if answers and settings is None:
            raise ValueError("an answers check needs the settings that name the results topics")
        self.before_commit = before_commit
        self._on_revoked = on_revoked
        self._before_rebalance = before_rebalance
        self._held = HeldOffsets()
        self._answers = AnsweredCheck(settings, answers) if answers and settings else None

    # What the host calls.

    def hold(self, record: ConsumerRecord, key: Any) -> None:
        """Keep ``record``'s offset uncommitted until ``release(key)``."""
        self._held.hold(TopicPartition(record.topic, record.partition), record.offset, key)

    def release(self, key: Any) -> bool:
        """The work held under ``key`` is done (its answer was published); False if nothing was
        held under it."""
        return self._held.release(key)

    def held(self) -> int:
        return self._held.count()

    # What the consumer loop calls.

    @property
    def checks_answers(self) -> bool:
        return self._answers is not None

    def answered(
        self, env: Any, record: ConsumerRecord, partitions_for: Callable[[str], set[int] | None]
    ) -> bool:
        """Is ``record`` a redelivered request whose answer was published already?"""
        return self._answers is not None and self._answers.answered(env, record, partitions_for)

    def commit_target(self, tp: TopicPartition, finished: int) -> int:
        return self._held.commit_target(tp, finished)

    def rebalancing(self) -> None:
        """A rebalance starts (every partition announced revoked, eager protocol)."""
        if self._before_rebalance is not None:
            self._before_rebalance()

    def lost(self, tps: set[TopicPartition]) -> None:
        """A rebalance took ``tps`` away for good (the loop forgets them next)."""
        if self._on_revoked is not None and tps:
            self._on_revoked(tps)

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` left or joined this consumer: nothing held or read for it still holds."""
        self._held.forget(tp)
        if self._answers is not None:
            self._answers.forget(tp)

    def close(self) -> None:
        if self._answers is not None:
            self._answers.close()
