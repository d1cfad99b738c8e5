"""Export: a trained adapter became an immutable, content-addressed revision in the store."""

from __future__ import annotations

from pydantic import Field

from schemas.envelope import Payload
from schemas.names import Digest, ModuleName, StoreUri


class ExportCompleted(Payload):
    """A trained adapter was exported as an immutable revision (the catalog registers it)."""

    event_type = "export.completed"
    topic = "export.events"

    revision: int = Field(ge=1, description="revision number, 1, 2, 3… per policy")
    adapter_digest: Digest = Field(description="sha256 of the adapter's content")
    store_uri: StoreUri = Field(description="directory of the PEFT adapter + manifest.json")
    size_bytes: int = Field(ge=0)
    rank: int = Field(ge=1, le=1024)
    lora_alpha: float | None = Field(None, gt=0)
    target_modules: list[ModuleName] = Field(default_factory=list)
    target_parameters: list[ModuleName] = Field(default_factory=list)
    base_model: str = Field(min_length=1, max_length=512, description="base model id or path")
    base_model_fingerprint: Digest = Field(
        description="sha256 over the base model's config+weights"
    )
    parent_revision: int | None = Field(None, ge=1)
