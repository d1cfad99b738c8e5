"""Export: a trained adapter became an immutable, content-addressed revision in the store."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.envelope import Payload
from schemas.names import Digest, ModuleName, StoreUri


class TrainingFigures(BaseModel):
    """What the training that produced a revision measured. Every figure is optional: a
    producer fills only what it really knows (a step-level save knows no loss)."""

    # allow_inf_nan: a NaN loss would pass through to the catalog and every table that shows it.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    steps: int | None = Field(None, ge=0, description="optimizer steps of the update")
    tokens: int | None = Field(None, ge=0, description="completion tokens trained on")
    loss: float | None = Field(None, description="loss of the last step")
    reward: float | None = Field(
        None, description="mean reward of the rollouts trained on (RL updates)"
    )
    learning_rate: float | None = Field(None, gt=0)

    def figures(self) -> dict[str, float]:
        """The figures that are set, as the catalog stores them (name -> double)."""
        return {k: float(v) for k, v in self if v is not None}

    @classmethod
    def known(cls, **values: Any) -> TrainingFigures | None:
        """The figures among ``values`` that are not None; None when none is."""
        given = {k: v for k, v in values.items() if v is not None}
        return cls(**given) if given else None


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
    training: TrainingFigures | None = Field(
        None, description="what the training measured (absent from older producers)"
    )
