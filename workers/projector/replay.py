"""Read the catalog's event log from the start (for a rebuild), without a consumer group
(a ``streams.follower.Follower``).

Topics are read one after the other, each up to the end offsets seen when reading starts: all
exports before any alias move or evaluation result, which is a valid order because an alias can
only point at, and an evaluation only score, a revision exported earlier, and no revision is
registered while its policy is retired (so no export needs to come after a ``policy.retired``);
each policy's events stay in order within their partition (and of two results of one suite the later one wins by its
time, ``catalog/evaluations.py``).
Records that do not decode are skipped and counted (they sit on the DLQ already).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from schemas import Envelope, decode_event
from schemas.exceptions import SchemaError
from schemas.settings import MintSettings
from streams.follower import Follower
from streams.topics import topic_for

log = structlog.get_logger()


@dataclass
class LogStats:
    records: int = 0
    undecodable: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)


def read_log(
    settings: MintSettings,
    topics: tuple[str, ...] = ("export.events", "serving.events", "eval.results"),
    stats: LogStats | None = None,
    poll_timeout_ms: int = 500,
) -> Iterator[Envelope[Any]]:
    stats = stats if stats is not None else LogStats()
    with Follower(settings, client_id="catalog-rebuild") as follower:
        for name in topics:
            topic = topic_for(settings, name)
            tps = follower.partitions(topic)
            if not tps:
                log.warning("replay: topic has no partitions (missing?)", topic=topic)
                continue
            follower.assign(tps, "beginning")
            for records in follower.read_to(timeout_ms=poll_timeout_ms):  # to today's end
                for rec in records:
                    stats.records += 1
                    stats.per_topic[name] = stats.per_topic.get(name, 0) + 1
                    try:
                        env = decode_event(rec.value)
                    except SchemaError:
                        stats.undecodable += 1
                        continue
                    yield env
