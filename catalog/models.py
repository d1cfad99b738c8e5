"""Runtime objects returned by the repository (plain frozen dataclasses, not wire events)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Policy:
    tenant: str
    policy: str
    base_model: str
    created_at: datetime
    created_by: str
    retired_at: datetime | None = None
    retired_by: str | None = None

    @property
    def name(self) -> str:
        return f"{self.tenant}/{self.policy}"


@dataclass(frozen=True)
class Revision:
    tenant: str
    policy: str
    revision: int
    digest: str
    store_uri: str
    base_model: str
    parent_revision: int | None
    created_at: datetime
    created_by: str
    source_event_id: uuid.UUID | None
    metadata: dict = field(default_factory=dict, compare=False)
    # True only on the call that created it (False for an idempotent repeat).
    is_new: bool = field(default=False, compare=False)

    @property
    def ref(self) -> str:
        return f"{self.tenant}/{self.policy}@{self.revision}"


@dataclass(frozen=True)
class Resolved:
    """What serving needs from a reference: which revision, its digest and where it lies."""

    tenant: str
    policy: str
    revision: int
    digest: str
    store_uri: str
    alias: str | None = None


@dataclass(frozen=True)
class Alias:
    tenant: str
    policy: str
    alias: str
    revision: int | None
    digest: str | None
    store_uri: str | None
    seq: int
    moved_at: datetime | None
    moved_by: str | None
    last_event_id: uuid.UUID | None


@dataclass(frozen=True)
class AliasMove:
    """One alias history row: from, to, who, when, why."""

    tenant: str
    policy: str
    alias: str
    seq: int
    from_revision: int | None
    to_revision: int | None
    moved_at: datetime
    moved_by: str
    reason: str
    kind: str  # "promote" | "rollback" (AliasMoved.cause) | "delete"
    event_id: uuid.UUID | None


@dataclass(frozen=True)
class TenantAccess:
    """A tenant as the gateway knows it; a None rate means the gateway's default."""

    tenant: str
    created_at: datetime | None
    created_by: str
    rate_per_s: float | None
    burst: int | None
    is_new: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class ApiKey:
    """A stored API key: its owner and the salted hash of its secret (never the secret)."""

    key_id: str
    tenant: str
    name: str
    kdf: str
    salt: bytes = field(repr=False)
    hash: bytes = field(repr=False)
    created_at: datetime | None
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None
