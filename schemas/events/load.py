"""Cold loads: queued work that brings an adapter into an engine's working set, and its results."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import Command, Payload
from schemas.names import Digest, StoreUri

Tier = Literal["gpu", "cpu", "disk"]
ENGINE_RE = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


class LoadRequested(Command):
    """Command: cold-load a revision's adapter into an engine's working set."""

    event_type = "load.requested"
    topic = "load.requests"

    revision: int = Field(ge=1)
    adapter_digest: Digest
    store_uri: StoreUri
    base_model: str = Field(min_length=1, max_length=512)
    engine_id: str | None = Field(None, pattern=ENGINE_RE, description="None: any engine")
    priority: int = Field(0, ge=0, le=9, description="0 lowest")
    reason: str = Field("", max_length=256)


class _TierChange(Payload):
    """What a working-set change names: which engine, which revision, which tier."""

    engine_id: str = Field(pattern=ENGINE_RE)
    revision: int = Field(ge=1)
    adapter_digest: Digest
    tier: Tier = "gpu"


class AdapterLoaded(_TierChange):
    """An engine holds the adapter now (in the given tier)."""

    event_type = "load.loaded"
    topic = "load.events"

    load_ms: float = Field(ge=0.0)


class AdapterEvicted(_TierChange):
    """An engine dropped the adapter from a tier of its working set."""

    event_type = "load.evicted"
    topic = "load.events"

    reason: str = Field("", max_length=256)


class LoadFailed(Payload):
    """A cold load failed (digest mismatch, missing files, engine error)."""

    event_type = "load.failed"
    topic = "load.events"

    engine_id: str | None = Field(None, pattern=ENGINE_RE)
    revision: int = Field(ge=1)
    adapter_digest: Digest
    error: str = Field(max_length=4096)
    retryable: bool = False
