"""The event envelope and the payload base classes.

Every event on Kafka is one JSON object: the envelope fields below plus ``payload``. Payload
classes name their ``event_type``, ``schema_version`` and the registry ``topic`` they travel on.
Commands (requests that make something happen) reject unknown fields; plain events ignore them,
so a consumer keeps working when a producer of the same ``schema_version`` adds an optional field.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.exceptions import EventValidationError
from schemas.names import (
    EVENT_TYPE_RE,
    PolicyName,
    ProducerName,
    TenantName,
    in_namespace,
    policy_id,
)


class Payload(BaseModel):
    """Base of every event payload (facts: "export completed", "alias moved")."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_type: ClassVar[str]
    schema_version: ClassVar[int] = 1
    topic: ClassVar[str]  # registry name, e.g. "export.events" (see streams.topics)

    def store_uris(self) -> list[str]:
        """Store URIs this payload references; the envelope checks they are the policy's own."""
        return [v for k, v in self if k.endswith("_uri") and isinstance(v, str)]


class Command(Payload):
    """Base of requests that make something happen: unknown fields are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


P = TypeVar("P", bound=Payload)


class Envelope(BaseModel, Generic[P]):
    """One MinT event. ``event_id`` is the idempotency key; ``tenant/policy`` is the Kafka key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: uuid.UUID = Field(description="unique per event; consumers dedupe on it")
    type: str = Field(pattern=EVENT_TYPE_RE, description="event type, e.g. export.completed")
    schema_version: int = Field(ge=1, description="version of this type's payload contract")
    occurred_at: AwareDatetime = Field(description="when it happened (timezone required)")
    producer: ProducerName = Field(description="who wrote it, e.g. trainer/host-1")
    tenant: TenantName
    policy: PolicyName
    correlation_id: uuid.UUID = Field(description="event_id of the chain's first event")
    causation_id: uuid.UUID | None = Field(None, description="event_id of the direct cause")
    payload: P

    @model_validator(mode="after")
    def _payload_matches(self) -> Envelope[P]:
        cls = type(self.payload)
        if cls is not Payload and (self.type, self.schema_version) != (
            cls.event_type,
            cls.schema_version,
        ):
            raise ValueError(
                f"type/schema_version {self.type!r} v{self.schema_version} do not match the "
                f"payload {cls.__name__} ({cls.event_type!r} v{cls.schema_version})"
            )
        for uri in self.payload.store_uris():
            if not in_namespace(uri, self.tenant, self.policy):
                raise ValueError(
                    f"payload store URI {uri!r} lies outside the namespace of "
                    f"{self.policy_id}: its path must contain '/{self.tenant}/{self.policy}/'"
                )
        return self

    @property
    def policy_id(self) -> str:
        return policy_id(self.tenant, self.policy)

    @property
    def key(self) -> bytes:
        """Kafka key: every event of one policy lands on one partition, in order."""
        return self.policy_id.encode()


def validation_message(e: ValidationError, what: str) -> str:
    """One readable line per wrong field: where, what was given, what was expected."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(event)"
        given = err.get("input")
        shown = repr(given) if not isinstance(given, dict) else "{…}"
        lines.append(f"{loc}: {err['msg']} (got {shown[:120]})")
    return f"{what}: " + "; ".join(lines)


def make_event(
    payload: P,
    *,
    tenant: str,
    policy: str,
    producer: str,
    caused_by: Envelope[Any] | None = None,
    correlation_id: uuid.UUID | None = None,
    event_id: uuid.UUID | None = None,
    occurred_at: datetime | None = None,
) -> Envelope[P]:
    """Wrap ``payload`` in an envelope. ``caused_by`` links the chain (correlation, causation)."""
    eid = event_id or uuid.uuid4()
    if caused_by is not None:
        correlation_id = correlation_id or caused_by.correlation_id
    try:
        return Envelope[type(payload)](  # type: ignore[misc]
            event_id=eid,
            type=payload.event_type,
            schema_version=payload.schema_version,
            occurred_at=occurred_at or datetime.now(UTC),
            producer=producer,
            tenant=tenant,
            policy=policy,
            correlation_id=correlation_id or eid,
            causation_id=caused_by.event_id if caused_by is not None else None,
            payload=payload,
        )
    except ValidationError as e:
        raise EventValidationError(
            validation_message(e, f"cannot build a {payload.event_type} event")
        ) from e


def make_reply(
    payload: P,
    cause: Envelope[Any],
    *,
    producer: str,
    event_id: uuid.UUID | None = None,
    occurred_at: datetime | None = None,
) -> Envelope[P]:
    """An event that answers ``cause``: about the same policy, caused by it (one correlation)."""
    return make_event(
        payload,
        tenant=cause.tenant,
        policy=cause.policy,
        producer=producer,
        caused_by=cause,
        event_id=event_id,
        occurred_at=occurred_at,
    )
