"""A policy's life from the event log: every event of one policy, in time order.

Every event of a policy is keyed by it (``Envelope.key``), so each topic holds them on one
partition: the timeline reads that partition of each lifecycle topic from its oldest record to
its end (what retention kept: the catalog's topics forever, requests and answers a day), keeps
the records of this policy, and names each as a step people recognise. Answers are many, so
they are counted per revision and time bucket instead of listed one by one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kafka import TopicPartition

from schemas import Envelope, decode_event
from schemas.events import (
    AliasMoved,
    CanaryCommand,
    CanaryEnded,
    CanaryStarted,
    EvalCompleted,
    EvalRequested,
    ExportCompleted,
    InferCompleted,
    InferFailed,
    PolicyRetirement,
    PromoteCommand,
    RevisionTagged,
    RollbackCommand,
    ServingRefused,
    UpdateCompleted,
)
from schemas.names import policy_id
from schemas.settings import MintSettings
from streams.follower import Follower
from streams.topics import partition_for_key

# The topics a policy's life crosses, in the order a round goes through them.
TOPICS = (
    "update.results",
    "export.events",
    "eval.requests",
    "eval.results",
    "serving.commands",
    "serving.events",
    "infer.results",
)


@dataclass(frozen=True)
class Step:
    """One thing that happened to the policy."""

    at: datetime
    kind: str  # trained, exported, evaluation asked, evaluated, promote asked, promoted, ...
    revision: int | None
    detail: str
    count: int = 1  # "served": answers in the bucket

    def row(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "revision": self.revision,
            "detail": self.detail,
            "count": self.count,
        }


@dataclass
class _Served:
    answered: int = 0
    failed: int = 0
    first: datetime | None = None
    latency_ms: list[float] = field(default_factory=list)


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))


def step_of(env: Envelope[Any]) -> Step | None:
    """The step an event is, or None for answers (counted, not listed) and other types."""
    p, at = env.payload, env.occurred_at
    if isinstance(p, UpdateCompleted):
        loss = "" if p.loss is None else f", loss {p.loss:.4g}"
        extra = f"; {_metrics(p.metrics)}" if p.metrics else ""
        return Step(at, "trained", p.parent_revision, f"{p.steps} steps{loss}{extra}")
    if isinstance(p, ExportCompleted):
        parent = f" from r{p.parent_revision}" if p.parent_revision else ""
        return Step(at, "exported", p.revision, f"{p.adapter_digest[:19]}…{parent}")
    if isinstance(p, EvalRequested):
        gate = f", promote to {p.promote_to} if it passes" if p.promote_to else ""
        return Step(at, "evaluation asked", p.revision, f"suite {p.suite}{gate}")
    if isinstance(p, EvalCompleted):
        if p.refused is not None:
            return Step(at, "evaluation refused", p.revision, f"suite {p.suite}: {p.refused}")
        verdict = "passed" if p.passed else f"failed ({', '.join(p.failures) or 'gate'})"
        return Step(
            at, "evaluated", p.revision, f"suite {p.suite} {verdict}; {_metrics(p.metrics)}"
        )
    if isinstance(p, PromoteCommand):
        return Step(at, "promote asked", p.revision, f"@{p.alias} {p.reason}".strip())
    if isinstance(p, RollbackCommand):
        target = f"r{p.to_revision}" if p.to_revision else "the previous revision"
        return Step(
            at, "rollback asked", p.to_revision, f"@{p.alias} to {target} {p.reason}".strip()
        )
    if isinstance(p, AliasMoved):
        kind = "promoted" if p.cause == "promote" else "rolled back"
        came = f"r{p.from_revision}" if p.from_revision else "new"
        return Step(
            at, kind, p.to_revision, f"@{p.alias} {came} -> r{p.to_revision} {p.reason}".strip()
        )
    if isinstance(p, ServingRefused):
        return Step(at, "refused", p.current_revision, p.reason)
    if isinstance(p, CanaryCommand):
        return Step(at, "canary asked", p.revision, f"@{p.alias} {p.share:.0%} {p.reason}".strip())
    if isinstance(p, CanaryStarted):
        return Step(
            at,
            "canaried",
            p.revision,
            f"@{p.alias} {p.share:.0%} of callers -> r{p.revision}, "
            f"the rest on r{p.incumbent_revision}",
        )
    if isinstance(p, CanaryEnded):
        kind = "canary won" if p.outcome == "promoted" else "canary ended"
        return Step(at, kind, p.revision, f"@{p.alias} {p.reason}")
    if isinstance(p, RevisionTagged):
        return Step(at, "tagged", p.revision, ", ".join(p.tags) or "no tags")
    if isinstance(p, PolicyRetirement):
        kind = "retired" if p.retired else "restored"
        return Step(at, kind, None, p.reason)
    return None


def _bucket(at: datetime, seconds: int) -> datetime:
    epoch = int(at.timestamp()) // seconds * seconds
    return datetime.fromtimestamp(epoch, UTC)


def timeline(envs: Iterable[Envelope[Any]], bucket_s: int = 60) -> list[Step]:
    """The steps of ``envs`` (one policy's events), answers counted per revision and bucket."""
    steps: list[Step] = []
    served: dict[tuple[datetime, int | None], _Served] = {}
    for env in envs:
        p = env.payload
        if isinstance(p, InferCompleted | InferFailed):
            s = served.setdefault((_bucket(env.occurred_at, bucket_s), p.revision), _Served())
            s.first = min(s.first or env.occurred_at, env.occurred_at)
            if isinstance(p, InferCompleted):
                s.answered += 1
                s.latency_ms.append(p.latency_ms)
            else:
                s.failed += 1
            continue
        if (step := step_of(env)) is not None:
            steps.append(step)
    for (_, revision), s in served.items():
        latencies = sorted(s.latency_ms)
        p50 = f", latency p50 {latencies[len(latencies) // 2]:.0f} ms" if latencies else ""
        detail = f"{s.answered} answered, {s.failed} failed{p50}"
        steps.append(Step(s.first, "served", revision, detail, s.answered + s.failed))
    return sorted(steps, key=lambda s: s.at)


def policy_events(
    settings: MintSettings, tenant: str, policy: str, topics: Iterable[str] = TOPICS
) -> Iterator[Envelope[Any]]:
    """Every readable event of ``tenant/policy`` on ``topics``, topic by topic (unordered
    across topics: :func:`timeline` sorts). Records that do not decode are skipped: the
    consumers dead-lettered them already."""
    key = policy_id(tenant, policy).encode()
    with Follower(settings, client_id="mint-timeline") as follower:
        tps = []
        for topic in topics:
            name = settings.topic(topic)
            count = len(follower.consumer.partitions_for_topic(name) or ())
            if count:
                tps.append(TopicPartition(name, partition_for_key(key, count)))
        if not tps:
            return
        follower.assign(tps, "beginning")
        for records in follower.read_to(timeout_ms=300):
            for record in records:
                if record.key != key:
                    continue
                try:
                    env = decode_event(record.value)
                except ValueError:
                    continue
                if (env.tenant, env.policy) == (tenant, policy):
                    yield env
