"""Runtime objects returned by the repository (plain frozen dataclasses, not wire events)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")


def utc(at: datetime | None = None) -> datetime:
    """A timezone-aware UTC time truncated to Cassandra's millisecond precision (as stored)."""
    at = at or datetime.now(UTC)
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def aware(at: datetime | None) -> datetime | None:
    """A time read back from Cassandra (naive UTC) as a timezone-aware one."""
    return None if at is None else at.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Policy:
    tenant: str
    policy: str
    base_model: str
    created_at: datetime
    created_by: str
    retired_at: datetime | None = None
    retired_by: str | None = None
    # True only on the call that created it (create_policy).
    is_new: bool = field(default=False, compare=False)
    null_as: ClassVar[dict[str, Any]] = {"created_by": ""}  # from_row: what a null reads as

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
    # What its training measured (TrainingFigures.figures(): steps, loss, reward…); {} if unknown.
    training: dict[str, float] = field(default_factory=dict, compare=False)
    tags: list[str] = field(default_factory=list, compare=False)  # sorted
    # True only on the call that created it (False for an idempotent repeat).
    is_new: bool = field(default=False, compare=False)
    null_as: ClassVar[dict[str, Any]] = {"created_by": ""}

    @property
    def ref(self) -> str:
        return f"{self.tenant}/{self.policy}@{self.revision}"


@dataclass(frozen=True)
class Registration:
    """One export to register as a revision: what an ``export.completed`` carries (tenant and
    policy travel beside it, already validated where they entered). ``revision`` demands that
    exact number; ``source_event_id`` makes a retry of the same export find its own registration;
    ``at`` is the event's time (None: now)."""

    digest: str
    store_uri: str
    base_model: str | None = None
    parent_revision: int | None = None
    metadata: dict = field(default_factory=dict)
    source_event_id: uuid.UUID | None = None
    revision: int | None = None
    by: str = ""
    at: datetime | None = None
    training: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluation:
    """The latest ``eval.completed`` of a revision on one suite: its metrics, the thresholds
    applied (JSON text of {metric: {min, max}}), the verdict, or why it was refused."""

    tenant: str
    policy: str
    revision: int
    suite: str
    digest: str
    metrics: dict[str, float]
    thresholds: dict
    passed: bool
    failures: list[str]
    refused: str | None
    evaluated_at: datetime
    evaluated_by: str
    event_id: uuid.UUID | None
    null_as: ClassVar[dict[str, Any]] = {"evaluated_by": "", "passed": False}


@dataclass(frozen=True)
class CanaryRoute:
    """An alias's running canary: ``share`` of its callers get ``revision``."""

    canary_id: uuid.UUID
    revision: int
    digest: str
    store_uri: str
    share: float
    incumbent_revision: int
    started_at: datetime
    started_by: str = ""


@dataclass(frozen=True)
class CanaryRecord:
    """One canary of ``canary_history``: started, and (once ended) how and why."""

    tenant: str
    policy: str
    alias: str
    canary_id: uuid.UUID
    revision: int
    incumbent: int
    share: float
    started_at: datetime
    started_by: str
    reason: str
    ended_at: datetime | None
    outcome: str | None
    end_reason: str | None
    figures: dict
    null_as: ClassVar[dict[str, Any]] = {"started_by": "", "reason": ""}


@dataclass(frozen=True)
class Resolved:
    """What serving needs from a reference: which revision, its digest and where it lies;
    for an alias with a running canary, the canary too (the engine picks per caller)."""

    tenant: str
    policy: str
    revision: int
    digest: str
    store_uri: str
    alias: str | None = None
    canary: CanaryRoute | None = None


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
    null_as: ClassVar[dict[str, Any]] = {"seq": 0}


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
    null_as: ClassVar[dict[str, Any]] = {"moved_by": "", "reason": "", "kind": "promote"}


@dataclass(frozen=True)
class TenantAccess:
    """A tenant as the gateway knows it; a None rate means the gateway's default."""

    tenant: str
    created_at: datetime | None
    created_by: str
    rate_per_s: float | None
    burst: int | None
    is_new: bool = field(default=False, compare=False)
    null_as: ClassVar[dict[str, Any]] = {"created_by": ""}


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
    null_as: ClassVar[dict[str, Any]] = {"name": "", "created_by": ""}

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


# ---------------------------------------------------------------------------- rows to models

_PLANS: dict[type, list[tuple[str, Callable[[Any], Any]]]] = {}


def _keep(v: Any) -> Any:
    return v


def _plan(cls: type) -> list[tuple[str, Callable[[Any], Any]]]:
    """How each field of ``cls`` is read from its column: times as aware UTC, JSON text as a
    dict, blobs as bytes, and a null (or empty) value as ``cls.null_as`` says."""
    null_as = cls.null_as
    plan = []
    for f in fields(cls):
        if f.name == "is_new":  # what a write answered, not a column
            continue
        ann = str(f.type)
        if "datetime" in ann:
            conv = aware
        elif ann.startswith(("dict[", "list[")):  # a CQL map or list: null when empty
            conv = dict if ann.startswith("dict") else list
            conv = _collection(conv)
        elif ann == "dict":
            conv = _json
        elif ann == "bytes":
            conv = bytes
        elif f.name in null_as:
            conv = _or(null_as[f.name])
        else:
            conv = _keep
        plan.append((f.name, conv))
    _PLANS[cls] = plan
    return plan


def _json(v: str | None) -> dict:
    return json.loads(v) if v else {}


def _collection(kind: type) -> Callable[[Any], Any]:
    return lambda v: kind(v) if v else kind()


def _or(default: Any) -> Callable[[Any], Any]:
    return lambda v: v or default


def from_row(cls: type[T], row: Any) -> T:
    """The model ``cls`` (Policy, Revision, Alias, AliasMove, Evaluation, …) of a
    Cassandra row whose columns are named as its fields: one reading of rows for every table."""
    plan = _PLANS.get(cls) or _plan(cls)
    return cls(*[conv(getattr(row, name)) for name, conv in plan])


def revision_metadata(adapter: Any) -> dict[str, Any]:
    """What a revision's ``metadata`` records of its adapter, from the stored manifest (the
    trainer) or the ``export.completed`` that carries it (the projection): the same keys from
    both, so a catalog rebuilt from the log equals the live one."""
    return {
        "size_bytes": adapter.size_bytes,
        "rank": adapter.rank,
        "lora_alpha": adapter.lora_alpha,
        "target_modules": list(adapter.target_modules),
        "target_parameters": list(adapter.target_parameters),
        "base_model_fingerprint": adapter.base_model_fingerprint,
    }
