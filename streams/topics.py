"""The topic registry: one topic per lifecycle stage, all keyed by policy id (``tenant/policy``).

Names here are registry names (``export.events``); the broker name adds ``settings.topic_prefix``
(``mint.export.events``). Every topic is created through :func:`ensure_topics` before any worker
starts: the broker's auto-creation is off, and a faust worker started before its topic exists
stays unsubscribed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import structlog
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.partitioner.default import murmur2

from schemas.names import TENANT_RE
from schemas.registry import TOPIC_OF_TYPE
from schemas.settings import MintSettings
from streams.clients import make_admin
from streams.exceptions import TopicError

log = structlog.get_logger()

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    description: str
    retention_ms: int = 7 * DAY_MS  # -1: forever
    compacted: bool = False

    def configs(self) -> dict[str, str]:
        if self.compacted:
            # Latest value per key forever; tombstones kept a day so readers see deletes.
            return {"cleanup.policy": "compact", "delete.retention.ms": str(DAY_MS)}
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms)}


_SPECS = [
    TopicSpec("rollout.requests", "rollout.requested commands"),
    TopicSpec("rollout.results", "rollout.completed events (claim checks)"),
    TopicSpec("update.requests", "update.requested commands"),
    TopicSpec("update.results", "update.completed events"),
    TopicSpec("train.steps", "train.step.requested: Tinker API training calls"),
    TopicSpec("train.step.results", "train.step.completed / train.step.failed answers"),
    # The catalog is a projection of these: keep them forever so a replay rebuilds it.
    TopicSpec("export.events", "export.completed: new revisions", retention_ms=-1),
    TopicSpec("eval.requests", "eval.requested commands"),
    TopicSpec("eval.results", "eval.completed events", retention_ms=-1),
    TopicSpec(
        "serving.commands",
        "serving.promote / serving.rollback / serving.canary commands",
        retention_ms=-1,
    ),
    TopicSpec(
        "serving.events",
        "alias.moved, canary.started|ended, serving.refused, policy.retired",
        retention_ms=-1,
    ),
    TopicSpec("load.requests", "load.requested cold loads (engines consume as a group)"),
    TopicSpec("load.events", "load.loaded / load.evicted / load.failed"),
    TopicSpec("infer.requests", "infer.requested (downstream requests)", retention_ms=DAY_MS),
    TopicSpec("infer.results", "infer.completed (downstream results)", retention_ms=DAY_MS),
    # Tokens as they are generated: only a live reader wants them, the completion has them all.
    TopicSpec(
        "infer.deltas", "infer.delta: streamed text, keyed by reader", retention_ms=3_600_000
    ),
    TopicSpec("feedback", "feedback.submitted: online scores of answers (canary judging)"),
    TopicSpec("dlq", "dead letters: original bytes + mint.dlq.* headers", retention_ms=30 * DAY_MS),
    TopicSpec("policy.state", "latest alias pointers per policy (compacted)", compacted=True),
    TopicSpec(
        "policy.config",
        "policy.configured: each policy's lifecycle configuration "
        "(evaluation gate, rollback rule; compacted)",
        compacted=True,
    ),
]
TOPICS: dict[str, TopicSpec] = {s.name: s for s in _SPECS}
DLQ = "dlq"
POLICY_STATE = "policy.state"

assert set(TOPIC_OF_TYPE.values()) <= set(TOPICS), "every event type needs a registry topic"


def topic_for(settings: MintSettings, name: str) -> str:
    """Broker topic name for a registry name, with a clear error for unknown names."""
    if name not in TOPICS:
        raise TopicError(f"topic {name!r} is not in the registry; known: {', '.join(TOPICS)}")
    return settings.topic(name)


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition a keyed record lands on: kafka-python's default partitioner (murmur2), the
    one every MinT producer uses. Envelopes are keyed by policy (``Envelope.key``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def topic_for_type(settings: MintSettings, event_type: str) -> str:
    """Broker topic an event type travels on (e.g. export.completed → mint.export.events)."""
    try:
        return settings.topic(TOPIC_OF_TYPE[event_type])
    except KeyError:
        raise TopicError(f"event type {event_type!r} has no topic in the registry") from None


def ensure_topics(
    settings: MintSettings, names: list[str] | None = None, timeout_ms: int = 30_000
) -> list[str]:
    """Create the registry's topics (all, or ``names``) if missing; wait until they have leaders.

    Idempotent: existing topics are left as they are. Returns the broker names newly created.
    """
    names = names or list(TOPICS)
    unknown = [n for n in names if n not in TOPICS]
    if unknown:
        raise TopicError(f"topics {unknown} are not in the registry; known: {', '.join(TOPICS)}")
    return _create(settings, {settings.topic(n): TOPICS[n] for n in names}, timeout_ms)


# Each tenant's own copy of a results topic (workers.router fills it): one topic per tenant, so a
# Kafka ACL can let a tenant's downstream principal read its answers and no one else's.
TENANT_TOPICS = ("infer.results",)


def tenant_namespace(settings: MintSettings, tenant: str) -> str:
    """``<prefix>.tenant.<tenant>.``: the start of every topic (and consumer group) of one
    tenant. Tenant names have no dots, so no tenant's namespace starts with another's."""
    if not re.match(TENANT_RE, tenant):
        raise TopicError(f"tenant {tenant!r} is not a tenant name ({TENANT_RE})")
    return f"{settings.topic_prefix}.tenant.{tenant}."


def tenant_topic(settings: MintSettings, tenant: str, name: str = "infer.results") -> str:
    if name not in TENANT_TOPICS:
        raise TopicError(f"topic {name!r} has no per-tenant copy; those are {TENANT_TOPICS}")
    return tenant_namespace(settings, tenant) + name


def ensure_tenant_topics(
    settings: MintSettings, tenant: str, timeout_ms: int = 30_000
) -> list[str]:
    """Create ``tenant``'s topics if missing (same partitions and retention as the originals,
    so a policy's answers keep their order); returns the broker names newly created."""
    return _create(
        settings, {tenant_topic(settings, tenant, n): TOPICS[n] for n in TENANT_TOPICS}, timeout_ms
    )


def delete_topics(settings: MintSettings, timeout_ms: int = 30_000) -> list[str]:
    """Delete every topic of this deployment's prefix (tenants' copies too): a test's or a
    benchmark's own topics once it is done, so a long-lived broker does not carry thousands of
    dead partitions (each costs broker heap). Returns the names deleted."""
    admin = make_admin(settings)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(f"{settings.topic_prefix}.")]
        if mine:
            admin.delete_topics(mine, timeout_ms=timeout_ms)
        return mine
    except KafkaError as e:
        raise TopicError(f"could not delete the topics of {settings.topic_prefix!r}: {e}") from e
    finally:
        admin.close()


def _create(settings: MintSettings, specs: dict[str, TopicSpec], timeout_ms: int) -> list[str]:
    """Create the broker topics ``specs`` names that are missing; wait until they have leaders."""
    wanted = {
        name: {
            "num_partitions": settings.topic_partitions,
            "replication_factor": settings.topic_replication,
            "configs": {"min.insync.replicas": str(settings.topic_min_insync), **s.configs()},
        }
        for name, s in specs.items()
    }
    admin = make_admin(settings)
    try:
        result = admin.create_topics(wanted, timeout_ms=timeout_ms, raise_errors=False)
        created = []
        for t in result["topics"]:
            if t["error_code"] == 0:
                created.append(t["name"])
            elif t["error_code"] != TopicAlreadyExistsError.errno:
                raise TopicError(
                    f"broker refused to create topic {t['name']!r}: error {t['error_code']} "
                    f"{t.get('error_message') or ''} (check partitions={settings.topic_partitions},"
                    f" replication={settings.topic_replication} against the cluster)"
                )
        admin.wait_for_topics(list(wanted), timeout_ms=timeout_ms)
    except KafkaError as e:
        raise TopicError(f"could not create topics {sorted(wanted)}: {e}") from e
    finally:
        admin.close()
    if created:
        log.info("topics created", topics=created)
    return created
